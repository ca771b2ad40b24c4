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
    alarm_set,
    alarms_command,
    cloudformation,
    cloudformation_template,
    logical_id,
)
from agent.cloudwatch.dimensions import common_dimensions
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
    assert alarms_command(args) == 0
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
    # the sooner of the instant and the trend forecast, or the band's early side weighted to the early
    # horizon: metric math over the three, as BurstCreditsRunningOut
    queries = {q["Id"]: q for q in exhaustion_in["Metrics"]}
    assert {i: q["MetricStat"]["Metric"]["MetricName"] for i, q in queries.items() if "MetricStat" in q} == {
        "instant": "CreditExhaustionSeconds", "trend": "CreditExhaustionTrendSeconds",
        "early": "CreditExhaustionEarliestSeconds"}
    assert {q["MetricStat"]["Stat"] for q in queries.values() if "MetricStat" in q} == {"Maximum"}  # for: 1m
    assert [q["Expression"] for q in queries.values() if q["ReturnData"]] == [
        "MIN([instant, trend, early * 3.333333])"]
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
    assert watched == 10         # the exhaustion alarms read three metrics each


def test_text_output_without_apply_creates_nothing(moto: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, moto, "period = 1\n")
    imds = {"meta-data/instance-id": IID, "meta-data/instance-type": ITYPE,
            "meta-data/placement/region": "us-east-1", "meta-data/tags/instance": "Name"}
    assert alarms_command(parse(["alarms", "--config", str(cfg)]), imds_get=imds.get) == 0
    out = capsys.readouterr().out
    # The defaults: per group, here the instance type (no Auto Scaling group); no per-instance alarms.
    assert "burstwatch-m5.large-credit-exhaustion-in" in out and IID not in out
    assert ("MIN([Minimum(Burstwatch/CreditExhaustionSeconds), Minimum(Burstwatch/CreditExhaustionTrendSeconds), "
            "Minimum(Burstwatch/CreditExhaustionEarliestSeconds) * 3.333333]) < 600 over 60s") in out  # 1 s, 60 s
    assert "Minimum(Burstwatch/CreditRemainingRatio) < 0.2" in out
    assert "Sum(Burstwatch/ShapingEvents) > 0" in out
    assert "AutoScalingGroupName" not in out         # IMDS tags are visible and name no group
    assert cw_client(moto).describe_alarms()["MetricAlarms"] == []


def test_no_instance_means_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:9")
    for fmt in ([], ["--cloudformation"]):        # the template names the instance's group too
        assert alarms_command(parse(["alarms", "--config", str(cfg), *fmt])) == 2
        assert "--instance-id" in capsys.readouterr().err


def test_alarm_periods() -> None:
    assert [alarm_period(p) for p in (1, 10, 60, 90, 300)] == [60, 60, 60, 120, 300]


# -- one selection, three outputs: --json, --apply and --cloudformation -------------------------------------

class _Recorder:
    """A CloudWatch client that keeps what PutMetricAlarm was asked to create."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def put_metric_alarm(self, **params: Any) -> None:
        self.created.append(params)


def _three_outputs(cfg: Path, capsys: pytest.CaptureFixture[str],
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(what --json prints, what --apply creates, the --cloudformation template) for one config."""
    argv = ["alarms", "--config", str(cfg), "--instance-id", IID, "--instance-type", ITYPE,
            "--autoscaling-group", "web-asg", "--sns-topic", TOPIC]
    assert alarms_command(parse([*argv, "--json"])) == 0
    printed = json.loads(capsys.readouterr().out)
    rec = _Recorder()
    assert alarms_command(parse([*argv, "--apply"]), client_factory=lambda *_: rec) == 0
    capsys.readouterr()
    assert alarms_command(parse([*argv, "--cloudformation"])) == 0
    return printed, rec.created, json.loads(capsys.readouterr().out)


def _summary(a: dict[str, Any]) -> tuple[Any, ...]:
    """What an alarm is, whatever wrote it: name, each metric read (namespace, name, dimensions, statistic,
    period), the expression, the threshold and the comparison."""
    if "Metrics" in a:
        reads = tuple((q["MetricStat"]["Metric"]["Namespace"], q["MetricStat"]["Metric"]["MetricName"],
                       tuple((d["Name"], d["Value"]) for d in q["MetricStat"]["Metric"]["Dimensions"]),
                       q["MetricStat"]["Stat"], q["MetricStat"]["Period"]) for q in a["Metrics"] if "MetricStat" in q)
        (expr,) = [q["Expression"] for q in a["Metrics"] if q.get("ReturnData")]
    else:
        reads = ((a["Namespace"], a["MetricName"], tuple((d["Name"], d["Value"]) for d in a["Dimensions"]),
                  a["Statistic"], a["Period"]),)
        expr = ""
    return a["AlarmName"], reads, expr, a["Threshold"], a["ComparisonOperator"], a["EvaluationPeriods"]


