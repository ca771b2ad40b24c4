"""`burstwatch replay` end to end on traces a true token bucket shaped: the summary, --json, the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main
from agent.commands.replay import new_estimator
from agent.config import CreditsConfig
from agent.models.profile import BandwidthProfile
from agent.sampling.credits import CreditsStep
from tests.support.replay_traces import GBIT, Phase, Trace, TrueBucket, on_off, steady, write_trace

R4L = dict(baseline=0.75 * GBIT, peak=10 * GBIT)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["replay", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def drain_trace(tmp_path: Path, bucket_gbit: float = 2700.0, shaped: bool = True) -> tuple[Path, Trace]:
    trace = Trace(TrueBucket(bucket=bucket_gbit * GBIT, **R4L),
                  [Phase("idle", steady(0.1 * GBIT), 300), Phase("drain", steady(5 * GBIT), 1200, drain=True),
                   Phase("rest", steady(0.1 * GBIT), 600)])
    return write_trace(tmp_path / "drain.csv", trace, shaped), trace


def test_a_drain_that_empties_the_bucket_is_shaped_paged_and_sized(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path, trace = drain_trace(tmp_path)
    doc = run_json(capsys, str(path), "--type", "r4.large", "--type", "r4.4xlarge")
    large, xl4 = doc["types"]
    empty = trace.drains[0].empty
    assert empty is not None and large["bucket_source"] == "default"
    out = large["directions"]["out"]
    # the bucket equals the belief: the model empties within a sample or two of the true bucket
    assert abs(out["first_shaped"] - empty) <= 2, (out, empty)
    # shaped from the empty moment to the drain's end (the drain stops at 300 + 1200 s)
    assert abs(out["shaped_seconds"] - (trace.drains[0].stop - empty)) <= 5, out
    assert out["lowest_ratio"] == 0.0
    page = out["pages"]["BurstCreditsRunningOut"]
    assert page["count"] == 1 and empty - page["first"] >= 60, (page, empty)
    assert out["pages"]["BurstCreditsLow"]["count"] == 1
    assert large["directions"]["in"]["pages"]["BurstCreditsRunningOut"]["count"] == 0
    # r4.4xlarge's baseline (5 Gbit/s) covers a 5-Gbit/s demand: never shaped, never paged
    xo = xl4["directions"]["out"]
    assert xo["shaped_seconds"] == 0 and xo["pages"]["BurstCreditsRunningOut"]["count"] == 0
    assert large["fit"]["smallest_size"] == "r4.2xlarge"     # 1800 s at 5 Gbit/s, mean under 2.5: its bucket holds it
    assert main(["replay", str(path), "--type", "r4.large"]) == 0
    text = capsys.readouterr().out
    assert "r4.large" in text and "1/1" in text and "r4.2xlarge" in text


def test_traffic_under_the_baseline_never_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = Trace(TrueBucket(bucket=2700 * GBIT, **R4L), [Phase("bursty", on_off(6 * GBIT, 10, 110), 7200)])
    doc = run_json(capsys, str(write_trace(tmp_path / "q.csv", trace)), "--type", "r4.large")
    out = doc["types"][0]["directions"]["out"]
    assert out["shaped_seconds"] == 0 and out["lowest_ratio"] > 0.9
    assert out["pages"]["BurstCreditsRunningOut"]["count"] == 0 and out["pages"]["BurstCreditsLow"]["count"] == 0
    assert doc["types"][0]["fit"]["smallest_size"] == "r4.large"


def test_bucket_gbit_overrides_the_belief_and_no_shaping_columns_still_empty(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, trace = drain_trace(tmp_path, bucket_gbit=1350.0, shaped=False)
    doc = run_json(capsys, str(path), "--type", "r4.large", "--bucket-gbit", "1350")
    t = doc["types"][0]
    assert t["bucket_source"] == "config" and t["bucket_bytes"] == 1350 * GBIT
    out = t["directions"]["out"]
    empty = trace.drains[0].empty
    assert empty is not None and abs(out["first_shaped"] - empty) <= 2     # "empty" without a shaping signal
    # the default belief (2700 Gbit) on the same trace: it never sees the bucket empty, nothing says it did
    doc = run_json(capsys, str(path), "--type", "r4.large")
    assert doc["types"][0]["directions"]["out"]["lowest_ratio"] > 0.3


@pytest.mark.parametrize("argv,message", [
    (["--type", "r4.large"], "give a TRACE.csv"),
    (["BAD", "--type", "r4.large"], "row 3, column 'out_bytes': 'lots'"),
    (["BAD", "--type", "x9.nothing"], "unknown instance type 'x9.nothing'"),
    (["BAD", "--type", "r4.large", "--type", "m5.large", "--openmetrics", "o.om"], "--openmetrics takes one"),
    (["BAD", "--type", "r4.large", "--bucket-gbit", "-1"], "--bucket-gbit -1"),
    (["GOOD", "--type", "r4.large", "--openmetrics", "/nonexistent/dir/o.om"], "cannot write there"),
])
def test_bad_input_exits_2_naming_what(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                       message: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,in_bytes,out_bytes\n1,0,0\n2,0,lots\n")
    good = tmp_path / "good.csv"
    good.write_text("timestamp,in_bytes,out_bytes\n1,0,0\n2,0,0\n")
    argv = [str(bad) if a == "BAD" else str(good) if a == "GOOD" else str(tmp_path / a) if a == "o.om" else a
            for a in argv]
    assert main(["replay", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.om").exists()


def test_60_s_300_s_and_irregular_intervals_replay_the_same_drain(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The 1-s drain summed into coarser rows: the bytes are the same, the empty moment is known to a row."""
    fine, trace = drain_trace(tmp_path)
    empty = trace.drains[0].empty
    assert empty is not None
    lines = fine.read_text().splitlines()[1:]
    for name, widths in (("60", [60]), ("300", [300]), ("irregular", [1, 7, 60, 13, 300, 2])):
        out, k, i = ["timestamp,in_bytes,out_bytes,in_shaped,out_shaped"], 0, 0
        while i < len(lines):
            chunk = [c.split(",") for c in lines[i:i + widths[k % len(widths)]]]
            sums = [sum(float(c[j]) for c in chunk) for j in (1, 2, 3, 4)]
            out.append(f"{chunk[-1][0]},{sums[0]:.0f},{sums[1]:.0f},{sums[2]:.0f},{sums[3]:.0f}")
            i += len(chunk)
            k += 1
        path = tmp_path / f"{name}.csv"
        path.write_text("\n".join(out) + "\n")
        o = run_json(capsys, str(path), "--type", "r4.large")["types"][0]["directions"]["out"]
        row = max(widths)
        assert o["first_shaped"] is not None and -2 <= o["first_shaped"] - empty <= row + 2, (name, o, empty)
        assert o["first_shaping_signal"] is not None and o["lowest_ratio"] == 0.0, name
        assert o["pages"]["BurstCreditsRunningOut"]["count"] >= 1, name
        assert o["pages"]["BurstCreditsRunningOut"]["first"] < empty, name


