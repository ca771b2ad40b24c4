"""The CloudWatch alarms an operator needs for burstwatch's metrics, and `burstwatch cloudwatch alarms`."""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

from agent import config as configmod
from agent.cloudwatch.dimensions import common_dimensions
from agent.models import figures as F
from agent.models.cw_aggregate import Dims
from agent.models.units import DIRECTIONS
from agent.readers.autoscaling import ImdsGet, autoscaling_group_name

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
WORDS = {"in": "inbound", "out": "outbound"}

@dataclass(frozen=True)
class AlarmSpec:
    """One alarm per direction on one burstwatch metric, or on a metric math expression over several."""

    slug: str
    title: str                  # CloudFormation logical id stem
    metric: str
    statistic: str
    comparison: str
    threshold: float
    treat_missing: str
    description: str
    # A metric math alarm: (query id, metric) pairs, each read with `statistic`, and the expression over
    # the ids that the alarm watches. Empty: the alarm watches `metric` itself.
    math: tuple[tuple[str, str], ...] = ()
    expression: str = ""


def _cw(fig: F.Figure) -> str:
    """The CloudWatch name the figure is published under (the figure table's; one form per figure here)."""
    return fig.cloudwatch[0].name


ALARMS: tuple[AlarmSpec, ...] = (
    # The forecast is the earliest warning there is: 10 minutes leaves time to move traffic. The sooner of
    # the two forecasts, as the Prometheus rule BurstCreditsRunningOut: the instant one is right from the
    # first seconds of a steady drain but a year (+Inf) in every pause of a bursty one; the trend (the net
    # rate over [credits] forecast_window) holds through the pauses (docs/credits.md, "Two forecasts").
    # Each read as its Maximum over the period: under the threshold for the whole minute, CloudWatch's form
    # of the rule's `for: 1m`, so a burst of a few seconds from a full bucket (whose instant forecast dips
    # under 10 minutes while it lasts) pages nobody.
    AlarmSpec("credit-exhaustion", "CreditExhaustion", _cw(F.CREDIT_EXHAUSTION_SECONDS), "Maximum",
              "LessThanThreshold", 600.0, "missing",
              "burstwatch: {direction} burst credits run out within 10 minutes at the current rate or at "
              "the trend",
              math=(("instant", _cw(F.CREDIT_EXHAUSTION_SECONDS)), ("trend", _cw(F.CREDIT_EXHAUSTION_TREND_SECONDS))),
              expression="MIN([instant, trend])"),
    AlarmSpec("credit-low", "CreditLow", _cw(F.CREDIT_REMAINING_RATIO), "Minimum", "LessThanThreshold", 0.2,
              "missing", "burstwatch: {direction} burst credits below 20 % of the bucket"),
    # Missing data here means no shaping counter moved (or no source): not a breach.
    AlarmSpec("shaping", "Shaping", _cw(F.SHAPING_PACKETS_TOTAL), "Sum", "GreaterThanThreshold", 0.0, "notBreaching",
              "burstwatch: the shaper is queueing or dropping {direction} packets now"),
)


def alarm_period(period: int) -> int:
    """Alarm period for a publishing period: standard alarms take multiples of 60 s (high-resolution
    alarms cost 3x, docs/cloudwatch.md), so 1 s publishing is still alarmed on each minute."""
    return max(60, int(math.ceil(period / 60.0)) * 60)


def _condition(spec: AlarmSpec, direction: str, namespace: str, period: int, dims: Any) -> dict[str, Any]:
    """What an alarm watches and when it fires: shared by PutMetricAlarm and the CloudFormation template,
    so the two can never disagree. A metric math alarm names its metrics in `Metrics` (MetricDataQuery, the
    same shape in both), and then may not carry Namespace, MetricName, Dimensions, Statistic or Period."""
    if spec.math:
        watched: dict[str, Any] = {"Metrics": [
            *({"Id": qid, "MetricStat": {"Metric": {"Namespace": namespace, "MetricName": metric,
                                                    "Dimensions": dims},
                                         "Period": alarm_period(period), "Stat": spec.statistic},
               "ReturnData": False} for qid, metric in spec.math),
            {"Id": "soonest", "Expression": spec.expression, "Label": "sooner of the two forecasts",
             "ReturnData": True},
        ]}
    else:
        watched = {"Namespace": namespace, "MetricName": spec.metric, "Dimensions": dims,
                   "Statistic": spec.statistic, "Period": alarm_period(period)}
    return {
        "AlarmDescription": spec.description.format(direction=WORDS[direction]),
        **watched,
        "EvaluationPeriods": 1,
        "DatapointsToAlarm": 1,
        "Threshold": spec.threshold,
        "ComparisonOperator": spec.comparison,
        "TreatMissingData": spec.treat_missing,
    }


