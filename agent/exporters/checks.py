"""Prometheus view of the latest check verdicts (a state set per check and the figures behind them)."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from prometheus_client.core import Metric

from agent.checks.runner import CheckState
from agent.exporters import View, declared, family
from agent.models import figures as F
from agent.models.checks import STATUSES


class CheckView(View):
    """Renders the runner's latest CheckState; never runs a check itself."""

    FAMILIES = declared(F.CHECK_STATUS, F.CHECK_LAST_RUN_TIMESTAMP_SECONDS, F.CHECK_DURATION_SECONDS,
                        F.CHECK_RUNS_TOTAL, F.INTERFACE_MTU_BYTES, F.PATH_MTU_BYTES, F.PATH_MTU_BLACK_HOLE,
                        F.INTERFACE_QUEUES, F.INTERFACE_RING_ENTRIES)

    def __init__(self, state: Callable[[], Optional[CheckState]]) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        st = self._state()
        if st is None:
            return
        yield _status(st)
        last = family(F.CHECK_LAST_RUN_TIMESTAMP_SECONDS)
        dur = family(F.CHECK_DURATION_SECONDS)
        for name, t in sorted(st.last_run.items()):
            last.add_metric([name], t)
            dur.add_metric([name], st.durations.get(name, 0.0))
        yield last
        yield dur
        yield family(F.CHECK_RUNS_TOTAL, st.runs)
        yield from _evidence(st)


def _status(st: CheckState) -> Metric:
    """A state set (one series per status, 1 for the current one), so rules select the status by label
    (`{status="fail"} == 1`), and a recovery shows as 1 -> 0."""
    status = family(F.CHECK_STATUS)
    seen = set()
    for v in st.verdicts:
        key = (v.check, v.interface)
        if key in seen:
            continue  # a check returning two verdicts for one interface: the first one wins
        seen.add(key)
        for s in STATUSES:
            status.add_metric([v.check, v.interface, s], 1.0 if s == v.status else 0.0)
    return status


def _evidence(st: CheckState) -> Iterable[Metric]:
    """The figures the checks saw (their verdicts' evidence): MTUs, path MTU, queues, rings."""
    mtu = family(F.INTERFACE_MTU_BYTES)
    for v in st.by_check("mtu"):
        if isinstance(v.evidence.get("mtu"), int):
            mtu.add_metric([v.interface], v.evidence["mtu"])
    yield mtu

    pmtu = family(F.PATH_MTU_BYTES)
    hole = family(F.PATH_MTU_BLACK_HOLE)
    for v in st.by_check("path_mtu"):
        if v.interface and isinstance(v.evidence.get("path_mtu"), int):
            pmtu.add_metric([v.interface], v.evidence["path_mtu"])
            hole.add_metric([v.interface], 1.0 if v.evidence.get("black_hole") else 0.0)
    yield pmtu
    yield hole

    queues = family(F.INTERFACE_QUEUES)
    for v in st.by_check("queues"):
        for kind in ("in_use", "maximum", "expected"):
            if isinstance(v.evidence.get(kind), int):
                queues.add_metric([v.interface, kind], v.evidence[kind])
    yield queues

    rings = family(F.INTERFACE_RING_ENTRIES)
    for v in st.by_check("rings"):
        for ring in ("rx", "tx"):
            for setting, field in (("current", ring), ("maximum", f"{ring}_max")):
                if isinstance(v.evidence.get(field), int):
                    rings.add_metric([v.interface, ring, setting], v.evidence[field])
    yield rings
