"""burstwatch_state_* and burstwatch_spool_* on /metrics: writes under state_dir that failed, and the spools."""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.exporters import NS, View
from agent.writers.spool import DROP_REASONS, SpoolStats


def _render(errors: dict[str, int], spools: list[SpoolStats], every: bool = False) -> Iterable[Metric]:
    fam = CounterMetricFamily(f"{NS}_state_write_errors", "Writes under state_dir that failed (read-only or "
                              "full filesystem, permissions), by file: a state file's name or spool/<name>. "
                              "The daemon keeps running; the first error of a file is logged.", labels=["file"])
    for name, n in sorted(errors.items()):
        fam.add_metric([name], n)
    yield fam
    if not spools and not every:
        return
    records = GaugeMetricFamily(f"{NS}_spool_records", "Records waiting in the spool on disk (CloudWatch: one "
                                "per flush; probe archive: one per object).", labels=["spool"])
    size = GaugeMetricFamily(f"{NS}_spool_bytes", "Bytes the spool holds on disk.", labels=["spool"])
    dropped = CounterMetricFamily(f"{NS}_spool_dropped_records", "Spool records given up: full (the oldest, "
                                  "to stay within the spool's bounds), corrupt (damaged file found at start).",
                                  labels=["spool", "reason"])
    replayed = CounterMetricFamily(f"{NS}_spool_replayed_records", "Records an earlier run left in the spool, "
                                   "found at start and sent first.", labels=["spool"])
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

    FAMILIES = tuple((m.name, m.type) for m in _render({}, [], every=True))

    def __init__(self, errors: Callable[[], dict[str, int]], spools: Callable[[], list[SpoolStats]]) -> None:
        self._errors = errors
        self._spools = spools

    def collect(self) -> Iterable[Metric]:
        return _render(self._errors(), self._spools())
