"""The `burstwatch` command line: run, check, status, probe, check-config, cloudwatch, replay."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Optional

from agent import __version__
from agent import config as configmod

log = logging.getLogger("agent")

EXIT_OK, EXIT_WARN, EXIT_FAIL = 0, 1, 2
EXIT_USAGE = 2  # usage and config errors (docs/operations.md, "Troubleshooting"; docs/configuration.md)


def _setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _load_config(args: argparse.Namespace) -> configmod.Config:
    cfg = configmod.load(args.config)
    _setup_logging(args.log_level or cfg.log_level)
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    from agent.daemon import Daemon

    cfg = _load_config(args)
    return Daemon(cfg, args.config).run()


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = configmod.load(args.config)
    print(f"{args.config or configmod.DEFAULT_CONFIG_PATH}: ok ({len(configmod.describe_keys())} keys known,"
          f" sample_interval={cfg.sample_interval:g}s, metrics on {cfg.metrics.listen})")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from agent.commands.check import cmd_check as run

    return run(args)


def cmd_status(args: argparse.Namespace) -> int:
    from agent.commands.status import cmd_status as run

    return run(args)


def cmd_probe(args: argparse.Namespace) -> int:
    from agent.commands.probe import cmd_probe as run

    return run(args)


def cmd_responder(args: argparse.Namespace) -> int:
    from agent.commands.probe import cmd_responder as run

    return run(args)


def cmd_replay(args: argparse.Namespace) -> int:
    from agent.commands.replay import cmd_replay as run

    return run(args)


def _check_names(text: str) -> str:
    from agent.checks import parse_names

    try:
        return ",".join(parse_names(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="burstwatch", description="Watch EC2 network burst credits, verify ENA "
                                "and MTU, and probe peer throughput.")
    p.add_argument("--version", action="version", version=f"burstwatch {__version__}")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                   help="log level (default: the config's log_level, info)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name: str, func: Callable[[argparse.Namespace], int], help_: str,
            config: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        if config:
            sp.add_argument("--config", metavar="PATH", default=None,
                            help=f"config file (default {configmod.DEFAULT_CONFIG_PATH}; missing = defaults)")
        sp.set_defaults(func=func)
        return sp

    add("run", cmd_run, "run the daemon in the foreground (what systemd runs)")
    sp = add("check", cmd_check, "verify the ENA driver, queues, rings, MTU, path MTU and IMDS; exit 0 ok, "
             "1 warnings, 2 failures")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--quick", action="store_true", help="skip the checks the daemon runs less often than every "
                    "5 minutes (path MTU probes, S3 access)")
    sp.add_argument("--checks", metavar="NAME[,NAME...]", type=_check_names, default=None,
                    help="run only these checks (default: all)")
    sp = add("status", cmd_status, "show the running daemon's view of credits, checks and probes")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--url", default=None, help="the daemon's /metrics URL, over plain HTTP (default: the local "
                    "socket metrics.socket, then metrics.listen)")
    # Each subcommand's code is imported when it runs: `run` builds this whole parser, and the resident daemon
    # keeps only what it uses (docs/operations.md, "Footprint").
    from agent.commands.probe_options import add_probe_arguments, add_responder_arguments

    sp = add("probe", cmd_probe, "run one iperf3-compatible throughput probe", config=False)
    add_probe_arguments(sp)
    sp = add("responder", cmd_responder, "run the iperf3-compatible responder in the foreground, without the daemon")
    add_responder_arguments(sp)
    add("check-config", cmd_check_config, "validate a config file; exit 0 or 2 naming the bad key")
    from agent.commands.cloudwatch import add_arguments as add_cloudwatch_arguments
    from agent.commands.cloudwatch import cmd_cloudwatch

    sp = add("cloudwatch", cmd_cloudwatch, "print (or with --apply create) this instance's CloudWatch alarms",
             config=False)
    add_cloudwatch_arguments(sp)
    from agent.commands.replay_options import add_replay_arguments

    sp = add("replay", cmd_replay, "replay a traffic history (CSV or CloudWatch) through the credit model: time "
             "shaped, lowest credit, pages, the size that holds it", config=False)
    add_replay_arguments(sp)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    del parser  # `run` lives on in this frame: the parser's subcommands and help texts need not
    if args.log_level:
        _setup_logging(args.log_level)
    try:
        return int(args.func(args))
    except configmod.ConfigError as exc:
        print(f"burstwatch: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
