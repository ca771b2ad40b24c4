"""Prometheus view of the probe responder: tests served, refusals and drops by reason, bytes moved."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.exporters import NS, View, counter_by

if TYPE_CHECKING:
    from agent.responder.stats import ResponderSnapshot


class ResponderView(View):
    """Renders `ResponderStats.snapshot()`; takes the snapshot function so a scrape never touches sockets."""

    FAMILIES = tuple((f"{NS}_responder_{name}", typ) for name, typ in (
        ("listening", "gauge"), ("busy", "gauge"), ("allowed_networks", "gauge"), ("connections", "counter"),
        ("tests", "counter"), ("refused", "counter"), ("dropped", "counter"), ("bytes", "counter"),
        ("last_test_timestamp_seconds", "gauge"), ("served_last_hour_bytes", "gauge"),
        ("hourly_budget_bytes", "gauge")))

    def __init__(self, snapshot: Callable[[], Optional[ResponderSnapshot]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
        if snap is None:
            return
        yield GaugeMetricFamily(f"{NS}_responder_listening", "1 when the responder is bound to its port and "
                                "accepting tests (0: disabled, or the port could not be bound).",
                                value=1.0 if snap.listening else 0.0)
        yield GaugeMetricFamily(f"{NS}_responder_busy", "1 while a test is running (others get \"busy\").",
                                value=1.0 if snap.busy else 0.0)
        yield GaugeMetricFamily(f"{NS}_responder_allowed_networks", "Source networks allowed to run tests.",
                                value=float(len(snap.allowed_networks)))
        yield CounterMetricFamily(f"{NS}_responder_connections", "TCP connections accepted (control and data).",
                                  value=snap.connections)
        yield counter_by(f"{NS}_responder_tests", "Tests that started (cookie and parameters accepted), by "
                         "result: completed (results exchanged) or aborted.", "result", snap.tests)
        yield counter_by(f"{NS}_responder_refused", "Tests refused, by reason: not_allowed (source outside the "
                         "allow list), busy, rate_limited (max_tests_per_hour), duration, streams, bytes (over "
                         "the caps), unsupported; and, answered as busy, credit_floor, would_cross_floor (this "
                         "host's credit under credit_floor, now or after the test), budget (hourly serving "
                         "budget).", "reason", snap.refused)
        yield counter_by(f"{NS}_responder_dropped", "Connections or tests dropped for protocol trouble, by "
                         "reason: timeout (a state took too long), garbage, closed, terminated (the client gave "
                         "up), stream_error, overload.", "reason", snap.dropped)
        nbytes = CounterMetricFamily(f"{NS}_responder_bytes", "Test payload bytes: in = received by the "
                                     "responder, out = sent by it (counts a running test as it goes).",
                                     labels=["direction"])
        for direction in ("in", "out"):
            nbytes.add_metric([direction], snap.bytes.get(direction, 0))
        yield nbytes
        yield GaugeMetricFamily(f"{NS}_responder_last_test_timestamp_seconds", "Unix time the last test ended "
                                "(0: none yet).", value=snap.last_test_timestamp)
        served = GaugeMetricFamily(f"{NS}_responder_served_last_hour_bytes", "Test payload bytes served in the "
                                   "last sliding hour (in = received, out = sent; a running test counts as it "
                                   "goes): what the hourly budget counts.", labels=["direction"])
        for direction in ("in", "out"):
            served.add_metric([direction], snap.served_last_hour.get(direction, 0))
        yield served
        if snap.hourly_budget_bytes is not None:
            yield GaugeMetricFamily(f"{NS}_responder_hourly_budget_bytes", "Most bytes served per direction in "
                                    "any sliding hour, all sources together ([responder] hourly_budget_bytes).",
                                    value=snap.hourly_budget_bytes)
