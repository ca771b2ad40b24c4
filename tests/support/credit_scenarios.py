"""Credit-lab scenarios shared by the e2e tests (loose asserts) and `make bench` (figures vs targets)."""

from __future__ import annotations

import math
import time
from pathlib import Path

from tests.support.credit_lab import CreditLab, LabProfile, scale_rules

RULES = Path(__file__).resolve().parents[2] / "packaging" / "prometheus" / "burstwatch.rules.yml"


def _sleep_until(t: float) -> None:
    while time.time() < t:
        time.sleep(0.01)


def forecast_idle_restart(direction: str = "out", with_prometheus: bool = False,
                          profile: LabProfile | None = None) -> dict[str, float]:
    """Drain at full speed (forecast one second in vs the real clamp), idle, then drain again and
    SIGKILL + restart the agent mid-drain. With Prometheus, also when the shipped forecast alert fires
    (horizon scaled to the lab: 4 s, for: 0s) relative to the clamp."""
    p = profile or LabProfile()
    lab = CreditLab(p)
    fig: dict[str, float] = {}
    try:
        lab.start_agent()
        if with_prometheus:
            lab.start_prometheus(scale_rules(RULES.read_text(), minutes=4 / 60))
            time.sleep(2.0)  # a few scrapes of the full bucket first
        tr = lab.traffic(direction)
        # 1) full-speed drain: the forecast one second in, against the moment the shaper clamps
        tr.start()
        t0 = lab.wait_drain_start(direction)
        _sleep_until(t0 + 1.0)
        c = lab.credit(direction)
        predicted = c["sample_time"] + c["exhaustion_seconds"]
        fired_at = math.inf
        if with_prometheus:
            deadline = time.time() + 30
            while time.time() < deadline and not lab.firing_alerts():
                time.sleep(0.1)
            firing = [a for a in lab.firing_alerts() if a["labels"]["alertname"] == "BurstCreditsRunningOut"]
            fired_at = time.time() if firing else math.inf
        clamp = lab.wait_clamp(direction, t0)
        fig["drain_seconds"] = clamp - t0
        fig["forecast_error_seconds"] = predicted - clamp
        fig["forecast_tolerance_seconds"] = max(0.5, 0.1 * (clamp - t0))
        if with_prometheus:
            fig["alert_lead_seconds"] = clamp - fired_at
        time.sleep(1.5)  # held at the baseline: the agent confirms the exhaustion
        fig["exhausted_flag"] = lab.credit(direction)["exhausted"]
        tr.stop()

        # 2) idle, then what the agent says is left
        time.sleep(5.0)
        idle = lab.credit(direction)

        # 3) drain again; SIGKILL the agent one second in, restart it, read where it continues
        tr.start()
        t1 = lab.wait_drain_start(direction)
        _sleep_until(t1 + 0.8)
        lab.kill_agent()
        time.sleep(0.5)
        lab.start_agent()
        time.sleep(p.sample_interval * 2)
        after = lab.credit(direction)
        clamp2 = lab.wait_clamp(direction, t1)
        tr.stop()
        bucket = p.bucket
        fig["idle_error_ratio"] = (idle["remaining_bytes"] - lab.true_remaining(direction, idle["sample_time"],
                                                                               clamp2)) / bucket
        fig["idle_true_ratio"] = lab.true_remaining(direction, idle["sample_time"], clamp2) / bucket
        fig["restart_error_ratio"] = (after["remaining_bytes"] - lab.true_remaining(direction, after["sample_time"],
                                                                                   clamp2)) / bucket
        return fig
    finally:
        lab.close()


def learn_bucket(direction: str = "out", profile: LabProfile | None = None) -> dict[str, float]:
    """Start with a bucket twice too large: after one exhaustion the learned size, then (after a full
    refill) the next forecast against the next clamp."""
    p = profile or LabProfile()
    lab = CreditLab(p, configured_bucket_mbit=2 * p.bucket_mbit, trust_configured_bucket=False)
    fig: dict[str, float] = {}
    try:
        lab.start_agent()
        tr = lab.traffic(direction)
        tr.start()
        t0 = lab.wait_drain_start(direction)
        lab.wait_clamp(direction, t0)
        time.sleep(2.0)  # confirmation window plus a sample
        c = lab.credit(direction)
        fig["learned_bucket_ratio"] = c["bucket_bytes"] / p.bucket
        fig["learned_count"] = c["bucket_learned_total"]
        tr.stop()
        # refill completely: bucket / baseline seconds, plus margin
        time.sleep(p.bucket / p.baseline * 1.15)
        tr.start()
        t1 = lab.wait_drain_start(direction)
        _sleep_until(t1 + 1.0)
        c = lab.credit(direction)
        predicted = c["sample_time"] + c["exhaustion_seconds"]
        clamp = lab.wait_clamp(direction, t1)
        tr.stop()
        fig["forecast_error_seconds"] = predicted - clamp
        fig["forecast_tolerance_seconds"] = max(0.5, 0.1 * (clamp - t1))
        return fig
    finally:
        lab.close()
