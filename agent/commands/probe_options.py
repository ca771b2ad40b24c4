"""`burstwatch probe` and `burstwatch responder`: their arguments here, their work in agent.commands.probe
(imported when run).

The arguments live apart for the reason agent/commands/cloudwatch.py gives: `burstwatch run` builds the whole
parser, and the probe client's code (its output formatting, its standalone profile) has no place in the
resident daemon."""

from __future__ import annotations

import argparse
import math
from typing import Optional

from agent.iperf3.protocol import DEFAULT_PORT


def split_target(target: str) -> tuple[str, Optional[int]]:
    """'host' -> (host, None); 'host:5202' -> (host, 5202); '[fe80::1]:5202' and bare IPv6 work too.
    Raises ValueError on an empty host or a bad port."""
    target = target.strip()
    if target.startswith("["):
        host, sep, rest = target[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{target!r}: unbalanced IPv6 bracket")
        port_text = rest[1:] if rest else None
    elif target.count(":") == 1:
        host, _, port_text = target.partition(":")
    else:
        host, port_text = target, None  # a name, an IPv4 address or a bare IPv6 address
    if not host:
        raise ValueError(f"{target!r} has no host")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{target!r}: port must be 1..65535")
    return host, int(port_text)


def parse_bitrate(text: str) -> int:
    """iperf3's -b syntax: bits per second with an optional K, M or G (powers of 1000): '100M' -> 10**8.
    For argparse `type=`: raises ValueError (argparse turns it into a usage error)."""
    text = text.strip()
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(text[-1:].lower(), 1)
    number = text[:-1] if scale != 1 else text
    value = float(number)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"bitrate {text!r} is not a non-negative number")
    return int(value * scale)


def add_probe_arguments(sp: argparse.ArgumentParser) -> None:
    """The `probe` subcommand's arguments (the names docs/probes.md documents, plus iperf3's short options)."""
    sp.add_argument("target", metavar="TARGET", help="host, host:port or [v6addr]:port of an iperf3 server "
                    "or a burstwatch responder")
    sp.add_argument("--port", "-p", type=int, default=None, help=f"server port ({DEFAULT_PORT}; a port in "
                    "TARGET wins)")
    sp.add_argument("--streams", "-P", type=int, default=4, help="parallel streams (4)")
    sp.add_argument("--time", "-t", type=float, default=5.0, help="seconds to transmit (5)")
    sp.add_argument("--reverse", "-R", action="store_true", help="the server sends, we receive")
    sp.add_argument("--bidir", action="store_true", help="both ways at once: --streams each way in one test "
                    "(iperf3 3.7+'s --bidir; not with --reverse)")
    sp.add_argument("--udp", "-u", action="store_true", help="UDP: jitter and loss (1 Mbit/s per stream "
                    "unless --bitrate)")
    sp.add_argument("--bitrate", "-b", type=parse_bitrate, default=None, metavar="RATE",
                    help="bits/s per stream, K/M/G suffixes (iperf3 -b); default unlimited for TCP")
    sp.add_argument("--interval", "-i", type=float, default=1.0, help="seconds between interval reports (1)")
    sp.add_argument("--connect-timeout", type=float, default=5.0, metavar="SECONDS",
                    help="give up connecting after this long (5)")
    sp.add_argument("--json", "-J", action="store_true", help="print iperf3's JSON document")


def add_responder_arguments(sp: argparse.ArgumentParser) -> None:
    """The `responder` subcommand's arguments (besides --config, which build_parser adds)."""
    sp.add_argument("--listen", metavar="HOST:PORT", default=None, help="overrides [responder] listen")
    sp.add_argument("--allow", metavar="CIDR", action="append", default=None,
                    help="a source network allowed to test (repeatable); overrides [responder] allow")
