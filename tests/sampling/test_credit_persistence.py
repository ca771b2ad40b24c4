"""The credits step's persistence: saved on movement (1 % of the bucket) at most once per sample, with
save_interval as the idle heartbeat; a crash mid-drain restarts within about that; the gap is conservative."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from agent.config import CreditsConfig
from agent.models.counters import CounterTracker
from agent.models.credit_model import SAVE_MOVEMENT_FRACTION
from agent.models.profile import BandwidthProfile
from agent.readers.netdev import NetDevCounters
from agent.sampling.credits import CreditsStep

BASE, PEAK, BUCKET = 100e6 / 8, 300e6 / 8, 150e6     # the lab's profile (tests/support/credit_lab.py)
DT = 0.2                                              # the lab's sample interval


def profile() -> BandwidthProfile:
    return BandwidthProfile("lab.shaper", BASE, PEAK, BUCKET, "config", "config", "config")


class Host:
    """One interface's kernel counters and the boot clock; agents come and go (SIGKILL: no goodbye)."""

    def __init__(self, tmp_path: Path, save_interval: float = 5.0) -> None:
        self.tmp = tmp_path
        (tmp_path / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
        (tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text("boot-1\n")
        self.t = 1000.0
        self.tx = 10**9
        self.cfg = CreditsConfig(save_interval=save_interval)
        self.saves = 0

    def clock(self) -> float:
        return self.t

    def agent(self) -> tuple[CreditsStep, CounterTracker]:
        ct = CreditsStep(profile(), str(self.tmp / "state"), self.cfg, procfs=str(self.tmp / "proc"),
                           clock=self.clock, sample_clock=self.clock)
        real_save = ct.store.save

        def counting_save(*a, **kw):  # type: ignore[no-untyped-def]
            self.saves += 1
            real_save(*a, **kw)

        ct.store.save = counting_save  # type: ignore[method-assign]
        return ct, CounterTracker(0.6)

    def sample(self, agent: tuple[CreditsStep, CounterTracker], rate: float = 0.0,
               slow: float = 0.0) -> Optional[float]:
        """Move `rate` bytes/s out for one sample interval, then let the agent sample (its credit stage
        running `slow` s after the counters were read, the traffic going on); its `out` remaining."""
        self.t += DT
        self.tx += int(rate * DT)
        ct, counters = agent
        now = self.t
        deltas = counters.update(now, {"eth0": (2, NetDevCounters(0, 0, 0, 0, self.tx, 0, 0, 0))})
        self.t += slow
        self.tx += int(rate * slow)
        r = ct.run(now, deltas, counters, None)
        return r["out"].remaining_bytes if r else None

    def down(self, seconds: float, rate: float = 0.0) -> None:
        """The agent is gone; traffic goes on."""
        self.t += seconds
        self.tx += int(rate * seconds)

    def saved_deficit(self) -> float:
        return float(json.loads((self.tmp / "state" / "credits.json").read_text())["directions"]["out"]["deficit"])


def test_a_drain_is_saved_every_percent_of_the_bucket_not_every_save_interval(tmp_path: Path) -> None:
    host = Host(tmp_path, save_interval=3600.0)
    agent = host.agent()
    host.sample(agent)
    host.sample(agent)
    before = host.saves
    for _ in range(20):                                   # 4 s at the peak: 40 % of the bucket
        host.sample(agent, PEAK)
        model = agent[0].estimator.buckets["out"].deficit
        # one sample at the peak moves 2.7 % of the bucket here: the file is never a sample behind
        assert abs(host.saved_deficit() - model) <= max(SAVE_MOVEMENT_FRACTION * BUCKET, (PEAK - BASE) * DT) + 1
    assert host.saves - before == 20                      # every sample moved more than 1 %: at most once each


def test_a_slow_drain_saves_once_per_percent(tmp_path: Path) -> None:
    """1.1 x the baseline: 1 % of this bucket every 13.6 s; at most that is ever unsaved."""
    host = Host(tmp_path, save_interval=3600.0)
    agent = host.agent()
    host.sample(agent)
    host.sample(agent)
    before = host.saves
    for _ in range(int(60 / DT)):
        host.sample(agent, 1.1 * BASE)
        model = agent[0].estimator.buckets["out"].deficit
        assert abs(host.saved_deficit() - model) < SAVE_MOVEMENT_FRACTION * BUCKET
    spent = agent[0].estimator.buckets["out"].deficit / BUCKET
    # each save covers at least 1 % of the bucket, and at most 1 % plus one sample's movement
    per_sample = 0.1 * BASE * DT / BUCKET
    assert spent / (SAVE_MOVEMENT_FRACTION + per_sample) - 1 <= host.saves - before <= spent / SAVE_MOVEMENT_FRACTION


def test_idle_saves_only_on_the_heartbeat(tmp_path: Path) -> None:
    host = Host(tmp_path, save_interval=5.0)
    agent = host.agent()
    host.sample(agent)
    before = host.saves
    for _ in range(int(20 / DT)):                          # 20 s at a full bucket: 4 heartbeats
        host.sample(agent, 0.5 * BASE)
    assert host.saves - before == 4


@pytest.mark.parametrize("down", [0.5, 3.0])
def test_sigkill_mid_drain_restarts_within_a_percent(tmp_path: Path, down: float) -> None:
    """The default save_interval (5 s) is longer than this whole drain: only movement saves it. The traffic
    runs on at the peak while the agent is down; the restart continues where a watcher that never stopped
    would be."""
    host = Host(tmp_path)
    agent = host.agent()
    host.sample(agent)
    for _ in range(25):                                   # idle 5 s
        host.sample(agent)
    for _ in range(7):                                    # 1.4 s at the peak, then SIGKILL
        host.sample(agent, PEAK)
    truth = agent[0].estimator.buckets["out"].deficit + (PEAK - BASE) * down
    host.down(down, PEAK)
    again = host.agent()
    remaining = host.sample(again, PEAK)                  # the first sample restores (and sets baselines)
    assert again[0].restore_note == "restored"
    truth += (PEAK - BASE) * DT
    assert remaining is not None
    assert abs((BUCKET - remaining) - truth) <= SAVE_MOVEMENT_FRACTION * BUCKET


def test_the_gap_ends_when_the_counters_were_read_not_when_the_step_ran(tmp_path: Path) -> None:
    """The first sample after a start takes 0.1-0.2 s before its credit stage runs (first netlink calls):
    that time is not refill time, or a restart mid-drain comes back optimistic (1.7 % of the lab's bucket)."""
    host = Host(tmp_path)
    agent = host.agent()
    host.sample(agent)
    for _ in range(5):
        host.sample(agent, PEAK)
    truth = agent[0].estimator.buckets["out"].deficit + (PEAK - BASE) * (1.0 + DT)
    host.down(1.0, PEAK)
    again = host.agent()
    remaining = host.sample(again, PEAK, slow=0.3)
    assert remaining is not None
    assert BUCKET - remaining == pytest.approx(truth, abs=1e-3 * BUCKET)


def test_the_gap_errs_towards_fewer_credits_when_the_timing_is_unknown(tmp_path: Path) -> None:
    host = Host(tmp_path)
    agent = host.agent()
    host.sample(agent)
    host.sample(agent)
    # down for 30 s at a full bucket; a 2 s burst at the peak right before the restart
    host.down(28.0)
    host.down(2.0, PEAK)
    again = host.agent()
    remaining = host.sample(again)
    assert remaining is not None
    # (the restoring sample only sets the counters' baseline: no interval of its own yet)
    assert BUCKET - remaining == pytest.approx(2 * (PEAK - BASE), rel=0.01)   # spent, not refilled
    # the same bytes at the start of the gap: the bucket has refilled since, but the accounting cannot tell
    host2 = Host(tmp_path / "b")
    agent = host2.agent()
    host2.sample(agent)
    host2.sample(agent)
    host2.down(2.0, PEAK)
    host2.down(28.0)
    again = host2.agent()
    remaining2 = host2.sample(again)
    assert remaining2 == pytest.approx(remaining)          # fewer credits than the truth (full), never more


def test_a_new_boot_starts_full(tmp_path: Path) -> None:
    host = Host(tmp_path)
    agent = host.agent()
    host.sample(agent)
    for _ in range(10):
        host.sample(agent, PEAK)
    (tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text("boot-2\n")
    again = host.agent()
    assert host.sample(again) == BUCKET and again[0].restore_note == "new_boot"
