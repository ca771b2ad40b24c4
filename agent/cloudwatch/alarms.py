"""The CloudWatch alarms an operator needs for burstwatch's metrics, and `burstwatch cloudwatch alarms`."""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from agent import config as configmod
from agent.cloudwatch.dimensions import aggregation_sets, common_dimensions
from agent.models.cw_aggregate import Dims
from agent.models.cw_alarms import ALARMS, HORIZON_SECONDS, AlarmSpec
from agent.models.units import DIRECTIONS
from agent.readers.autoscaling import CACHE_FILE, ImdsGet, autoscaling_group_name

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
WORDS = {"in": "inbound", "out": "outbound"}

def alarm_period(period: int) -> int:
    """Alarm period for a publishing period: standard alarms take multiples of 60 s (high-resolution
    alarms cost 3x, docs/cloudwatch.md), so 1 s publishing is still alarmed on each minute."""
    return max(60, int(math.ceil(period / 60.0)) * 60)


def _condition(spec: AlarmSpec, direction: str, namespace: str, period: int, dims: Any,
               group: bool = False, horizon: float = HORIZON_SECONDS) -> dict[str, Any]:
    """What an alarm watches and when it fires: shared by PutMetricAlarm and the CloudFormation template,
    so the two can never disagree. A metric math alarm names its metrics in `Metrics` (MetricDataQuery, the
    same shape in both), and then may not carry Namespace, MetricName, Dimensions, Statistic or Period.
    A `group` alarm reads the group's metric with the spec's group statistic (its worst instance)."""
    stat = spec.group_statistic if group else spec.statistic
    if spec.math:
        watched: dict[str, Any] = {"Metrics": [
            *({"Id": qid, "MetricStat": {"Metric": {"Namespace": namespace, "MetricName": metric,
                                                    "Dimensions": dims},
                                         "Period": alarm_period(period), "Stat": stat},
               "ReturnData": False} for qid, metric in spec.math),
            {"Id": "soonest", "Expression": spec.expression, "Label": "sooner of the two forecasts",
             "ReturnData": True},
        ]}
    else:
        watched = {"Namespace": namespace, "MetricName": spec.metric, "Dimensions": dims,
                   "Statistic": stat, "Period": alarm_period(period)}
    return {
        "AlarmDescription": spec.description.format(direction=WORDS[direction]),
        **watched,
        "EvaluationPeriods": 1,
        "DatapointsToAlarm": 1,
        "Threshold": spec.limit(horizon),
        "ComparisonOperator": spec.comparison,
        "TreatMissingData": spec.treat_missing,
    }


def alarm_params(namespace: str, dims: Dims, period: int, label: str, actions: Optional[list[str]] = None,
                 group: bool = False, horizon: float = HORIZON_SECONDS) -> list[dict[str, Any]]:
    """PutMetricAlarm arguments for every alarm and direction; `dims` must be the publisher's own
    (CloudWatch matches an alarm's dimensions exactly): an instance's, or with `group` one aggregation set's."""
    out = []
    for spec in ALARMS:
        for d in DIRECTIONS:
            params: dict[str, Any] = {
                "AlarmName": f"burstwatch-{label}-{spec.slug}-{d}",
                **_condition(spec, d, namespace, period,
                             [{"Name": n, "Value": v} for n, v in dims] + [{"Name": "Direction", "Value": d}],
                             group, horizon),
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


def cloudformation_template(namespace: str, period: int, extra: dict[str, str],
                            horizon: float = HORIZON_SECONDS) -> dict[str, Any]:
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
                    **_condition(spec, d, namespace, period, dims, False, horizon),
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


def cloudformation(namespace: str, period: int, extra: dict[str, str], horizon: float = HORIZON_SECONDS) -> str:
    """The template as CloudFormation JSON (JSON rather than YAML: the standard library reads it back,
    so the tests check exactly what an operator deploys)."""
    return json.dumps(cloudformation_template(namespace, period, extra, horizon), indent=2) + "\n"


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
        sys.stdout.write(cloudformation(cw.namespace, cw.period, dict(cw.dimensions), cw.alarm_horizon))
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
        # The daemon's cached answer when it has one: the same group, and no call on EC2's bucket.
        asg = autoscaling_group_name(instance_id, imds if imds_get is not None else None,
                                     lambda: factory("ec2", region, cfg.instance.ec2_endpoint_url),
                                     cache=Path(cfg.state_dir) / CACHE_FILE)
    dims = common_dimensions(instance_id, instance_type, asg, dict(cw.dimensions))
    alarms = []
    # Per group: the metrics every instance of the set publishes to (their worst instance); per instance
    # where its metrics are always there (docs/cloudwatch.md, "Alarms").
    for gdims in aggregation_sets(cw.aggregation_dimensions, dims):
        label = "-".join(v for _, v in gdims) or "all"
        alarms += alarm_params(cw.namespace, gdims, cw.period, label, args.sns_topic, True, cw.alarm_horizon)
    if cw.per_instance == "always":
        alarms += alarm_params(cw.namespace, dims, cw.period, instance_id, args.sns_topic, False, cw.alarm_horizon)
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
