"""The CloudWatch alarms an operator needs for burstwatch's metrics, and `burstwatch cloudwatch alarms`."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Container, Optional

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
    """What an alarm watches and when it fires: the one definition behind every output (the text,
    `--json`, `--apply`'s PutMetricAlarm calls and the CloudFormation template), so none can disagree.
    A metric math alarm names its metrics in `Metrics` (MetricDataQuery, the same shape in PutMetricAlarm
    and CloudFormation), and then may not carry Namespace, MetricName, Dimensions, Statistic or Period.
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


def alarm_set(cw: configmod.CloudWatchConfig, dims: Dims, instance_id: str,
              actions: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """Every alarm this instance's config calls for, as PutMetricAlarm parameters: the one selection that
    `--apply` creates and `--json`, the text and `--cloudformation` print. Per group: the metrics every
    instance of the set publishes to (their worst instance); per instance only where its metrics are always
    there (docs/cloudwatch.md, "Alarms")."""
    alarms = []
    for gdims in aggregation_sets(cw.aggregation_dimensions, dims):
        label = "-".join(v for _, v in gdims) or "all"
        alarms += alarm_params(cw.namespace, gdims, cw.period, label, actions, True, cw.alarm_horizon)
    if cw.per_instance == "always":
        alarms += alarm_params(cw.namespace, dims, cw.period, instance_id, actions, False, cw.alarm_horizon)
    return alarms


def logical_id(alarm_name: str, taken: Container[str]) -> str:
    """A CloudFormation logical id for the alarm: alphanumeric only, at most 255 characters (template
    anatomy, Resources). Two names that differ only in punctuation (`web-asg`, `web.asg`) would meet, so the
    later one gets a digest of its full name."""
    base = "".join(p[:1].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", alarm_name) if p)[:240]
    return base if base not in taken else base + hashlib.sha256(alarm_name.encode()).hexdigest()[:12]


def cloudformation_template(alarms: list[dict[str, Any]]) -> dict[str, Any]:
    """The alarms as a CloudFormation template. AWS::CloudWatch::Alarm's properties carry PutMetricAlarm's
    names and shapes (MetricDataQuery included), so each resource's Properties are the parameters
    themselves: the template cannot say anything `--json` and `--apply` do not."""
    resources: dict[str, Any] = {}
    for a in alarms:
        resources[logical_id(a["AlarmName"], resources)] = {"Type": "AWS::CloudWatch::Alarm",
                                                            "Properties": dict(a)}
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "burstwatch alarms (burstwatch cloudwatch alarms --cloudformation)",
        "Resources": resources,
    }


def cloudformation(alarms: list[dict[str, Any]]) -> str:
    """The template as CloudFormation JSON (JSON rather than YAML: it is YAML too, and the standard library
    reads it back, so the tests check exactly what an operator deploys)."""
    return json.dumps(cloudformation_template(alarms), indent=2) + "\n"


# -- the command --------------------------------------------------------------------------------

def _instance_dimensions(args: argparse.Namespace, cfg: configmod.Config, imds: Callable[[str], Optional[str]],
                         tags: Optional[Callable[[str], Optional[str]]], ec2: Callable[[], Any],
                         ec2_region: Optional[str] = None) -> Optional[tuple[str, Dims]]:
    """(instance id, the dimensions the daemon publishes under), found the way the daemon finds them
    (`tags` reads IMDS instance tags when IMDS is on, `ec2` makes the DescribeTags client); None when the
    instance cannot be told."""
    instance_id = args.instance_id or imds("meta-data/instance-id")
    instance_type = args.instance_type or cfg.instance.type or imds("meta-data/instance-type")
    if not instance_id:
        return None
    if args.autoscaling_group is not None:
        asg: Optional[str] = args.autoscaling_group or None
    else:
        # The daemon's cached answer when it has one: the same group, and no call on EC2's bucket.
        asg = autoscaling_group_name(instance_id, tags, ec2, cache=Path(cfg.state_dir) / CACHE_FILE,
                                     region=ec2_region)
    return instance_id, common_dimensions(instance_id, instance_type, asg, dict(cfg.cloudwatch.dimensions))


def alarms_command(args: argparse.Namespace, imds_get: Optional[ImdsGet] = None,
                   client_factory: Optional[Callable[..., Any]] = None) -> int:
    """`burstwatch cloudwatch alarms`; `imds_get(path)` reads IMDS `latest/`-relative paths."""
    if getattr(args, "cloudwatch_command", "alarms") != "alarms":
        print(f"burstwatch cloudwatch: unknown action {args.cloudwatch_command!r}", file=sys.stderr)
        return EXIT_USAGE
    cfg = configmod.load(args.config)
    cw = cfg.cloudwatch

    def imds(path: str) -> Optional[str]:
        if imds_get is None:
            return None
        try:
            return imds_get(path)
        except Exception as exc:
            log.debug("IMDS %s: %s", path, exc)
            return None

    factory = client_factory or _client
    own_region = imds("meta-data/placement/region")
    region = cw.region or own_region
    # DescribeTags asks the instance's Region, as the daemon does (readers/autoscaling.py); off IMDS, with
    # --instance-id, the one CloudWatch gets is the best guess.
    ec2_region = own_region or region
    found = _instance_dimensions(args, cfg, imds, imds if imds_get is not None else None,
                                 lambda: factory("ec2", ec2_region, cfg.instance.ec2_endpoint_url), ec2_region)
    if found is None:
        print("burstwatch cloudwatch alarms: cannot tell which instance (IMDS unavailable): pass "
              "--instance-id and --instance-type", file=sys.stderr)
        return EXIT_USAGE
    alarms = alarm_set(cw, found[1], found[0], args.sns_topic)
    if args.cloudformation:
        sys.stdout.write(cloudformation(alarms))
    else:
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
    from agent import aws

    return aws.client(service, region, endpoint_url)
