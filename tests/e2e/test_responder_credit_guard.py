"""The responder guards its host's credits, end to end (issue 15).

The real daemon (`burstwatch run`, its responder on, a known profile) runs in a namespace shaped like
EC2: tbf on its egress and, through an IFB, on its ingress (rate = baseline, burst = bucket, peakrate
= peak; tests/support/credit_lab.py). A client in the peer namespace runs back-to-back one-second
`iperf3 -c HOST -R` tests as fast as the responder takes them, then forward tests. The truth is the
shaper's own bucket, replayed from the bytes it let through (interface counters every 50 ms, checked
against the qdisc's own byte count) with its configured rate and burst: it must never fall under the
floor by more than one sample's worth of peak traffic. Each phase runs until the hourly budget
refuses, so it also shows tests served, tests refused for the floor, and the budget spent.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.conftest import require_root_tools
from tests.support.credit_lab import CreditLab, LabProfile, Trace

pytestmark = [pytest.mark.netns, pytest.mark.slow]

# 100 Mbit/s baseline, 300 Mbit/s peak, a 150 MB bucket: a 1 s test at the peak moves 37.5 MB and
# drains 25 MB net; above a floor of half the bucket there is room for two or three in a row, then
# one about every 2 s as the baseline refills it.
PROFILE = LabProfile(baseline_mbit=100.0, peak_mbit=300.0, bucket_mbit=1200.0, sample_interval=0.2,
                     rate_window=0.6)
FLOOR = 0.5
# Bytes served per direction in the hour: about five 1 s tests at the peak, so each phase reaches it.
BUDGET = 200_000_000
HOST = "10.77.0.1"
PHASE_SECONDS = 25.0          # most a phase may take (it normally ends after ~10 s)
FLOOR_REASONS = ("credit_floor", "would_cross_floor")

RESPONDER = f"""[responder]
listen = "{HOST}:5201"
allow = ["10.77.0.0/24"]
max_tests_per_hour = 100000
credit_floor = {FLOOR}
hourly_budget_bytes = {BUDGET}
hourly_budget_per_source_bytes = 1125899906842624
"""


def replay_bucket(points: list[tuple[float, int]], rate: float, bucket: float) -> list[tuple[float, float]]:
    """The token bucket a tbf holds, replayed from the bytes it let through: tokens arrive at `rate` up to
    `bucket`, every byte sent takes one; full at the first point (nothing crossed the shaper before)."""
    out = [(points[0][0], bucket)]
    remaining = bucket
    for (t0, b0), (t1, b1) in zip(points, points[1:]):
        remaining = min(bucket, remaining + rate * (t1 - t0) - (b1 - b0))
        out.append((t1, remaining))
    return out


def qdisc_sent(lab: CreditLab, dev: str) -> int:
    text = lab.lab.run(lab.inst, "tc", "-s", "qdisc", "show", "dev", dev).stdout
    m = re.search(r"qdisc tbf .*?Sent (\d+) bytes", text, re.S)
    assert m, text
    return int(m.group(1))


def refusals(lab: CreditLab) -> dict[str, float]:
    m = lab.metrics()
    return {k.split('"')[1]: v for k, v in m.items() if k.startswith("burstwatch_responder_refused_total{")}


def run_phase(lab: CreditLab, reverse: bool) -> dict[str, Any]:
    """Back-to-back 1 s tests until the hourly budget refuses one (or PHASE_SECONDS pass)."""
    before = refusals(lab)
    served = busy = 0
    cmd = ["iperf3", "-c", HOST, "-t", "1", "--connect-timeout", "3000", *(["-R"] if reverse else [])]
    start = time.time()
    while time.time() - start < PHASE_SECONDS:
        out = lab.lab.run(lab.peer, *cmd, check=False, timeout=20)
        if out.returncode == 0:
            served += 1
        elif "the server is busy" in out.stderr:
            busy += 1
            if refusals(lab).get("budget", 0) > before.get("budget", 0):
                break
            time.sleep(0.02)  # back to back, but leave the shared CPU a breath between refusals
        else:
            raise AssertionError(f"iperf3 failed: {out.stderr}")
    time.sleep(0.5)  # the last bytes through the shaper's queue, and one more sample
    after = refusals(lab)
    return {"served": served, "busy": busy, "start": start, "end": time.time(),
            "refused": {k: after.get(k, 0) - before.get(k, 0) for k in after}}


def test_responder_keeps_both_buckets_above_the_floor_and_within_its_budget() -> None:
    require_root_tools("ip", "tc", "ethtool", "iperf3")
    lab = CreditLab(PROFILE)
    try:
        lab.config.write_text(lab.config.read_text().replace("[responder]\nenabled = false\n", RESPONDER))
        inbound = Trace(lab.holder.pid, dev="ifb0")   # what the inbound shaper let through (ifb0's tx)
        lab.start_agent()
        phases = {"out": run_phase(lab, reverse=True), "in": run_phase(lab, reverse=False)}
        served = {d: lab.metrics()[f'burstwatch_responder_served_last_hour_bytes{{direction="{d}"}}']
                  for d in ("in", "out")}
        sent = {"out": qdisc_sent(lab, "eth0"), "in": qdisc_sent(lab, "ifb0")}
        lab.trace.stop()
        inbound.stop()
        series = {"out": lab.trace.series("out"), "in": inbound.series("out")}
    finally:
        lab.close()

    floor_bytes = FLOOR * PROFILE.bucket
    one_sample = PROFILE.peak * PROFILE.sample_interval
    for d in ("in", "out"):
        ph = phases[d]
        # The counters the replay uses are the shaper's own bytes (to ARP and the like).
        assert abs(series[d][-1][1] - sent[d]) <= 0.005 * sent[d] + 10_000, (d, series[d][-1][1], sent[d])
        bucket = [(t, r) for t, r in replay_bucket(series[d], PROFILE.baseline, PROFILE.bucket)
                  if ph["start"] <= t <= ph["end"]]
        lowest = min(r for _, r in bucket)
        figures = f"{d}: {ph}, lowest {lowest / 1e6:.1f} MB, floor {floor_bytes / 1e6:.1f} MB, served {served}"
        print(figures)  # the figures for the record (pytest -s or -rA shows them)
        assert ph["served"] >= 1, figures
        assert sum(ph["refused"].get(r, 0) for r in FLOOR_REASONS) >= 1, figures
        assert ph["refused"].get("budget", 0) >= 1 and ph["busy"] >= 2, figures
        # Every refusal was a floor or budget refusal, told as "busy" to iperf3.
        assert ph["busy"] == sum(ph["refused"].get(r, 0) for r in (*FLOOR_REASONS, "budget")), figures
        assert lowest >= floor_bytes - one_sample, figures
        # The budget held: at most BUDGET served, and nearly all of it (the next test did not fit).
        assert BUDGET - PROFILE.peak * 1.1 < served[d] <= BUDGET, figures