def alarm_params(namespace: str, dims: Dims, period: int, label: str,
                 actions: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """PutMetricAlarm arguments for every alarm and direction; `dims` must be the publisher's own
    (CloudWatch matches an alarm's dimensions exactly)."""
    out = []
    for spec in ALARMS:
        for d in DIRECTIONS:
            params: dict[str, Any] = {
                "AlarmName": f"burstwatch-{label}-{spec.slug}-{d}",
                **_condition(spec, d, namespace, period,
                             [{"Name": n, "Value": v} for n, v in dims] + [{"Name": "Direction", "Value": d}]),
                "ActionsEnabled": bool(actions),
            }
            if actions:
                params["AlarmActions"] = list(actions)
                params["OKActions"] = list(actions)
            out.append(params)
    return out


def _watched(a: dict[str, Any]) -> tuple[str, int, list[dict[str, str]]]:
    """(what the alarm compares, its period, its dimensions) for a person to read."""
    if "Metrics" not in a:
        return f"{a['Statistic']}({a['Namespace']}/{a['MetricName']})", a["Period"], a["Dimensions"]
    stats = {q["Id"]: q["MetricStat"] for q in a["Metrics"] if "MetricStat" in q}
    (expr,) = [q["Expression"] for q in a["Metrics"] if q.get("ReturnData")]
    for qid, st in stats.items():
        expr = re.sub(rf"\b{qid}\b", f"{st['Stat']}({st['Metric']['Namespace']}/{st['Metric']['MetricName']})",
                      expr)
    first = next(iter(stats.values()))
    return expr, first["Period"], first["Metric"]["Dimensions"]


def render_text(alarms: list[dict[str, Any]]) -> str:
    lines = []
    for a in alarms:
        op = {"LessThanThreshold": "<", "GreaterThanThreshold": ">"}[a["ComparisonOperator"]]
        watched, period, dimensions = _watched(a)
        dims = ", ".join(f"{d['Name']}={d['Value']}" for d in dimensions)
        lines.append(f"{a['AlarmName']}\n  {a['AlarmDescription']}\n"
                     f"  {watched} {op} {a['Threshold']:g} "
                     f"over {period}s; missing data: {a['TreatMissingData']}\n  dimensions: {dims}")
        if a.get("AlarmActions"):
            lines.append(f"  actions: {', '.join(a['AlarmActions'])}")
    return "\n".join(lines)


def cloudformation_template(namespace: str, period: int, extra: dict[str, str]) -> dict[str, Any]:
    """The same alarms as a CloudFormation template, with InstanceId, InstanceType, AutoScalingGroupName
    and AlarmTopicArn as parameters; `extra` is [cloudwatch] dimensions."""
    no_value = {"Ref": "AWS::NoValue"}
    topic = {"Fn::If": ["HasTopic", [{"Ref": "AlarmTopicArn"}], no_value]}
    resources: dict[str, Any] = {}
    for spec in ALARMS:
        for d in DIRECTIONS:
            dims: list[Any] = [
                {"Name": "InstanceId", "Value": {"Ref": "InstanceId"}},
                {"Name": "InstanceType", "Value": {"Ref": "InstanceType"}},
                {"Fn::If": ["HasGroup", {"Name": "AutoScalingGroupName",
                                         "Value": {"Ref": "AutoScalingGroupName"}}, no_value]},
            ]
            dims += [{"Name": n, "Value": extra[n]} for n in sorted(extra)]
            dims.append({"Name": "Direction", "Value": d})
            resources[f"{spec.title}{d.capitalize()}"] = {
                "Type": "AWS::CloudWatch::Alarm",
                "Properties": {
                    "AlarmName": {"Fn::Sub": f"burstwatch-${{InstanceId}}-{spec.slug}-{d}"},
                    **_condition(spec, d, namespace, period, dims),
                    "AlarmActions": topic,
                    "OKActions": topic,
                },
            }
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "burstwatch alarms for one instance (burstwatch cloudwatch alarms --cloudformation)",
        "Parameters": {
            "InstanceId": {"Type": "String"},
            "InstanceType": {"Type": "String"},
            "AutoScalingGroupName": {"Type": "String", "Default": "",
                                     "Description": "the instance's Auto Scaling group, if it has one"},
            "AlarmTopicArn": {"Type": "String", "Default": "", "Description": "SNS topic to notify (empty: none)"},
        },
        "Conditions": {
            "HasGroup": {"Fn::Not": [{"Fn::Equals": [{"Ref": "AutoScalingGroupName"}, ""]}]},
            "HasTopic": {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]},
        },
        "Resources": resources,
    }


