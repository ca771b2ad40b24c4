"""`burstwatch cloudwatch alarms`: its arguments here, its work in agent.cloudwatch.alarms (imported when run).

The arguments live apart from the alarm code because `burstwatch run` builds the whole parser: keeping
the alarm definitions, the publisher and the aggregator out of it keeps ~0.5 MiB out of the resident daemon
(what is published is the figure table's, agent/models/figures/, which the views load anyway)."""

from __future__ import annotations

import argparse

from agent import config as configmod


def add_arguments(sp: argparse.ArgumentParser) -> None:
    """`burstwatch cloudwatch alarms ...` under the `cloudwatch` parser that cli.py adds."""
    sub = sp.add_subparsers(dest="cloudwatch_command", metavar="ACTION")
    sub.required = True
    a = sub.add_parser("alarms", help="print (or create) the CloudWatch alarms for this instance",
                       description="Print the alarms an operator needs for this instance: credits run out "
                       "within 10 minutes (at the current rate or at the trend), credits below 20 %%, shaping "
                       "now (per direction). --apply "
                       "creates them with PutMetricAlarm.")
    a.add_argument("--config", metavar="PATH", default=None,
                   help=f"config file (default {configmod.DEFAULT_CONFIG_PATH}; missing = defaults)")
    a.add_argument("--apply", action="store_true", help="create or update the alarms (PutMetricAlarm)")
    fmt = a.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the PutMetricAlarm parameters as JSON")
    fmt.add_argument("--cloudformation", action="store_true",
                     help="print the same alarms as a CloudFormation template")
    a.add_argument("--instance-id", default=None, help="instance id (default: from IMDS)")
    a.add_argument("--instance-type", default=None,
                   help="instance type (default: [instance] type, else IMDS)")
    a.add_argument("--autoscaling-group", default=None,
                   help="Auto Scaling group name (default: looked up as the daemon does; '' for none)")
    a.add_argument("--sns-topic", action="append", default=[], metavar="ARN",
                   help="SNS topic ARN to notify on ALARM and OK (repeatable)")


def cmd_cloudwatch(args: argparse.Namespace) -> int:
    from agent.cloudwatch.alarms import alarms_command
    from agent.readers.imds import ImdsClient

    im = configmod.load(args.config).imds
    get = ImdsClient(im.endpoint, timeout=im.timeout, retries=im.retries, allow_imdsv1=im.allow_imdsv1).get \
        if im.enabled else None
    return alarms_command(args, imds_get=get)
