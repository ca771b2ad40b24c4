"""Issue 22's targets from a real daemon: `burstwatch run` in the lab namespace with `[allowances] source = "nft"`,
asserted loosely from its /metrics and `burstwatch status --json` (the model-level lab: test_allowance_lab.py).

The daemon reads its own namespace's nftables limiters (agent/readers/nft.py): a `limit rate over` rule in the
output hook for pps_allowance_exceeded, a `ct count over N` rule for conntrack; tbf shaping through
`shaping_source = "tc"`. Each test starts its own namespaces and daemon (10.77.0.0/24).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.conftest import ROOT, free_port, require_root_tools
from tests.support import allowance_lab as al
from tests.support.credit_lab import parse_metrics
from tests.support.daemon_config import daemon_config
from tests.support.lab import Lab

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SAMPLE = 0.2
LAB_HORIZON = 4.0           # ConntrackRunningOut's horizon at lab scale ([allowances] horizon)
LIMIT = 150


@pytest.fixture(autouse=True)
def _tools() -> None:
    require_root_tools("ip", "nft", "tc")


class Daemon:
    """A lab (inst, peer) with the limiters' table in inst and the daemon running there on the nft source."""

    def __init__(self, lab: Lab, tmp: Path, shaping: Optional[dict[str, Any]] = None) -> None:
        self.lab = lab
        self.inst, self.peer, self.ia, self.ib = al.pair(lab)
        al.install_table(lab, self.inst)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.config = daemon_config(
            tmp, sample_interval=SAMPLE, state_dir=tmp / "state", interfaces=[self.ia],
            metrics={"listen": f"127.0.0.1:{self.port}"},
            # a baseline far above the lab's rates: bandwidth explains nothing unless the qdisc shapes
            instance={"type": "lab.allowances", "bandwidth": {"baseline_gbps": 1.0, "peak_gbps": 1.0}},
            credits=shaping or {"shaping_source": "none"},
            allowances={"source": "nft", "nft_table": f"inet {al.TABLE}", "window": 3.0, "horizon": LAB_HORIZON,
                        "flows_interval": 0.5})
        self.log = tmp / "daemon.log"

    def start(self) -> None:
        self.lab.popen(self.inst, sys.executable, "-m", "agent", "run", "--config", str(self.config),
                       cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        self.lab.wait_http(self.inst, self.url, timeout=20)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.lab.http_get(self.inst, self.url))

    def status(self) -> dict[str, Any]:
        out = self.lab.run(self.inst, sys.executable, "-m", "agent", "status", "--json", "--config",
                           str(self.config), timeout=30)
        return json.loads(out.stdout)  # type: ignore[no-any-return]


