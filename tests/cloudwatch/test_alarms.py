"""`burstwatch cloudwatch alarms`: printed, created as printed on moto, on metrics that exist, and in docs."""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from agent.cloudwatch.alarms import (
    ALARMS,
    alarm_params,
    alarm_period,
    cloudformation,
    cmd_cloudwatch,
)
from agent.commands.cloudwatch import add_arguments
from agent.models.shaping import ShapingReading
from tests.cloudwatch.test_publisher import (  # _publishers_end_with_their_test is an autouse fixture
    IID,
    ITYPE,
    _publishers_end_with_their_test,  # noqa: F401
    cw_client,
    make_publisher,
    reading,
    snapshot,
)

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "arn:aws:sns:us-east-1:123456789012:burst-alerts"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="burstwatch cloudwatch")
    add_arguments(p)
    return p.parse_args(argv)


def write_config(tmp_path: Path, endpoint: str, extra: str = "") -> Path:
    cfg = tmp_path / "burstwatch.toml"
    cfg.write_text(f'[cloudwatch]\nenabled = true\nregion = "us-east-1"\nendpoint_url = "{endpoint}"\n{extra}')
    return cfg


def test_alarms_are_created_as_printed(moto: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, moto, 'dimensions = { Environment = "prod" }\nper_instance = "always"\n')
    args = parse(["alarms", "--config", str(cfg), "--json", "--apply", "--instance-id", IID,
                  "--instance-type", ITYPE, "--autoscaling-group", "web-asg", "--sns-topic", TOPIC])
    assert cmd_cloudwatch(args) == 0
    everything = json.loads(capsys.readouterr().out)
    assert len(everything) == len(ALARMS) * 2 * 2 == 12       # per group, and per instance as configured
    printed = [a for a in everything if a["AlarmName"].startswith(f"burstwatch-{IID}-")]
    group = {a["AlarmName"]: a for a in everything if a["AlarmName"].startswith("burstwatch-web-asg-")}
    assert len(printed) == len(group) == 6
    # The group's: its worst instance, on the metrics without InstanceId.
    g = group["burstwatch-web-asg-credit-exhaustion-out"]
    assert {q["MetricStat"]["Stat"] for q in g["Metrics"] if "MetricStat" in q} == {"Minimum"}
    assert {tuple((d["Name"], d["Value"]) for d in q["MetricStat"]["Metric"]["Dimensions"])
            for q in g["Metrics"] if "MetricStat" in q} == {(("AutoScalingGroupName", "web-asg"), ("Direction", "out"))}
    assert group["burstwatch-web-asg-shaping-in"]["Statistic"] == "Sum"

    described = {a["AlarmName"]: a for a in
                 cw_client(moto).describe_alarms(AlarmNamePrefix=f"burstwatch-{IID}-")["MetricAlarms"]}
    assert sorted(described) == sorted(a["AlarmName"] for a in printed)
    for want in printed:
        got = described[want["AlarmName"]]
        for key, value in want.items():
            assert got[key] == value, (want["AlarmName"], key)
    exhaustion_in = described[f"burstwatch-{IID}-credit-exhaustion-in"]
    # the sooner of the instant and the trend forecast: metric math over both, as BurstCreditsRunningOut
    queries = {q["Id"]: q for q in exhaustion_in["Metrics"]}
    assert {i: q["MetricStat"]["Metric"]["MetricName"] for i, q in queries.items() if "MetricStat" in q} == {
        "instant": "CreditExhaustionSeconds", "trend": "CreditExhaustionTrendSeconds"}
    assert {q["MetricStat"]["Stat"] for q in queries.values() if "MetricStat" in q} == {"Maximum"}  # for: 1m
    assert [q["Expression"] for q in queries.values() if q["ReturnData"]] == ["MIN([instant, trend])"]
    assert (exhaustion_in["Threshold"], exhaustion_in["ComparisonOperator"]) == (600.0, "LessThanThreshold")
    low = described[f"burstwatch-{IID}-credit-low-out"]
    assert (low["MetricName"], low["Threshold"]) == ("CreditRemainingRatio", 0.2)
    shaping = described[f"burstwatch-{IID}-shaping-in"]
    assert (shaping["MetricName"], shaping["Statistic"], shaping["ComparisonOperator"], shaping["Threshold"],
            shaping["TreatMissingData"]) == ("ShapingEvents", "Sum", "GreaterThanThreshold", 0.0, "notBreaching")
    for q in queries.values():
        if "MetricStat" in q:
            assert q["MetricStat"]["Metric"]["Dimensions"] == [
                {"Name": "InstanceId", "Value": IID}, {"Name": "InstanceType", "Value": ITYPE},
                {"Name": "AutoScalingGroupName", "Value": "web-asg"}, {"Name": "Environment", "Value": "prod"},
                {"Name": "Direction", "Value": "in"}]
            assert q["MetricStat"]["Period"] == 60
    assert low["Dimensions"][-1] == {"Name": "Direction", "Value": "out"}
    assert exhaustion_in["AlarmActions"] == exhaustion_in["OKActions"] == [TOPIC]


