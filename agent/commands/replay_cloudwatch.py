"""`burstwatch replay --cloudwatch`: the trace read from an instance's AWS/EC2 NetworkIn/NetworkOut
(docs/replay.md, "From CloudWatch")."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Iterator

from agent import aws
from agent import config as configmod
from agent.commands.replay_options import ReplayError
from agent.readers import cloudwatch_history
from agent.readers.trace import TraceRow, parse_timestamp


def _time(flag: str, text: str | None) -> float:
    if not text:
        raise ReplayError(f"--cloudwatch needs {flag} (ISO 8601 or Unix seconds)")
    try:
        return parse_timestamp(text)
    except ValueError as exc:
        raise ReplayError(f"{flag} {text!r}: not a time ({exc})") from None


def cloudwatch_rows(args: argparse.Namespace, cfg: configmod.Config) -> Iterator[TraceRow]:
    from botocore.exceptions import BotoCoreError, ClientError

    start, end = _time("--start", args.start), _time("--end", args.end)
    if end <= start:
        raise ReplayError(f"--end {args.end!r} is not after --start {args.start!r}")
    if args.trace:
        raise ReplayError("give either TRACE.csv or --cloudwatch, not both")
    client = aws.client("cloudwatch", args.region or cfg.cloudwatch.region, cfg.cloudwatch.endpoint_url)
    try:
        period, intervals = cloudwatch_history.network_history(client, args.cloudwatch, start, end)
    except (BotoCoreError, ClientError) as exc:
        raise ReplayError(f"CloudWatch GetMetricData for {args.cloudwatch}: {exc}") from None
    if not intervals:
        raise ReplayError(f"no AWS/EC2 NetworkIn/NetworkOut datapoints for {args.cloudwatch} between "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(start))} and "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(end))}")
    kind = "detailed monitoring" if period == cloudwatch_history.DETAILED_PERIOD else "basic monitoring"
    print(f"burstwatch replay: {len(intervals)} periods of {period} s from CloudWatch ({kind}); bursts shorter "
          f"than {period} s are averaged into their period (docs/replay.md, \"From CloudWatch\")", file=sys.stderr)
    # Each period is one sample of its own length: a missing period (a stopped instance, no data) is skipped,
    # not spread over the gap, so it neither spends nor earns credit.
    for k, (t, seconds, in_b, out_b) in enumerate(cloudwatch_history.rows(intervals)):
        yield TraceRow(k + 1, t, seconds, in_b, out_b)