# config, then the labels the alarm names carry (per group, then per instance where configured)
SELECTIONS = [
    ("", ["web-asg"]),                                                               # the defaults
    ('dimensions = { Environment = "prod" }\nper_instance = "always"\nalarm_horizon = 12.0\n'
     'aggregation_dimensions = [["AutoScalingGroupName"], ["InstanceType", "Environment"]]\n',
     ["web-asg", "m5.large-prod", IID]),
    ('per_instance = "never"\naggregation_dimensions = [[]]\nperiod = 300\n', ["all"]),
    ('per_instance = "always"\naggregation_dimensions = []\n', [IID]),                  # as before issue 20
]


@pytest.mark.parametrize("extra, labels", SELECTIONS)
def test_json_apply_and_cloudformation_carry_the_same_alarms(
        extra: str, labels: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    printed, created, tpl = _three_outputs(write_config(tmp_path, "http://127.0.0.1:9", extra), capsys)
    templated = [r["Properties"] for r in tpl["Resources"].values()]
    # the same alarms, parameter for parameter, in the same order
    assert printed == created == templated
    assert [_summary(a) for a in printed] == [_summary(a) for a in created] == [_summary(a) for a in templated]
    # the selection: one set (3 alarms x 2 directions) per label, nothing else
    assert [a["AlarmName"] for a in templated] == [
        f"burstwatch-{label}-{spec.slug}-{d}" for label in labels for spec in ALARMS for d in ("in", "out")]
    assert all(a["AlarmActions"] == a["OKActions"] == [TOPIC] for a in templated)


def test_group_alarms_in_the_template_read_the_groups_metrics(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Per group: the metrics without InstanceId, their worst instance; per instance: the instance's own."""
    _, _, tpl = _three_outputs(write_config(tmp_path, "http://127.0.0.1:9", SELECTIONS[1][0]), capsys)
    by_name = {r["Properties"]["AlarmName"]: r["Properties"] for r in tpl["Resources"].values()}
    g = _summary(by_name["burstwatch-web-asg-credit-exhaustion-out"])
    assert g[1:4] == ((("Burstwatch", "CreditExhaustionSeconds", (("AutoScalingGroupName", "web-asg"),
                                                                   ("Direction", "out")), "Minimum", 60),
                       ("Burstwatch", "CreditExhaustionTrendSeconds", (("AutoScalingGroupName", "web-asg"),
                                                                        ("Direction", "out")), "Minimum", 60),
                       ("Burstwatch", "CreditExhaustionEarliestSeconds", (("AutoScalingGroupName", "web-asg"),
                                                                           ("Direction", "out")), "Minimum", 60)),
                      "MIN([instant, trend, early * 3.333333])", 12.0)     # alarm_horizon is the threshold
    t = _summary(by_name["burstwatch-m5.large-prod-credit-low-in"])
    assert t[1] == (("Burstwatch", "CreditRemainingRatio", (("InstanceType", "m5.large"), ("Environment", "prod"),
                                                            ("Direction", "in")), "Minimum", 60),)
    i = _summary(by_name[f"burstwatch-{IID}-credit-exhaustion-in"])
    assert {r[3] for r in i[1]} == {"Maximum"} and all(r[2][0] == ("InstanceId", IID) for r in i[1])


# AWS::CloudWatch::Alarm and its MetricDataQuery, MetricStat and Metric property types (CloudFormation
# resource reference): a key outside these fails the stack.
CFN_ALARM = {"ActionsEnabled", "AlarmActions", "AlarmDescription", "AlarmName", "ComparisonOperator",
             "DatapointsToAlarm", "Dimensions", "EvaluateLowSampleCountPercentile", "EvaluationPeriods",
             "ExtendedStatistic", "InsufficientDataActions", "MetricName", "Metrics", "Namespace", "OKActions",
             "Period", "Statistic", "Tags", "Threshold", "ThresholdMetricId", "TreatMissingData", "Unit"}
CFN_QUERY = {"AccountId", "Expression", "Id", "Label", "MetricStat", "Period", "ReturnData"}
CFN_METRIC_STAT = {"Metric", "Period", "Stat", "Unit"}
CFN_METRIC = {"Dimensions", "MetricName", "Namespace"}
SINGLE_METRIC = {"Namespace", "MetricName", "Dimensions", "Statistic", "Period"}


def test_the_template_is_valid_cloudformation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the template as YAML")
    cfg = write_config(tmp_path, "http://127.0.0.1:9", SELECTIONS[1][0])
    assert alarms_command(parse(["alarms", "--config", str(cfg), "--cloudformation", "--instance-id", IID,
                                 "--instance-type", ITYPE, "--autoscaling-group", "web-asg"])) == 0
    text = capsys.readouterr().out
    tpl = json.loads(text)
    assert yaml.safe_load(text) == tpl                          # JSON, and the same document as YAML
    assert set(tpl) == {"AWSTemplateFormatVersion", "Description", "Resources"}
    assert tpl["AWSTemplateFormatVersion"] == "2010-09-09"
    assert len(tpl["Resources"]) == 18
    for lid, res in tpl["Resources"].items():
        assert re.fullmatch(r"[A-Za-z0-9]{1,255}", lid), lid
        assert set(res) == {"Type", "Properties"} and res["Type"] == "AWS::CloudWatch::Alarm"
        p = res["Properties"]
        assert set(p) <= CFN_ALARM, (lid, set(p) - CFN_ALARM)
        if "Metrics" not in p:
            assert SINGLE_METRIC <= set(p), lid
            continue
        # a metric math alarm names its metrics only in Metrics
        assert not SINGLE_METRIC & set(p), lid
        assert [q["Id"] for q in p["Metrics"] if q["ReturnData"]] == ["soonest"]
        for q in p["Metrics"]:
            assert set(q) <= CFN_QUERY and ("MetricStat" in q) != ("Expression" in q), (lid, q)
            if "MetricStat" in q:
                assert set(q["MetricStat"]) <= CFN_METRIC_STAT and set(q["MetricStat"]["Metric"]) <= CFN_METRIC
    # named for the group (or instance), the alarm and the direction: unique per group
    assert {"BurstwatchWebAsgCreditExhaustionIn", "BurstwatchM5LargeProdShapingOut",
            f"Burstwatch{IID.replace('-', '').capitalize()}CreditLowIn"} <= set(tpl["Resources"])


def test_logical_ids_stay_unique_when_names_differ_only_in_punctuation() -> None:
    alarms = alarm_params("Burstwatch", (("AutoScalingGroupName", "web-asg"),), 60, "web-asg", group=True)
    alarms += alarm_params("Burstwatch", (("AutoScalingGroupName", "web.asg"),), 60, "web.asg", group=True)
    resources = cloudformation_template(alarms)["Resources"]
    assert len(resources) == 12 and all(re.fullmatch(r"[A-Za-z0-9]+", lid) for lid in resources)
    assert [r["Properties"]["AlarmName"] for r in resources.values()] == [a["AlarmName"] for a in alarms]
    assert logical_id("burstwatch-web.asg-shaping-in", set()) == "BurstwatchWebAsgShapingIn"


def _documented_template() -> str:
    """The template docs/cloudwatch.md shows: the defaults, for an instance of the group web-asg."""
    from agent.config import CloudWatchConfig

    return cloudformation(alarm_set(CloudWatchConfig(), common_dimensions(IID, ITYPE, "web-asg", {}), IID))


def test_docs_carry_the_generated_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = (ROOT / "docs" / "cloudwatch.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", doc, re.S)
    assert _documented_template() in blocks, \
        "docs/cloudwatch.md is stale: paste `burstwatch cloudwatch alarms --cloudformation`"
    # and it is what the command prints for that instance
    cfg = write_config(tmp_path, "http://127.0.0.1:9")
    assert alarms_command(parse(["alarms", "--config", str(cfg), "--cloudformation", "--instance-id", IID,
                                 "--instance-type", ITYPE, "--autoscaling-group", "web-asg"])) == 0
    assert capsys.readouterr().out == _documented_template()


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
    from agent.models.figures import CLOUDWATCH_METRICS
    from tests.cloudwatch.test_publisher import snapshot

    stat = {"Maximum": max, "Minimum": min}[spec.statistic]
    minutes: dict[int, list] = {}
    for s in samples:
        minutes.setdefault(int((s.t - 1e-9) // 60), []).append(s)
    out = []
    for _, group in sorted(minutes.items()):
        # each query as the publisher reads it from the sample (the figure table's CloudWatch form)
        values = {qid: stat(min(CLOUDWATCH_METRICS[metric].read(snapshot(0.0, {"out": s.reading}), "out"),
                                EXHAUSTION_CAP_SECONDS) for s in group)
                  for qid, metric in spec.math}
        assert spec.expression == "MIN([instant, trend, early * 3.333333])"
        out.append(min(v * w for v, w in zip(values.values(), spec.weights)) < spec.threshold)
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
    assert watched == 10