def test_alarms_watch_the_metrics_the_publisher_sends(moto: str) -> None:
    """CloudWatch matches an alarm's dimensions exactly: each alarm must name a published metric."""
    pub = make_publisher(moto, dimensions={"Environment": "prod"}, autoscaling_group="web-asg")
    pub.start()
    base = math.floor(time.time() / 60) * 60 - 120
    credits = {d: reading(d, 0.1, 300.0, 1e9) for d in ("in", "out")}
    pub.observe(snapshot(base, credits, {"in": 1e9, "out": 1e9}, ShapingReading("ethtool", {}, {"in": 0, "out": 0})))
    pub.observe(snapshot(base + 1, credits, {"in": 1e9, "out": 1e9},
                         ShapingReading("ethtool", {"in": 5, "out": 9}, {"in": 5, "out": 9})))
    pub.stop(1.5)
    listed = {(m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"]))
              for m in cw_client(moto).list_metrics(Namespace="Burstwatch")["Metrics"]}
    watched = 0
    for a in alarm_params("Burstwatch", pub.dims, 60, IID):
        metrics = [q["MetricStat"]["Metric"] for q in a.get("Metrics", []) if "MetricStat" in q] or [a]
        for m in metrics:
            assert (m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"])) in listed, \
                (a["AlarmName"], m["MetricName"])
            watched += 1
    assert watched == 8          # the exhaustion alarms read two metrics each


def test_text_output_without_apply_creates_nothing(moto: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, moto, "period = 1\n")
    imds = {"meta-data/instance-id": IID, "meta-data/instance-type": ITYPE,
            "meta-data/placement/region": "us-east-1", "meta-data/tags/instance": "Name"}
    assert cmd_cloudwatch(parse(["alarms", "--config", str(cfg)]), imds_get=imds.get) == 0
    out = capsys.readouterr().out
    # The defaults: per group, here the instance type (no Auto Scaling group); no per-instance alarms.
    assert "burstwatch-m5.large-credit-exhaustion-in" in out and IID not in out
    assert ("MIN([Minimum(Burstwatch/CreditExhaustionSeconds), Minimum(Burstwatch/CreditExhaustionTrendSeconds)])"
            " < 600 over 60s") in out                                            # 1 s data, 60 s alarms
    assert "Minimum(Burstwatch/CreditRemainingRatio) < 0.2" in out
    assert "Sum(Burstwatch/ShapingEvents) > 0" in out
    assert "AutoScalingGroupName" not in out         # IMDS tags are visible and name no group
    assert cw_client(moto).describe_alarms()["MetricAlarms"] == []


def test_no_instance_means_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:9")
    assert cmd_cloudwatch(parse(["alarms", "--config", str(cfg)])) == 2
    assert "--instance-id" in capsys.readouterr().err


def test_alarm_periods() -> None:
    assert [alarm_period(p) for p in (1, 10, 60, 90, 300)] == [60, 60, 60, 120, 300]


def test_cloudformation_template_matches_the_api_alarms() -> None:
    tpl = json.loads(cloudformation("Burstwatch", 60, {"Environment": "prod"}))
    resources = tpl["Resources"]
    api = {a["AlarmName"].replace(f"burstwatch-{IID}-", ""): a
           for a in alarm_params("Burstwatch", (("InstanceId", IID), ("InstanceType", ITYPE),
                                                ("Environment", "prod")), 60, IID)}
    assert len(resources) == len(api) == 6
    assert set(tpl["Parameters"]) == {"InstanceId", "InstanceType", "AutoScalingGroupName", "AlarmTopicArn"}
    for res in resources.values():
        assert res["Type"] == "AWS::CloudWatch::Alarm"
        p = res["Properties"]
        slug = p["AlarmName"]["Fn::Sub"].replace("burstwatch-${InstanceId}-", "")
        want = api[slug]
        condition = set(want) - {"AlarmName", "ActionsEnabled", "AlarmActions", "OKActions"}
        assert set(p) - {"AlarmName", "AlarmActions", "OKActions"} == condition, slug
        for key in condition - {"Dimensions", "Metrics"}:
            assert p[key] == want[key], (slug, key)
        if "Metrics" in want:
            assert len(p["Metrics"]) == len(want["Metrics"])
            pairs = []
            for got_q, want_q in zip(p["Metrics"], want["Metrics"]):
                if "MetricStat" in want_q:
                    pairs.append((got_q["MetricStat"]["Metric"].pop("Dimensions"),
                                  want_q["MetricStat"]["Metric"].pop("Dimensions")))
                assert got_q == want_q, slug
        else:
            pairs = [(p["Dimensions"], want["Dimensions"])]
        for dims, want_dims in pairs:
            assert dims[0] == {"Name": "InstanceId", "Value": {"Ref": "InstanceId"}}
            assert dims[1] == {"Name": "InstanceType", "Value": {"Ref": "InstanceType"}}
            assert dims[2]["Fn::If"][0] == "HasGroup"
            assert dims[3:] == want_dims[2:]   # the extra dimensions, then Direction
        assert p["AlarmActions"] == {"Fn::If": ["HasTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    # every Ref names a parameter or a pseudo parameter, every condition exists
    refs = set(re.findall(r'"Ref": "([^"]+)"', json.dumps(tpl)))
    assert refs <= set(tpl["Parameters"]) | {"AWS::NoValue"}
    conds = set(re.findall(r'"Fn::If": \[\s*"([^"]+)"', json.dumps(tpl)))
    assert conds == set(tpl["Conditions"])


def test_docs_carry_the_generated_template() -> None:
    doc = (ROOT / "docs" / "cloudwatch.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", doc, re.S)
    assert cloudformation("Burstwatch", 60, {}) in blocks, \
        "docs/cloudwatch.md is stale: paste `burstwatch cloudwatch alarms --cloudformation`"


def test_cloudformation_flag_prints_the_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:9")
    assert cmd_cloudwatch(parse(["alarms", "--config", str(cfg), "--cloudformation"])) == 0
    assert capsys.readouterr().out == cloudformation("Burstwatch", 60, {})


def test_docs_iam_policy_allows_exactly_put_metric_data_in_the_namespace() -> None:
    from agent.config import CloudWatchConfig

    doc = (ROOT / "docs" / "cloudwatch.md").read_text(encoding="utf-8")
    (policy,) = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", doc, re.S) if "PutMetricData" in b]
    (stmt,) = policy["Statement"]
    assert (stmt["Effect"], stmt["Action"], stmt["Resource"]) == ("Allow", "cloudwatch:PutMetricData", "*")
    assert stmt["Condition"] == {"StringEquals": {"cloudwatch:namespace": CloudWatchConfig().namespace}}


# -- what the exhaustion alarm means, on simulated EC2 traffic ----------------------------------------------

def _alarm_minutes(samples: list, spec_slug: str = "credit-exhaustion") -> list[bool]:
    """Evaluate the alarm as CloudWatch does on what the publisher would send: per 60 s period, each query's
    statistic over that minute's samples (capped like the publisher), then the expression, then the
    threshold. One verdict per minute."""
    from agent.models.figures import EXHAUSTION_CAP_SECONDS

    spec = next(s for s in ALARMS if s.slug == spec_slug)
    attr = {"CreditExhaustionSeconds": "exhaustion_seconds", "CreditExhaustionTrendSeconds": "exhaustion_trend_seconds"}
    stat = {"Maximum": max, "Minimum": min}[spec.statistic]
    minutes: dict[int, list] = {}
    for s in samples:
        minutes.setdefault(int((s.t - 1e-9) // 60), []).append(s)
    out = []
    for _, group in sorted(minutes.items()):
        values = {qid: stat(min(getattr(s.reading, attr[metric]), EXHAUSTION_CAP_SECONDS) for s in group)
                  for qid, metric in spec.math}
        assert spec.expression == "MIN([instant, trend])"
        out.append(min(values.values()) < spec.threshold)
    return out


def _r4_large() -> Any:
    from agent.models.credit_model import CreditEstimator
    from tests.models.credit_world import Shaper, World

    gbit = 1e9 / 8
    return World(CreditEstimator(0.75 * gbit, 2700 * gbit, forecast_window=60.0),
                 Shaper(0.75 * gbit, 10 * gbit, 2700 * gbit), sample_interval=1.0, rate_window=1.0, fine=0.05)


@pytest.mark.parametrize("on, off", [(1, 0), (10, 10), (30, 20)])
def test_the_exhaustion_alarm_fires_before_empty_for_steady_and_bursty_drains(on: float, off: float) -> None:
    from tests.models.credit_world import idle, on_off, steady

    w = _r4_large()
    w.run(idle(), 120)
    samples, empty = w.run_until_empty(steady(20e9 / 8) if not off else on_off(20e9 / 8, on, off), 3600)
    verdicts = _alarm_minutes(w.samples)
    fired = [m for m, v in enumerate(verdicts) if v]
    assert fired and fired[0] * 60 + 60 <= empty - 60, (fired, empty)      # a minute's warning at least


@pytest.mark.parametrize("burst, every", [(5, 120), (30, 600), (1, 20)])
def test_the_exhaustion_alarm_stays_quiet_for_bursts_averaging_under_the_baseline(burst: float, every: float) -> None:
    """Bursts at the peak (10 Gbit/s) averaging 0.42, 0.5 and 0.5 Gbit/s, under r4.large's 0.75. The instant
    forecast's Minimum (the alarm before issue 12) paged on the first burst; each forecast's Maximum over
    the minute is the rule's `for: 1m`."""
    from tests.models.credit_world import idle, on_off

    assert burst * 10 / every < 0.75
    w = _r4_large()
    w.run(idle(), 120)
    w.run(on_off(20e9 / 8, burst, every - burst), 1800)
    assert min(s.reading.ratio or 0 for s in w.samples) > 0.5
    assert not any(_alarm_minutes(w.samples))
    # the instant forecast alone, read as its Minimum, would have paged on the first burst
    assert any(s.reading.exhaustion_seconds < 600 for s in w.samples)


def test_group_alarms_watch_the_metrics_the_publisher_sends(moto: str) -> None:
    """With the defaults (per group, per instance when draining) the group alarms name published metrics."""
    pub = make_publisher(moto, autoscaling_group="web-asg", per_instance="when_draining",
                         aggregation_dimensions=None)
    pub.start()
    base = math.floor(time.time() / 60) * 60 - 120
    credits = {d: reading(d, 0.9, 1e6, 1e9) for d in ("in", "out")}
    pub.observe(snapshot(base, credits, {"in": 1e9, "out": 1e9}, ShapingReading("ethtool", {}, {"in": 0, "out": 0})))
    pub.observe(snapshot(base + 1, credits, {"in": 1e9, "out": 1e9},
                         ShapingReading("ethtool", {"in": 0, "out": 0}, {"in": 0, "out": 0})))
    pub.stop(1.5)
    listed = {(m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"]))
              for m in cw_client(moto).list_metrics(Namespace="Burstwatch")["Metrics"]}
    assert not [m for m in listed if "InstanceId" in dict(m[1])]     # no alarm held: nothing per instance
    watched = 0
    for a in alarm_params("Burstwatch", (("AutoScalingGroupName", "web-asg"),), 60, "web-asg", group=True):
        for m in [q["MetricStat"]["Metric"] for q in a.get("Metrics", []) if "MetricStat" in q] or [a]:
            assert (m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"])) in listed
            watched += 1
    assert watched == 8
