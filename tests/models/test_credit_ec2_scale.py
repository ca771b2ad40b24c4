"""The trend forecast at EC2's own scale: r4 figures, 1-s samples, every default untouched (docs/credits.md,
"The window rule"). A few shapes of tests/support/credit_ec2.py's grid; `make bench BENCH=ec2` runs them all
and writes the table into docs/credits.md, which the last test regenerates and compares."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.config import CreditsConfig
from agent.models.counters import CounterTracker
from agent.models.profile import BandwidthProfile
from agent.readers.netdev import NetDevCounters
from agent.sampling.credits import CreditsStep
from agent.writers.credit_store import STATE_BUDGET_BYTES
from tests.support import credit_ec2 as ce

LARGE, XLARGE = ce.SIZES                               # r4.large, r4.2xlarge
DOC = Path(__file__).resolve().parents[2] / "docs" / "credits.md"


def test_a_30_s_on_30_s_off_drain_reads_right_now() -> None:
    """30 s at the peak, 30 s idle on an r4.large: a fixed 60-s window spans one cycle and swings with its
    phase (54 % of the samples within the tolerance); four cycles of it read right."""
    now = ce.cycle(LARGE, 60.0, 0.5)
    with ce.fixed_window():
        before = ce.cycle(LARGE, 60.0, 0.5)
    assert before.trend_hit is not None and before.trend_hit < 0.6
    assert now.trend_hit is not None and now.trend_hit >= 0.95, now.row()
    assert now.alert_lead is not None and now.alert_lead >= ce.ALERT_LEAD


@pytest.mark.parametrize("size,period,duty", [
    (LARGE, 2.0, 0.5), (LARGE, 10.0, 0.25), (LARGE, 120.0, 0.5),
    (XLARGE, 30.0, 0.8), (XLARGE, 300.0, 0.4),
])
def test_on_off_drains_from_2_to_300_s_cycles(size: ce.Size, period: float, duty: float) -> None:
    res = ce.cycle(size, period, duty)
    assert res.trend_hit is not None and res.trend_hit >= ce.HIT_TARGET, res.row()
    assert res.alert_lead is not None and res.alert_lead >= ce.ALERT_LEAD, res.row()


def test_a_cycle_as_long_as_the_drain_is_read_right_from_its_second_onset() -> None:
    """150 s at the peak, 150 s idle on an r4.large empties 16 s into its third burst (616 s). Until the
    second onset (300 s) no forecast that sees only the past can know of a pause it has not seen: the band
    holds the empty moment then (tests/models/test_credit_band.py). From the second onset the trend replays
    the last cycle's own rise: within the tolerance in every sample there, where the line's slope over a
    part-cycle window (a third fast) had it in 69 % (issue 28). The alert fires well ahead."""
    res = ce.cycle(LARGE, 300.0, 0.5)
    assert res.drain is not None and 600 < res.drain < 630
    after_second_onset = (res.drain - 300.0) / (res.drain * (1 - ce.FIRST_FIFTH))
    assert res.trend_hit is not None and res.trend_hit >= after_second_onset, res.row()
    assert res.alert_lead is not None and res.alert_lead >= 5 * ce.ALERT_LEAD, res.row()


@pytest.mark.parametrize("size,on,off", [
    (LARGE, 1.0, 1.0), (LARGE, 15.0, 15.0), (LARGE, 60.0, 60.0), (LARGE, 150.0, 150.0), (LARGE, 225.0, 75.0),
    (LARGE, 30.0, 90.0), (XLARGE, 150.0, 150.0), (XLARGE, 225.0, 75.0),
])
def test_the_trend_after_a_cycles_second_onset(size: ce.Size, on: float, off: float) -> None:
    """Where the true bucket equals the belief, the trend within max(60 s, 20 %) in >= 80 % of the samples
    after the cycle's second onset, for cycles from 2 s to 300 s (issue 28)."""
    from tests.support import credit_band_zoo as zoo

    res = zoo.drain(size, ce.on_off(size.peak, on, off), f"{on:g}/{off:g}", 1.0, cyclic=True)
    assert res.point is not None and res.point >= zoo.POINT_TARGET, res.row()


def test_a_drain_from_a_half_refilled_bucket() -> None:
    res = ce.refilled(LARGE, 1800.0)
    assert res.trend_hit is not None and res.trend_hit >= ce.HIT_TARGET, res.row()
    assert res.alert_lead is not None and res.alert_lead >= ce.ALERT_LEAD, res.row()


