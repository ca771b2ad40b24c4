"""Prometheus view of the probe responder: tests served, refusals and drops by reason, bytes moved."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Optional

from prometheus_client.core import Metric

from agent.exporters import View, counter_by, declared, family
from agent.models import figures as F
from agent.models.units import DIRECTIONS

if TYPE_CHECKING:
    from agent.responder.stats import ResponderSnapshot


class ResponderView(View):
    """Renders `ResponderStats.snapshot()`; takes the snapshot function so a scrape never touches sockets."""

    FAMILIES = declared(F.RESPONDER_LISTENING, F.RESPONDER_BUSY, F.RESPONDER_ALLOWED_NETWORKS,
                        F.RESPONDER_CONNECTIONS_TOTAL, F.RESPONDER_TESTS_TOTAL, F.RESPONDER_REFUSED_TOTAL,
                        F.RESPONDER_DROPPED_TOTAL, F.RESPONDER_BYTES_TOTAL,
                        F.RESPONDER_LAST_TEST_TIMESTAMP_SECONDS, F.RESPONDER_SERVED_LAST_HOUR_BYTES,
                        F.RESPONDER_HOURLY_BUDGET_BYTES, F.RESPONDER_HOURLY_BUDGET_INFO)

    def __init__(self, snapshot: Callable[[], Optional[ResponderSnapshot]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
        if snap is None:
            return
        yield family(F.RESPONDER_LISTENING, 1.0 if snap.listening else 0.0)
        yield family(F.RESPONDER_BUSY, 1.0 if snap.busy else 0.0)
        yield family(F.RESPONDER_ALLOWED_NETWORKS, float(len(snap.allowed_networks)))
        yield family(F.RESPONDER_CONNECTIONS_TOTAL, snap.connections)
        yield counter_by(F.RESPONDER_TESTS_TOTAL, snap.tests)
        yield counter_by(F.RESPONDER_REFUSED_TOTAL, snap.refused)
        yield counter_by(F.RESPONDER_DROPPED_TOTAL, snap.dropped)
        nbytes = family(F.RESPONDER_BYTES_TOTAL)
        for direction in DIRECTIONS:
            nbytes.add_metric([direction], snap.bytes.get(direction, 0))
        yield nbytes
        yield family(F.RESPONDER_LAST_TEST_TIMESTAMP_SECONDS, snap.last_test_timestamp)
        served = family(F.RESPONDER_SERVED_LAST_HOUR_BYTES)
        for direction in DIRECTIONS:
            served.add_metric([direction], snap.served_last_hour.get(direction, 0))
        yield served
        if snap.hourly_budget_bytes is not None:
            yield family(F.RESPONDER_HOURLY_BUDGET_BYTES, snap.hourly_budget_bytes)
        if snap.hourly_budget_basis is not None:
            basis = family(F.RESPONDER_HOURLY_BUDGET_INFO)
            basis.add_metric([snap.hourly_budget_basis], 1.0)
            yield basis