@pytest.mark.parametrize("source", ["default", "config"])
@pytest.mark.parametrize("cfg", [CreditsConfig(), CreditsConfig(learn=False, forecast_window=30.0),
                                 CreditsConfig(trust_configured_bucket=False)],
                         ids=["defaults", "no-learn", "untrusted"])
def test_replay_builds_the_estimator_the_daemon_builds_on_a_fresh_state_directory(
        tmp_path: Path, source: str, cfg: CreditsConfig) -> None:
    """The same prior band, bucket, learning and window as agent/sampling/credits.py's step, sample after sample."""
    profile = BandwidthProfile("r4.large", 0.75 * GBIT, 10 * GBIT, 2700 * GBIT, "catalogue", "catalogue", source)
    daemon = CreditsStep(profile, str(tmp_path), cfg, procfs=str(tmp_path)).estimator
    mine = new_estimator(profile, cfg)
    assert mine.learn == daemon.learn and mine.forecast_window == daemon.forecast_window == cfg.forecast_window
    assert mine.to_state() == daemon.to_state()
    for k in range(400):
        rate = 4 * GBIT if 60 <= k < 380 else 0.1 * GBIT
        a = mine.update(1.0, {"in": 0.0, "out": rate}, {"in": 0.0, "out": rate}, {"in": 0, "out": 0})
        b = daemon.update(1.0, {"in": 0.0, "out": rate}, {"in": 0.0, "out": rate}, {"in": 0, "out": 0})
        assert a == b, k
    assert a["out"].exhaustion_earliest_seconds < a["out"].exhaustion_latest_seconds
