"""Two agents' probe schedulers in two namespaces probing each other over a shaped link, on a schedule."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import require_root_tools
from tests.support.lab import Lab

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[2]
RATE = 200_000_000                 # the shaper, bit/s, each way
PEAK = RATE / 8                    # the lab profile's peak in bytes/s: the pair should get the shaper's rate
DURATION = 2.0                     # seconds per probe (1 s loses too much to TCP's ramp-up)
INTERVAL = 1.5                     # seconds between rounds
A_IP, B_IP = "10.97.0.1", "10.97.0.2"
METRICS_PORT = 9786
A_BUDGET = 180e6                   # room for three ~50 MB probes: the fourth is skipped for the budget
BUCKET = 1e9


def agent_main() -> None:
    """One agent's probing half inside a namespace: the burstwatch responder, the probe service with the
    real engine, and /metrics. Settings come as JSON in argv[1]; credits are read from a JSON file the test
    rewrites (standing in for the credit model, which the daemon wires in)."""
    from agent.config import ProbeConfig, ResponderConfig
    from agent.exporters.probes import ProbesView
    from agent.exporters.prometheus import MetricsServer, build_registry
    from agent.exporters.responder import ResponderView
    from agent.models.profile import BandwidthProfile
    from agent.probes.service import build_probe_service
    from agent.responder.server import Responder

    cfg = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    responder = Responder(ResponderConfig(listen=cfg["listen"], max_tests_per_hour=1000), cfg["allow"])
    responder.start()
    credit_file = Path(cfg["credits"])

    def credits() -> dict[str, Any]:
        return {d: tuple(v) for d, v in json.loads(credit_file.read_text()).items()}

    profile = BandwidthProfile("lab.shaped", PEAK / 4, PEAK, BUCKET, "config", "config", "config")
    # (a faster schedule than [probe] allows at load time: the test's rounds are seconds apart; probes at the
    # peak, whose credit gates this test is about: tests/e2e/test_probe_rate.py has the baseline-capped ones)
    section = ProbeConfig(peers=[cfg["peer"]], interval=INTERVAL, peers_per_round=1, duration=DURATION, streams=2,
                          credit_floor=0.5, hourly_budget_bytes=int(cfg["budget"]), rate="peak")
    svc = build_probe_service(section, responder_port=5201, credits=credits, profile=lambda: profile,
                              busy=lambda: responder.stats.snapshot().busy)
    server = MetricsServer("0.0.0.0", METRICS_PORT, build_registry([ProbesView(svc.snapshot),
                                                                     ResponderView(responder.stats.snapshot)]))
    server.start()
    svc.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    svc.stop(3.0)
    responder.stop(1.0)
    server.stop()


def scrape(lab: Lab, ns: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = lab.http_get(ns, f"http://127.0.0.1:{METRICS_PORT}/metrics")
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: dict, name: str, **labels: str) -> Any:
    return m.get((name, tuple(sorted(labels.items()))))


def wait_for(lab: Lab, ns: str, cond: Callable[[dict], bool], timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    m: dict = {}
    while time.monotonic() < deadline:
        try:
            m = scrape(lab, ns)
        except Exception:
            m = {}
        if m and cond(m):
            return m
        time.sleep(0.3)
    raise AssertionError(f"{what} not seen within {timeout}s; last scrape: "
                         f"{ {k: v for k, v in m.items() if k[0].startswith('burstwatch_probe')} }")


def write_credits(path: Path, in_ratio: float, out_ratio: float) -> None:
    tmp = path.with_suffix(".tmp")       # atomic: the agent may read at any moment
    tmp.write_text(json.dumps({"in": [in_ratio * BUCKET, BUCKET], "out": [out_ratio * BUCKET, BUCKET]}))
    tmp.replace(path)


def test_two_agents_probe_each_other_on_a_schedule(tmp_path: Path) -> None:
    require_root_tools("ip", "tc", "iperf3")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    a_credits, b_credits = tmp_path / "a-credits.json", tmp_path / "b-credits.json"
    write_credits(a_credits, 1.0, 1.0)
    write_credits(b_credits, 0.3, 1.0)          # B starts below the floor: it must stand aside
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        ia, ib = lab.link(a, b, f"{A_IP}/24", f"{B_IP}/24")
        lab.tbf(a, ia, RATE, burst_bytes=256 * 1024)
        lab.tbf(b, ib, RATE, burst_bytes=256 * 1024)
        # A probes a stock iperf3 server in B; B probes A's burstwatch responder.
        lab.popen(b, "iperf3", "-s", "-p", "5202", "-B", B_IP)
        code = "from tests.e2e.test_probe_schedule import agent_main; agent_main()"
        agents = {}
        for ns, me, peer, budget, credits in ((a, A_IP, f"{B_IP}:5202", A_BUDGET, a_credits),
                                              (b, B_IP, f"{A_IP}:5201", 1e12, b_credits)):
            spec = {"listen": f"{me}:5201", "allow": ["10.97.0.0/24"], "peer": peer, "budget": budget,
                    "credits": str(credits)}
            with open(tmp_path / f"{ns}.log", "w") as log_file:     # the child keeps its own copy
                agents[ns] = lab.popen(ns, sys.executable, "-c", code, json.dumps(spec), env=env, cwd=str(ROOT),
                                       stdout=log_file, stderr=subprocess.STDOUT)
        try:
            _phases(lab, a, b, b_credits)
        except AssertionError as exc:
            logs = "\n".join(f"--- {ns}\n{(tmp_path / f'{ns}.log').read_text()[-3000:]}" for ns in agents)
            raise AssertionError(f"{exc}\n{logs}") from None

        # The agents stop cleanly on SIGTERM.
        for proc in agents.values():
            proc.send_signal(signal.SIGTERM)
        for ns, proc in agents.items():
            assert proc.wait(10) == 0, (tmp_path / f"{ns}.log").read_text()[-2000:]
        log_a = (tmp_path / f"{a}.log").read_text()
    assert "probe scheduler started" in log_a and f"peer={B_IP}:5202 direction=out" in log_a


def _phases(lab: Lab, a: str, b: str, b_credits: Path) -> None:
    a_peer = f"{B_IP}:5202"

    # Phase 1: A probes both directions until its hourly budget runs out; B skips for its credit floor.
    ma = wait_for(lab, a, lambda m: (value(m, "burstwatch_probe_skipped_total", reason="budget") or 0) >= 1,
                  30.0, "A's budget skips")
    mb = scrape(lab, b)
    for d in ("out", "in"):
        assert value(ma, "burstwatch_probe_success", peer=a_peer, direction=d) == 1.0, d
        rate = value(ma, "burstwatch_probe_throughput_bytes_per_second", peer=a_peer, direction=d)
        # tbf counts IP packets, the receiver TCP payload (1448 of 1500 bytes): ~3.5 % under the shaper,
        # and a 2 s probe loses a little more to slow start. Unshaped, veth would give several Gbit/s.
        assert 0.8 * PEAK < rate < 1.02 * PEAK, (d, rate * 8)
        ratio = value(ma, "burstwatch_probe_throughput_ratio", peer=a_peer, direction=d)
        assert ratio == pytest.approx(rate / PEAK), (d, ratio)
        assert value(ma, "burstwatch_probe_expected_bytes_per_second", peer=a_peer, direction=d) == PEAK
        assert value(ma, "burstwatch_probe_duration_seconds", peer=a_peer, direction=d) >= DURATION
        assert value(ma, "burstwatch_probe_last_run_timestamp_seconds", peer=a_peer, direction=d) > 1e9
    assert value(ma, "burstwatch_probe_rtt_seconds", peer=a_peer, direction="out") > 0
    assert value(ma, "burstwatch_probe_retransmits", peer=a_peer, direction="out") is not None
    runs = sum(v for (n, _), v in ma.items() if n == "burstwatch_probe_runs_total")
    used = value(ma, "burstwatch_probe_budget_used_bytes")
    assert runs >= 2
    # Each probe started only with room for its expected bytes: the hour's total stays near the budget.
    assert used <= A_BUDGET + 0.2 * PEAK * DURATION, used
    assert value(ma, "burstwatch_probe_skipped_total", reason="credit_floor") == 0
    assert (value(mb, "burstwatch_probe_skipped_total", reason="credit_floor") or 0) >= 2
    assert sum(v for (n, _), v in mb.items() if n == "burstwatch_probe_runs_total") == 0
    assert value(mb, "burstwatch_responder_tests_total", result="completed") in (None, 0.0)

    # Phase 2: B's outbound bucket is full, its inbound one just above the floor: outbound probes run,
    # inbound ones would cross the floor by themselves (0.51 GB - 50 MB < 0.5 GB) and are skipped.
    write_credits(b_credits, 0.51, 1.0)
    b_peer = f"{A_IP}:5201"
    mb = wait_for(lab, b, lambda m: value(m, "burstwatch_probe_success", peer=b_peer, direction="out") == 1.0
                  and (value(m, "burstwatch_probe_skipped_total", reason="would_cross_floor") or 0) >= 1,
                  30.0, "B's first probe of A's responder")
    rate = value(mb, "burstwatch_probe_throughput_bytes_per_second", peer=b_peer, direction="out")
    assert 0.8 * PEAK < rate < 1.02 * PEAK, rate * 8
    assert value(mb, "burstwatch_probe_success", peer=b_peer, direction="in") is None
    ma = scrape(lab, a)
    assert value(ma, "burstwatch_responder_tests_total", result="completed") >= 1   # A served B's probe
