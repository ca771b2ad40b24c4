"""`burstwatch replay`'s arguments; its work is in agent.commands.replay, imported when it runs."""

from __future__ import annotations

import argparse

from agent import config as configmod


class ReplayError(Exception):
    """Bad usage or input for `burstwatch replay`: printed, exit 2."""


def add_replay_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("trace", nargs="?", metavar="TRACE.csv",
                    help="traffic history: CSV with timestamp, in_bytes, out_bytes[, in_shaped, out_shaped] "
                    "('-' for standard input; docs/replay.md)")
    sp.add_argument("--type", dest="types", action="append", required=True, metavar="TYPE",
                    help="instance type to replay the trace on (repeatable: one summary row each)")
    sp.add_argument("--config", metavar="PATH", default=None,
                    help=f"config file whose defaults apply (default {configmod.DEFAULT_CONFIG_PATH}; "
                    "missing = defaults)")
    sp.add_argument("--bucket-gbit", type=float, default=None, metavar="N",
                    help="believe a bucket of N Gbit (overrides the config and the default)")
    sp.add_argument("--json", action="store_true", help="machine-readable summary")
    sp.add_argument("--openmetrics", metavar="FILE", default=None,
                    help="write every credit family per sample, timestamped, for `promtool tsdb "
                    "create-blocks-from openmetrics` (one --type only)")
    sp.add_argument("--cloudwatch", metavar="INSTANCE_ID", default=None,
                    help="read the trace from CloudWatch's AWS/EC2 NetworkIn/NetworkOut of this instance instead "
                    "of a file (needs --start and --end)")
    sp.add_argument("--start", default=None, help="with --cloudwatch: ISO 8601 or Unix seconds")
    sp.add_argument("--end", default=None, help="with --cloudwatch: ISO 8601 or Unix seconds")
    sp.add_argument("--region", default=None, help="with --cloudwatch: AWS region (default: [cloudwatch] region)")
