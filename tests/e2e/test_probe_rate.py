"""rate = "baseline" against rate = "peak" through an EC2-like shaper: the capped probe runs at the
baseline and leaves the bucket full, the peak probe spends it (docs/probe-scheduling.md, "What probes cost").

Topology: namespace `a` (the prober: the real probe service, wired as the daemon wires it, with a configured
burstable profile) joined by veth to `b` (burstwatch's standalone responder). Each end's egress carries a tbf
like EC2's shaper (rate = baseline, burst = bucket, peakrate = peak): a's is a's outbound bucket, b's is the
path into a, a's inbound bucket. Truth comes from the shaper, never from the agent: right after the probes a
--bidir test at full speed drains both buckets, and what got through on the wire beyond the baseline, read
from a's interface counters, is the credit each bucket still held.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.conftest import require_root_tools
from tests.support.iperf3 import wait_listening
from tests.support.lab import Lab, run_in_ns

pytestmark = [pytest.mark.netns, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BASE_BIT = 20_000_000            # the profile's and the shaper's baseline, bit/s
PEAK_BIT = 200_000_000           # ... and peak: a probe at the peak drains 22.5 MB/s above the refill
BUCKET = 60_000_000              # bytes: ~2.7 s at the peak from full
DURATION = 2.0                   # seconds per probe: a peak probe spends ~45 MB, three quarters of the bucket
STREAMS = 2
DRAIN = 5.0                      # seconds of the draining --bidir test: longer than a full bucket lasts
A_IP, B_IP = "10.95.0.1", "10.95.0.2"


def _counters(lab: Lab, ns: str, dev: str) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of `dev` in `ns`: frames as the tbf counts them."""
    for line in lab.run(ns, "cat", "/proc/net/dev").stdout.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == dev:
            v = rest.split()
            return int(v[0]), int(v[8])
    raise KeyError(dev)


def _reset_shapers(lab: Lab, a: str, ia: str, b: str, ib: str) -> None:
    """Fresh qdiscs: both buckets full."""
    for ns, dev in ((a, ia), (b, ib)):
        lab.run(ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
        lab.tbf(ns, dev, BASE_BIT, burst_bytes=BUCKET, peak_bit=PEAK_BIT)


def _probe_round(rate: str) -> dict[str, Any]:
    """One round of the probe service (out, then in) with `rate`, as the daemon builds it; runs inside a."""
    from agent.config import ProbeConfig
    from agent.models.profile import BandwidthProfile
    from agent.probes.service import build_probe_service

    profile = BandwidthProfile("lab.burst", BASE_BIT / 8, PEAK_BIT / 8, float(BUCKET), "config", "config",
                               "config")
    # (a faster schedule than [probe] allows at load time: rounds are due at once)
    cfg = ProbeConfig(peers=[B_IP], interval=0.5, duration=DURATION, streams=STREAMS, rate=rate,
                      credit_floor=0.0, hourly_budget_bytes=10**12)
    svc = build_probe_service(cfg, responder_port=5201, credits=lambda: None, profile=lambda: profile)
    results: dict[str, Any] = {}
    deadline = time.monotonic() + 30.0
    while len(results) < 2 and time.monotonic() < deadline:
        r = svc.run_once()
        if r is None:
            time.sleep(svc.sleep_seconds())
        else:
            results[r.direction] = r
    return results


def _drain() -> dict[str, Any]:
    from agent.iperf3.client import ProbeRequest, run_probe

    return run_probe(ProbeRequest(B_IP, 5201, streams=STREAMS, duration=DRAIN, bidir=True))


def _phase(lab: Lab, a: str, ia: str, b: str, ib: str, rate: Optional[str]) -> tuple[dict[str, Any],
                                                                                     dict[str, float]]:
    """Probe with `rate` (None: not at all, the control) from full buckets, then measure the credit each
    bucket has left (bytes)."""
    _reset_shapers(lab, a, ia, b, ib)
    results: dict[str, Any] = {}
    if rate is not None:
        results = run_in_ns(a, lambda: _probe_round(rate), timeout=60.0)
        assert sorted(results) == ["in", "out"], results
        for r in results.values():
            assert r.success, r
    else:
        time.sleep(1.0)     # as long as the gap between a probe round and the drain
    rx0, tx0 = _counters(lab, a, ia)
    doc = run_in_ns(a, _drain, timeout=60.0)
    rx1, tx1 = _counters(lab, a, ia)
    # Through a tbf kept busy until it clamps, bytes = credit held when the data starts + baseline x the
    # time it flows (the test's own clock: the counters' window also holds the handshake, when a full
    # bucket cannot take the refill). Handshake and ACK bytes outside that time are a few kB.
    seconds = float(doc["end"]["sum_sent"]["seconds"])
    assert DRAIN - 0.5 < seconds < DRAIN + 1.0, seconds
    base = BASE_BIT / 8 * seconds
    left = {"out": (tx1 - tx0) - base, "in": (rx1 - rx0) - base}
    return results, left


def test_baseline_rate_probes_leave_the_bucket_and_peak_ones_spend_it(tmp_path: Path) -> None:
    require_root_tools("ip", "tc")
    conf = tmp_path / "responder.toml"
    conf.write_text("[responder]\nmax_tests_per_hour = 1000\n")
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        ia, ib = lab.link(a, b, f"{A_IP}/24", f"{B_IP}/24")
        log = open(tmp_path / "responder.log", "w")    # the child keeps its own copy
        lab.popen(b, sys.executable, "-m", "agent", "responder", "--config", str(conf), "--listen",
                  f"{B_IP}:5201", "--allow", "10.95.0.0/24", cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_listening(5201, netns=b)

        _, left_full = _phase(lab, a, ia, b, ib, None)
        capped, left_capped = _phase(lab, a, ia, b, ib, "baseline")
        peak, left_peak = _phase(lab, a, ia, b, ib, "peak")

    def mbit(results: dict[str, Any]) -> dict[str, float]:
        return {d: round(r.throughput_bytes_per_second * 8 / 1e6, 1) for d, r in results.items()}

    def mb(left: dict[str, float]) -> dict[str, float]:
        return {d: round(v / 1e6, 1) for d, v in left.items()}

    report = (f"credit left (MB of {BUCKET / 1e6:g}): no probes {mb(left_full)}, rate=baseline {mb(left_capped)}, "
              f"rate=peak {mb(left_peak)}; probe Mbit/s: baseline {mbit(capped)}, peak {mbit(peak)}; "
              f"responder log {tmp_path / 'responder.log'}")
    print(report)
    for d in ("out", "in"):
        # The capped probe runs near its cap (payload paced at the baseline; the shaper would let 10x through)
        # and says so: expected = the cap, so the ratio reads "the network delivers the baseline".
        r = capped[d]
        assert r.expected_bytes_per_second == pytest.approx(BASE_BIT / 8, rel=1e-3), report
        assert 0.85 < r.throughput_ratio < 1.05, report
        # ... and leaves the bucket essentially as full as no probe at all does (headers, ~4.5 % above the
        # paced payload, spend ~0.2 MB of 60 over 2 s). The control reads the whole bucket, give or take
        # what TCP leaves unused of the baseline once clamped.
        assert 0.85 * BUCKET < left_full[d] < 1.1 * BUCKET, report
        assert left_capped[d] > left_full[d] - 0.05 * BUCKET, report
        # The peak probe runs at the peak and spends about three quarters of the bucket (some refills while
        # the other direction's probe runs).
        assert peak[d].throughput_bytes_per_second > 0.7 * PEAK_BIT / 8, report
        assert left_peak[d] < left_full[d] - 0.4 * BUCKET, report
