"""burstwatch_state_* and burstwatch_spool_* on /metrics: writes under state_dir that failed, and the spools."""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.core import Metric

from agent.exporters import View, counter_by, declared, family
from agent.models import figures as F
from agent.writers.spool import DROP_REASONS, SpoolStats


def _render(errors: dict[str, int], spools: list[SpoolStats]) -> Iterable[Metric]:
    yield counter_by(F.STATE_WRITE_ERRORS_TOTAL, errors)
    if not spools:
        return
    records = family(F.SPOOL_RECORDS)
    size = family(F.SPOOL_BYTES)
    dropped = family(F.SPOOL_DROPPED_RECORDS_TOTAL)
    replayed = family(F.SPOOL_REPLAYED_RECORDS_TOTAL)
    for s in spools:
        records.add_metric([s.name], s.records)
        size.add_metric([s.name], s.bytes)
        for reason in DROP_REASONS:
            dropped.add_metric([s.name, reason], s.dropped.get(reason, 0))
        replayed.add_metric([s.name], s.replayed)
    yield records
    yield size
    yield dropped
    yield replayed


class StateView(View):
    """Renders the write-error counts of agent/writers/statefile.py (WRITE_ERRORS) and each spool's stats;
    the spool families only when a spool is in use."""

    FAMILIES = declared(F.STATE_WRITE_ERRORS_TOTAL, F.SPOOL_RECORDS, F.SPOOL_BYTES, F.SPOOL_DROPPED_RECORDS_TOTAL,
                        F.SPOOL_REPLAYED_RECORDS_TOTAL)

    def __init__(self, errors: Callable[[], dict[str, int]], spools: Callable[[], list[SpoolStats]]) -> None:
        self._errors = errors
        self._spools = spools

    def collect(self) -> Iterable[Metric]:
        return _render(self._errors(), self._spools())
