"""Render burstwatch(1) in roff from the CLI's own argparse parser, so the man page cannot drift."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent import __version__
from agent.cli import build_parser


def esc(text: str) -> str:
    """Escape roff specials: backslashes, hyphens (so they render as ASCII) and leading dots."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


def usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().split()[1:])


def options(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(action.option_strings) or str(action.metavar or action.dest)
        if action.option_strings and action.nargs != 0:
            names += " " + str(action.metavar or action.dest.upper())
        out += [".TP", f"\\fB{esc(str(names))}\\fR", esc(action.help or "")]
    return out


def render() -> str:
    parser = build_parser()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0") or 0)
    date = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%d")
    lines = [
        f'.TH BURSTWATCH 1 "{date}" "burstwatch {__version__}" "User Commands"',
        ".SH NAME",
        "burstwatch \\- " + esc("EC2 network burst-credit estimator, ENA/MTU checker and throughput prober"),
        ".SH SYNOPSIS",
        "\\fBburstwatch\\fR [\\fB\\-\\-version\\fR] [\\fB\\-\\-log\\-level\\fR \\fILEVEL\\fR] "
        "\\fICOMMAND\\fR [\\fIoptions\\fR]",
        ".SH DESCRIPTION",
        esc(parser.description or ""),
        ".PP",
        esc("As a service, systemd runs `burstwatch run --config /etc/burstwatch/burstwatch.toml` "
            "(burstwatch.service); the Prometheus endpoint is http://localhost:9786/metrics."),
        ".SH OPTIONS",
        *options(parser),
        ".SH COMMANDS",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sub.choices.items():
        lines += [".SS " + esc(name), esc(sp.description or ""), ".PP", "\\fB" + esc(usage(sp)) + "\\fR",
                  *options(sp)]
    lines += [
        ".SH FILES",
        ".TP", "\\fI/etc/burstwatch/burstwatch.toml\\fR", esc("The configuration (every key, commented, with "
                                                           "its default)."),
        ".TP", "\\fI/var/lib/burstwatch\\fR", esc("State: the credit bucket and caches."),
        ".TP", "\\fI/usr/share/burstwatch\\fR", esc("Prometheus alert rules and the Grafana dashboard."),
        ".SH EXIT STATUS",
        esc("0 success; 1 warnings only (check); 2 failures, bad usage or a bad config."),
        ".SH SEE ALSO",
        "\\fBsystemctl\\fR(1), \\fBjournalctl\\fR(1), /usr/share/doc/burstwatch/install.md",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