def _watch(d: Daemon, seconds: float, until: Any = None) -> list[tuple[float, dict[str, float]]]:
    """(wall time of the daemon's sample, its metrics) every SAMPLE s for `seconds` or until `until(m)`."""
    out: list[tuple[float, dict[str, float]]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = d.metrics()
        out.append((m.get("burstwatch_last_sample_timestamp_seconds", time.time()), m))
        if until is not None and until(m):
            break
        time.sleep(SAMPLE)
    return out


# -- PPS ------------------------------------------------------------------------------------------------
def test_daemon_learns_the_pps_ceiling_of_the_limiter(tmp_path: Path) -> None:
    with Lab() as lab:
        d = Daemon(lab, tmp_path)
        al.add_pps_limiter(lab, d.inst, 2000, 9000, chain="output")
        al.flow_server(lab, d.peer, al.PEER_ADDR, [9000])       # a sink: no ICMP unreachables back
        d.start()
        al.udp_blast(lab, d.inst, al.PEER_ADDR, 9000, 5000, 6.0, 64)
        seen = _watch(d, 8.0)
        m = seen[-1][1]
        ceiling = m.get('burstwatch_pps_ceiling_packets_per_second{source="learned"}')
        print(f"\nfigures daemon pps: ceiling {ceiling} for a 2000/s limiter "
              f"({(ceiling or 0) / 2000 - 1:+.1%}), episodes {m.get('burstwatch_pps_ceiling_learned_total')}, "
              f"drops {m.get('burstwatch_pps_exceeded_packets_total')}")
        assert (m.get("burstwatch_pps_exceeded_packets_total") or 0) > 5000, m
        assert ceiling is not None and abs(ceiling - 2000) / 2000 <= 0.10, ceiling
        assert m.get("burstwatch_collector_success{collector=\"allowances\"}") == 1.0


def test_daemon_learns_no_ceiling_when_tbf_shapes_the_link(tmp_path: Path) -> None:
    with Lab() as lab:
        d = Daemon(lab, tmp_path, shaping={"shaping_source": "tc"})
        # the limiter passes 300 datagrams/s of 1,000 bytes; the tbf after it lets ~250/s through (2 Mbit/s), so
        # the PPS counter and the qdisc's overlimits rise in the same samples: bandwidth explains the drops
        al.add_pps_limiter(lab, d.inst, 300, 9000, chain="output")
        lab.tbf(d.inst, d.ia, 2_000_000, 16_000, limit_bytes=64_000)
        al.flow_server(lab, d.peer, al.PEER_ADDR, [9000])
        d.start()
        al.udp_blast(lab, d.inst, al.PEER_ADDR, 9000, 1000, 6.0, 1000)
        m = _watch(d, 8.0)[-1][1]
        shaped = sum(v for k, v in m.items() if k.startswith("burstwatch_shaping_packets_total"))
        print(f"\nfigures daemon tbf: learned {m.get('burstwatch_pps_ceiling_learned_total')}, pps drops "
              f"{m.get('burstwatch_pps_exceeded_packets_total')}, shaped {shaped}")
        assert (m.get("burstwatch_pps_exceeded_packets_total") or 0) > 0 and shaped > 0, m
        assert m.get("burstwatch_pps_ceiling_learned_total") == 0.0
        assert not any(k.startswith("burstwatch_pps_ceiling_packets_per_second") for k in m)


# -- conntrack ------------------------------------------------------------------------------------------
def _fail_times(lines: list[str]) -> list[float]:
    """Wall times of the client's refused attempts (it prints monotonic times; one clock, one offset)."""
    offset = time.time() - time.monotonic()
    return [float(v[0]) + offset for v in map(str.split, lines) if len(v) == 4 and v[1] == "fail"]


def test_daemon_learns_the_conntrack_size_and_forecasts_the_fill(tmp_path: Path) -> None:
    with Lab() as lab:
        d = Daemon(lab, tmp_path)
        al.add_conntrack_limiter(lab, d.inst, LIMIT, daddr=al.PEER_ADDR)
        al.flow_server(lab, d.peer, al.PEER_ADDR, [8001, 8002])
        # The daemon starts on a busy host: 40 % in use, so its first lower bound (the largest level seen)
        # reads 90, and only a full moment teaches the size. Then a linear fill at 20 new flows/s past full.
        al.wait_line(al.open_flows(lab, d.inst, al.PEER_ADDR, [("tcp", 8002, 60)], 200.0), "done", 5)
        d.start()
        first = _watch(d, 1.0)[-1][1]
        start = time.time()
        client = al.open_flows(lab, d.inst, al.PEER_ADDR, [("tcp", 8001, LIMIT - 60 + 10)], 20.0)
        seen = _watch(d, 12.0, until=lambda m: m.get("burstwatch_conntrack_size_learned_total", 0) >= 1)
        seen += _watch(d, 1.0)
        fails = _fail_times(al.wait_line(client, "done", 10))
        assert fails, "the limiter refused nothing"
        full = min(fails)
        hits = n = 0
        for t, m in seen:
            if t < start + (full - start) / 5 or t >= full:
                continue
            n += 1
            truth = full - t
            hits += abs(m["burstwatch_conntrack_full_seconds"] - truth) <= max(2 * SAMPLE, 0.2 * truth)
        m = seen[-1][1]
        size = m.get('burstwatch_conntrack_size_entries{method="exceeded"}')
        bound = first.get('burstwatch_conntrack_size_entries{method="max_available"}')
        print(f"\nfigures daemon conntrack: first size {bound} (max_available), learned {size} "
              f"({(size or 0) / LIMIT - 1:+.1%} of {LIMIT}) after one fill; forecast within max(2 samples, 20 %) "
              f"in {hits}/{n} scrapes before full; fill {full - start:.2f} s")
        assert bound == LIMIT - 60, first
        assert size is not None and abs(size - LIMIT) / LIMIT <= 0.10, m
        # forecast before full: finite and under the lab horizon in scrapes before the first refusal
        before = [mm["burstwatch_conntrack_full_seconds"] for t, mm in seen if start < t < full]
        assert any(f <= LAB_HORIZON for f in before), before
        assert n >= 5 and hits / n >= 0.5, (hits, n)


def test_daemon_stays_quiet_at_seventy_percent_and_names_the_top_owners(tmp_path: Path) -> None:
    with Lab() as lab:
        d = Daemon(lab, tmp_path)
        al.add_conntrack_limiter(lab, d.inst, LIMIT, daddr=al.PEER_ADDR)
        al.flow_server(lab, d.peer, al.PEER_ADDR, [8001, 8002, 8003, 8004])
        d.start()
        # 105 flows = 70 % of the table, at 20/s, then held
        plan = [("tcp", 8002, 45), ("udp", 8003, 30), ("tcp", 8001, 20), ("tcp", 8004, 10)]
        client = al.open_flows(lab, d.inst, al.PEER_ADDR, plan, 20.0, hold=30)
        seen = _watch(d, 105 / 20.0 + 3.0)
        al.wait_line(client, "done", 5)

        def condition(m: dict[str, float]) -> bool:
            """ConntrackRunningOut's expression at the lab's horizon (packaging/prometheus)."""
            ratio = m.get("burstwatch_conntrack_in_use_ratio", 0.0)
            return (m.get("burstwatch_conntrack_full_seconds", float("inf")) < LAB_HORIZON and ratio >= 0.8) \
                or ratio >= 0.95

        fired = [m for _, m in seen if condition(m) or m.get("burstwatch_conntrack_running_out") == 1.0]
        last = seen[-1][1]
        doc = d.status()
        owners = [(o["protocol"], o["port"], o["flows"]) for o in doc["allowances"]["conntrack"]["owners"]]
        print(f"\nfigures daemon conntrack 70 %: running-out scrapes {len(fired)} of {len(seen)}, last share "
              f"{last.get('burstwatch_conntrack_in_use_ratio')}; status top owners {owners}")
        assert 0.6 <= last["burstwatch_conntrack_in_use_ratio"] <= 0.8, last
        assert fired == []
        assert owners == [("tcp", 8002, 45), ("udp", 8003, 30), ("tcp", 8001, 20)], doc["allowances"]