def cloudformation(namespace: str, period: int, extra: dict[str, str]) -> str:
    """The template as CloudFormation JSON (JSON rather than YAML: the standard library reads it back,
    so the tests check exactly what an operator deploys)."""
    return json.dumps(cloudformation_template(namespace, period, extra), indent=2) + "\n"


# -- the command --------------------------------------------------------------------------------

def cmd_cloudwatch(args: argparse.Namespace, imds_get: Optional[ImdsGet] = None,
                   client_factory: Optional[Callable[..., Any]] = None) -> int:
    """`burstwatch cloudwatch alarms`; `imds_get(path)` reads IMDS `latest/`-relative paths."""
    if getattr(args, "cloudwatch_command", "alarms") != "alarms":
        print(f"burstwatch cloudwatch: unknown action {args.cloudwatch_command!r}", file=sys.stderr)
        return EXIT_USAGE
    cfg = configmod.load(args.config)
    cw = cfg.cloudwatch
    if args.cloudformation:
        sys.stdout.write(cloudformation(cw.namespace, cw.period, dict(cw.dimensions)))
        return EXIT_OK

    def imds(path: str) -> Optional[str]:
        if imds_get is None:
            return None
        try:
            return imds_get(path)
        except Exception as exc:
            log.debug("IMDS %s: %s", path, exc)
            return None

    instance_id = args.instance_id or imds("meta-data/instance-id")
    instance_type = args.instance_type or cfg.instance.type or imds("meta-data/instance-type")
    if not instance_id:
        print("burstwatch cloudwatch alarms: cannot tell which instance (IMDS unavailable): pass "
              "--instance-id and --instance-type", file=sys.stderr)
        return EXIT_USAGE
    region = cw.region or imds("meta-data/placement/region")
    factory = client_factory or _client
    if args.autoscaling_group is not None:
        asg: Optional[str] = args.autoscaling_group or None
    else:
        asg = autoscaling_group_name(instance_id, imds if imds_get is not None else None,
                                     lambda: factory("ec2", region, cfg.instance.ec2_endpoint_url))
    dims = common_dimensions(instance_id, instance_type, asg, dict(cw.dimensions))
    alarms = alarm_params(cw.namespace, dims, cw.period, instance_id, args.sns_topic)
    print(json.dumps(alarms, indent=2) if args.json else render_text(alarms))
    if not args.apply:
        return EXIT_OK
    client = factory("cloudwatch", region, cw.endpoint_url)
    failed = 0
    for a in alarms:
        try:
            client.put_metric_alarm(**a)
        except Exception as exc:
            failed += 1
            print(f"burstwatch cloudwatch alarms: {a['AlarmName']}: {exc}", file=sys.stderr)
    print(f"created or updated {len(alarms) - failed} of {len(alarms)} alarms", file=sys.stderr)
    return EXIT_OK if not failed else EXIT_FAIL


def _client(service: str, region: Optional[str], endpoint_url: Optional[str]) -> Any:
    from agent.readers import aws

    return aws.client(service, region, endpoint_url)
