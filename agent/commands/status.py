"""`burstwatch status`: read the running daemon's /metrics (its local socket first); show credits, checks, probes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, TextIO

from agent import config as configmod
from agent.exporters.status import build_status, json_safe, render_text
from agent.readers.daemon_metrics import metrics_url, parse_metrics, read_metrics, read_metrics_socket

EXIT_OK, EXIT_DOWN = 0, 1


def read_daemon(cfg: configmod.MetricsConfig, url: Optional[str]) -> tuple[Optional[str], list[str]]:
    """The exposition text and, when it could not be had, why (one line per place tried).

    Order: `--url` alone when given; else the local socket (no TLS, no password: its file mode decides who
    may read it), then `metrics.listen` over plain HTTP unless /metrics is secured, where that cannot work
    without a secret on the command line (docs/security.md)."""
    if url:
        sources = [("url", url)]
    else:
        sources = [("socket", cfg.socket)] if cfg.socket else []
        if not (cfg.tls_cert_file or cfg.basic_auth_users):
            sources.append(("url", metrics_url(cfg.listen)))
    problems = []
    for kind, where in sources:
        try:
            return (read_metrics_socket(where) if kind == "socket" else read_metrics(where)), []
        except OSError as exc:
            problems.append(f"the daemon does not answer at {where}: {_why(exc)}")
    if not url and (cfg.tls_cert_file or cfg.basic_auth_users):
        problems.append(f"{metrics_url(cfg.listen)} not tried: /metrics needs TLS or basic auth "
                        "(metrics.tls_cert_file, metrics.basic_auth_users); status reads metrics.socket instead")
    return None, problems


def _why(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return f"{exc.strerror or exc}: run as root or as a member of the burstwatch group"
    if isinstance(exc, FileNotFoundError):
        return "no such socket: is the daemon running (under systemd)?"
    return str(getattr(exc, "reason", None) or exc)


def cmd_status(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Entry point for `burstwatch status [--config PATH] [--json] [--url URL]`: 0, or 1 when the daemon
    cannot be read (a bad config raises ConfigError: exit 2)."""
    cfg = configmod.load(getattr(args, "config", None))
    text, problems = read_daemon(cfg.metrics, getattr(args, "url", None))
    if text is None:
        print("".join(f"burstwatch status: {p}\n" for p in problems)
              + "  is it running? `systemctl status burstwatch`", file=sys.stderr)
        return EXIT_DOWN
    doc = build_status(parse_metrics(text))
    out.write((json.dumps(json_safe(doc), indent=2, allow_nan=False) if getattr(args, "json", False)
               else render_text(doc)) + "\n")
    return EXIT_OK