def test_a_slow_ramp_is_late_but_pages_in_time() -> None:
    """Both forecasts read the pace they see; an accelerating drain empties sooner than either says. The
    instant forecast under the horizon still pages minutes ahead."""
    res = ce.slow_ramp(LARGE)
    assert res.trend_err is not None and res.trend_err > 0
    assert res.alert_lead is not None and res.alert_lead >= 5 * ce.ALERT_LEAD, res.row()


@pytest.mark.parametrize("period,average", [(60.0, 0.9), (300.0, 0.9)])
def test_traffic_under_the_baseline_never_pages(period: float, average: float) -> None:
    res = ce.under_baseline(LARGE, period, average, seconds=3600.0)
    assert res.false_alarms == 0, res.row()


def test_after_a_sigkill_the_trend_is_right_from_the_first_sample() -> None:
    """The trend's history is saved with the deficit and continued across the gap (whose net spend the
    counters give exactly): within the tolerance from the restart's first sample, where it used to start
    from nothing."""
    res = ce.restart_drain(LARGE, 60.0, 0.5)
    assert res.restart_first_ok and res.restart_hit is not None and res.restart_hit >= ce.HIT_TARGET, res.row()
    with ce.fixed_window():
        before = ce.restart_drain(LARGE, 60.0, 0.5)
    # without the history, the first forecast after the restart said "never" and a quarter stayed off
    assert not before.restart_first_ok and before.restart_hit is not None and before.restart_hit < ce.HIT_TARGET


def _tracker(tmp_path: Path, now: list[float]) -> CreditsStep:
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    profile = BandwidthProfile("r4.large", LARGE.baseline, LARGE.peak, LARGE.bucket, "config", "config", "config")
    return CreditsStep(profile, str(tmp_path / "state"), CreditsConfig(), procfs=str(tmp_path / "proc"),
                         clock=lambda: now[0], sample_clock=lambda: now[0])


def test_the_state_file_keeps_the_trend_within_its_budget(tmp_path: Path) -> None:
    """Both directions on cyclic drains for an hour: credits.json stays within one 4-KiB block, and a
    restarted agent reads the trend from its first sample."""
    now = [1000.0]
    ct, counters = _tracker(tmp_path, now), CounterTracker(1.0)
    rx = tx = 10**9

    def sample(tracker: CreditsStep, meter: CounterTracker) -> dict:
        deltas = meter.update(now[0], {"eth0": (2, NetDevCounters(rx, 0, 0, 0, tx, 0, 0, 0))})
        return tracker.run(now[0], deltas, meter, None) or {}

    demand = ce.on_off(LARGE.peak, 20.0, 40.0)           # both directions drain: out at 1/3 x peak, in at 1/4
    for k in range(3600):
        now[0] += 1.0
        sent = sum(h * r for h, r in demand(float(k), k + 1.0))
        tx, rx = tx + int(sent / 3), rx + int(sent / 4)
        readings = sample(ct, counters)
    path = tmp_path / "state" / "credits.json"
    assert 0 < path.stat().st_size <= STATE_BUDGET_BYTES
    saved = json.loads(path.read_text())["directions"]["out"]["trend"]
    assert len(saved["points"].split()) > 40
    # SIGKILL after the last save, a restart 5 s later with the traffic paused meanwhile
    before = readings["out"].exhaustion_trend_seconds
    assert 600 < before < 7200
    now[0] += 5.0
    ct2, counters2 = _tracker(tmp_path, now), CounterTracker(1.0)
    after = sample(ct2, counters2)
    assert ct2.restore_note == "restored"
    assert after["out"].exhaustion_trend_seconds == pytest.approx(before - 5.0, abs=max(60.0, 0.2 * before))


def test_a_damaged_trend_in_the_state_file_starts_it_afresh(tmp_path: Path) -> None:
    from agent.models.credit_trend import TrendForecast

    for bad in ({"points": "1:2 oops"}, {"points": "0:0 5:1"}, {"points": 3}, {}, None, "x"):
        f = TrendForecast(60.0)
        assert f.restore(bad, 10.0, 1e9, LARGE.baseline) is False
        assert len(f.trend) == 0


@pytest.mark.slow
def test_the_docs_table_is_the_grids() -> None:
    """docs/credits.md's EC2-scale table is what `make bench BENCH=ec2` generates (the sims are
    deterministic; about 15 s of CPU)."""
    from tests.bench import EC2_BEGIN, EC2_END

    text = DOC.read_text()
    region = text.split(EC2_BEGIN, 1)[1].split(EC2_END, 1)[0].strip()
    assert region == ce.region(ce.grid()).strip(), "docs/credits.md is out of date: run make bench BENCH=ec2"
    assert re.search(r"\| r4\.large \| 30 s at peak / 30 s idle \|", region)
