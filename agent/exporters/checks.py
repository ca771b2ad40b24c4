"""Prometheus view of the latest check verdicts (burstwatch_check_status and the figures behind them)."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.checks.runner import CheckState
from agent.exporters import NS, View
from agent.models.checks import STATUSES


class CheckView(View):
    """Renders the runner's latest CheckState; never runs a check itself."""

    FAMILIES = (
        ("burstwatch_check_status", "gauge"),
        ("burstwatch_check_last_run_timestamp_seconds", "gauge"),
        ("burstwatch_check_duration_seconds", "gauge"),
        ("burstwatch_check_runs", "counter"),
        ("burstwatch_interface_mtu_bytes", "gauge"),
        ("burstwatch_path_mtu_bytes", "gauge"),
        ("burstwatch_path_mtu_black_hole", "gauge"),
        ("burstwatch_interface_queues", "gauge"),
        ("burstwatch_interface_ring_entries", "gauge"),
    )

    def __init__(self, state: Callable[[], Optional[CheckState]]) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        st = self._state()
        if st is None:
            return
        # A state set (one series per status, 1 for the current one), so rules select the status by
        # label: `burstwatch_check_status{status="fail"} == 1`, and a recovery shows as 1 -> 0.
        status = GaugeMetricFamily(f"{NS}_check_status", "1 for the latest verdict (status: ok, warn, fail, skip) "
                                   "per check and interface (the peer for path_mtu, \"\" for instance-wide checks), "
                                   "0 for the other statuses.", labels=["check", "interface", "status"])
        seen = set()
        for v in st.verdicts:
            key = (v.check, v.interface)
            if key in seen:
                continue  # a check returning two verdicts for one interface: the first one wins
            seen.add(key)
            for s in STATUSES:
                status.add_metric([v.check, v.interface, s], 1.0 if s == v.status else 0.0)
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
