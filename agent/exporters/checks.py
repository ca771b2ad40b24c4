"""Prometheus view of the latest check verdicts (burstwatch_check_status and the figures behind them)."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.checks.runner import CheckState
from agent.models.checks import SEVERITY

NS = "burstwatch"
# burstwatch_check_status's value: the same numbers as `burstwatch check`'s exit codes (0 ok, 1 warn,
# 2 fail), and -1 for a check that could not run here. `max by (check) (...)` is the worst interface;
# alert on `burstwatch_check_status >= 2`.
STATUS_VALUE = dict(SEVERITY)


class CheckView:
    """Renders the runner's latest CheckState; never runs a check itself."""

    def __init__(self, state: Callable[[], Optional[CheckState]]) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        st = self._state()
        if st is None:
            return
        status = GaugeMetricFamily(f"{NS}_check_status", "Latest verdict per check and interface (or peer for "
                                   "path_mtu, \"\" for instance-wide checks): 0 ok, 1 warn, 2 fail, -1 skip.",
                                   labels=["check", "interface"])
        seen = set()
        for v in st.verdicts:
            key = (v.check, v.interface)
            if key in seen:
                continue  # a check returning two verdicts for one interface: the first one wins
            seen.add(key)
            status.add_metric([v.check, v.interface], STATUS_VALUE[v.status])
        yield status

        last = GaugeMetricFamily(f"{NS}_check_last_run_timestamp_seconds", "Unix time the check last ran.",
                                 labels=["check"])
        dur = GaugeMetricFamily(f"{NS}_check_duration_seconds", "How long the check's last run took.",
                                labels=["check"])
        for name, t in sorted(st.last_run.items()):
            last.add_metric([name], t)
            dur.add_metric([name], st.durations.get(name, 0.0))
        yield last
        yield dur
        yield CounterMetricFamily(f"{NS}_check_runs", "Check rounds completed.", value=st.runs)

        mtu = GaugeMetricFamily(f"{NS}_interface_mtu_bytes", "Interface MTU, as the mtu check saw it.",
                                labels=["interface"])
        for v in st.by_check("mtu"):
            if isinstance(v.evidence.get("mtu"), int):
                mtu.add_metric([v.interface], v.evidence["mtu"])
        yield mtu

        pmtu = GaugeMetricFamily(f"{NS}_path_mtu_bytes", "Largest packet that reaches the peer with DF set "
                                 "(measured by the path_mtu check).", labels=["peer"])
        hole = GaugeMetricFamily(f"{NS}_path_mtu_black_hole", "1 when larger packets to the peer vanish without "
                                 "ICMP \"fragmentation needed\" (an MTU black hole).", labels=["peer"])
        for v in st.by_check("path_mtu"):
            if v.interface and isinstance(v.evidence.get("path_mtu"), int):
                pmtu.add_metric([v.interface], v.evidence["path_mtu"])
                hole.add_metric([v.interface], 1.0 if v.evidence.get("black_hole") else 0.0)
        yield pmtu
        yield hole

        queues = GaugeMetricFamily(f"{NS}_interface_queues", "ENA queues: in_use, the driver's maximum, and "
                                   "the count expected for this type and vCPUs.", labels=["interface", "kind"])
        for v in st.by_check("queues"):
            for kind in ("in_use", "maximum", "expected"):
                if isinstance(v.evidence.get(kind), int):
                    queues.add_metric([v.interface, kind], v.evidence[kind])
        yield queues

        rings = GaugeMetricFamily(f"{NS}_interface_ring_entries", "Descriptor ring sizes: current and maximum.",
                                  labels=["interface", "ring", "setting"])
        for v in st.by_check("rings"):
            for ring in ("rx", "tx"):
                for setting, field in (("current", ring), ("maximum", f"{ring}_max")):
                    if isinstance(v.evidence.get(field), int):
                        rings.add_metric([v.interface, ring, setting], v.evidence[field])
        yield rings
