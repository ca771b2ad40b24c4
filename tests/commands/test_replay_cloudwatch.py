"""`burstwatch replay --cloudwatch` against moto in server mode over HTTP: datapoints put with PutMetricData
into AWS/EC2, read back through GetMetricData at 1 min (detailed) or 5 min (basic), then replayed."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from agent import aws
from agent.cli import main

G = 1e9 / 8
T0 = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)


def put(moto: str, instance: str, metric: str, points: list[tuple[float, float]]) -> None:
    cw = aws.client("cloudwatch", "us-east-1", moto)
    data: list[dict[str, Any]] = [{"MetricName": metric, "Dimensions": [{"Name": "InstanceId", "Value": instance}],
                                   "Timestamp": T0 + dt.timedelta(seconds=s), "Value": v, "Unit": "Bytes"}
                                  for s, v in points]
    for k in range(0, len(data), 500):
        cw.put_metric_data(Namespace="AWS/EC2", MetricData=data[k:k + 500])


def config(tmp_path: Path, moto: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(f'[cloudwatch]\nregion = "us-east-1"\nendpoint_url = "{moto}"\n')
    return str(path)


def test_detailed_monitoring_minutes_replay_a_drain_that_empties_r4_large(
        moto: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2 h: 20 min idle, 40 min at 2 Gbit/s (1.25 Gbit/s over the baseline: 2700 Gbit last 36 min), 60 min idle
    rates = [0.05] * 20 + [2.0] * 40 + [0.05] * 60
    put(moto, "i-0abc", "NetworkOut", [(60 * k + 7, r * G * 60) for k, r in enumerate(rates)])
    put(moto, "i-0abc", "NetworkIn", [(60 * k + 7, 1e6) for k in range(len(rates))])
    end = T0 + dt.timedelta(hours=2)
    assert main(["replay", "--cloudwatch", "i-0abc", "--start", T0.isoformat(), "--end", end.isoformat(),
                 "--type", "r4.large", "--config", config(tmp_path, moto), "--json"]) == 0
    captured = capsys.readouterr()
    assert "120 periods of 60 s" in captured.err and "detailed monitoring" in captured.err
    t = json.loads(captured.out)["types"][0]
    assert t["seconds"] == 7200
    out = t["directions"]["out"]
    # empty after 2700 / 1.25 = 2160 s of the drain, which starts at minute 20: within a period of it
    empty = T0.timestamp() + 20 * 60 + 2160
    assert out["first_shaped"] is not None and abs(out["first_shaped"] - empty) <= 60, (out, empty)
    assert out["pages"]["BurstCreditsRunningOut"]["count"] == 1
    assert out["pages"]["BurstCreditsRunningOut"]["first"] <= empty - 60
    assert t["directions"]["in"]["lowest_ratio"] == 1.0


def test_basic_monitoring_is_read_at_5_minutes_and_a_burst_inside_a_period_is_averaged_away(
        moto: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One datapoint per 5 min as EC2's basic monitoring writes it; one 5-min period holds a 40-s burst at
    # 10 Gbit/s (50 GB) that a 1-s trace would show: at 300 s it reads as 1.33 Gbit/s.
    values = [(300 * k + 11, 0.1 * G * 300) for k in range(24)]
    values[6] = (300 * 6 + 11, 10 * G * 40)
    put(moto, "i-0basic", "NetworkOut", values)
    end = T0 + dt.timedelta(hours=2)
    assert main(["replay", "--cloudwatch", "i-0basic", "--start", str(T0.timestamp()), "--end", str(end.timestamp()),
                 "--type", "r4.large", "--config", config(tmp_path, moto), "--json"]) == 0
    captured = capsys.readouterr()
    assert "24 periods of 300 s" in captured.err and "basic monitoring" in captured.err
    t = json.loads(captured.out)["types"][0]
    assert t["seconds"] == 7200
    assert 0.9 < t["directions"]["out"]["lowest_ratio"] < 0.95    # (1.33 - 0.75) x 300 s of 2700 Gbit: 6 % spent


@pytest.mark.parametrize("argv,message", [
    (["--cloudwatch", "i-0none", "--start", "2026-11-20T00:00:00Z", "--end", "2026-11-20T01:00:00Z"],
     "no AWS/EC2 NetworkIn/NetworkOut datapoints for i-0none"),
    (["--cloudwatch", "i-0none", "--start", "2026-11-20T00:00:00Z"], "needs --end"),
    (["--cloudwatch", "i-0none", "--start", "later", "--end", "1"], "--start 'later': not a time"),
    (["--cloudwatch", "i-0none", "--start", "5", "--end", "1"], "--end '1' is not after"),
])
def test_cloudwatch_usage_errors_exit_2(moto: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        argv: list[str], message: str) -> None:
    assert main(["replay", *argv, "--type", "r4.large", "--config", config(tmp_path, moto)]) == 2
    assert message in capsys.readouterr().err
