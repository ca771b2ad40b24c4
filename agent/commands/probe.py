"""`burstwatch probe` and `burstwatch responder`: one iperf3-compatible test, or a standalone responder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any, TextIO

from agent import config as configmod
from agent.commands.probe_options import split_target
from agent.config_checks import check_cidrs, check_hostport
from agent.iperf3.protocol import DEFAULT_PORT

if TYPE_CHECKING:
    from agent.models.profile import BandwidthProfile

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# -- human output, in iperf3's layout --------------------------------------------------------------------

def _unit(value: float, unit: str) -> str:
    # iperf3's unit_snprintf: two decimals below 10, one below 100, none above.
    if value < 9.995:
        return f"{value:4.2f} {unit}"
    if value < 99.95:
        return f"{value:4.1f} {unit}"
    return f"{value:4.0f} {unit}"


def fmt_bytes(n: float) -> str:
    """iperf3's adaptive byte unit (powers of 1024): '1.17 GBytes'."""
    for unit, scale in (("GBytes", 1024 ** 3), ("MBytes", 1024 ** 2), ("KBytes", 1024)):
        if n >= scale:
            return _unit(n / scale, unit)
    return f"{n:.0f} Bytes"


def fmt_rate(bps: float) -> str:
    """iperf3's adaptive bit rate (powers of 1000): '9.41 Gbits/sec'."""
    for unit, scale in (("Gbits/sec", 1e9), ("Mbits/sec", 1e6), ("Kbits/sec", 1e3)):
        if bps >= scale:
            return _unit(bps / scale, unit)
    return f"{bps:.0f} bits/sec"


def render_text(doc: dict[str, Any], out: TextIO) -> None:
    """An iperf3 --json document as iperf3's own client prints it: connections, intervals, summary, CPU."""
    start, end = doc["start"], doc["end"]
    ts = start["test_start"]
    udp = ts["protocol"] == "UDP"
    bidir = bool(ts.get("bidir"))
    conn = start["connecting_to"]
    out.write(f"Connecting to host {conn['host']}, port {conn['port']}\n")
    if ts["reverse"]:
        out.write(f"Reverse mode, remote host {conn['host']} is sending\n")
    for c in start["connected"]:
        out.write(f"[{c['socket']:3d}] local {c['local_host']} port {c['local_port']} connected to "
                  f"{c['remote_host']} port {c['remote_port']}\n")
    sender_side = not ts["reverse"]
    if udp:
        header = ("Total Datagrams" if sender_side else "Jitter    Lost/Total Datagrams")
    else:
        header = "Retr  Cwnd" if sender_side else ""
    # With --bidir iperf3 tags every line with its role: TX-C (this client sends) or RX-C (it receives).
    role = "[Role]" if bidir else ""
    out.write(f"[ ID]{role} Interval           Transfer     Bitrate         {header}\n".rstrip() + "\n")
    multi = ts["num_streams"] > 1 if bidir else len(start["connected"]) > 1
    _write_intervals(doc["intervals"], udp, bidir, multi, out)
    out.write("- - - - - - - - - - - - - - - - - - - - - - - - -\n")
    out.write(f"[ ID]{role} Interval           Transfer     Bitrate         " +
              ("Jitter    Lost/Total Datagrams\n" if udp else "Retr\n"))
    for suffix in ("", "_bidir_reverse") if bidir else ("",):
        _write_summary(end, suffix, udp, bidir, out)
    _write_footer(end, sender_side, bidir, out)


def _write_intervals(intervals: list[dict[str, Any]], udp: bool, bidir: bool, multi: bool, out: TextIO) -> None:
    for i, iv in enumerate(intervals):
        if multi and i:
            out.write("- - - - - - - - - - - - - - - - - - - - - - - - -\n")
        for key in ("sum", "sum_bidir_reverse"):
            if key not in iv:
                continue
            rows = [r for r in iv["streams"] if r.get("sender") == iv[key]["sender"]] if bidir else list(iv["streams"])
            rows += [dict(iv[key], socket="SUM")] if multi else []
            for row in rows:
                out.write(_interval_line(row, udp, bidir) + "\n")


def _write_summary(end: dict[str, Any], suffix: str, udp: bool, bidir: bool, out: TextIO) -> None:
    """The per-stream and SUM lines of one direction (`suffix` "_bidir_reverse": a --bidir test's other)."""
    sent, recv = end["sum_sent" + suffix], end["sum_received" + suffix]
    mine = sent["sender"] if not udp else end["sum" + suffix]["sender"]
    tag = _role(mine) if bidir else ""
    for s in end["streams"]:
        row_sender = (s["udp"] if udp else s["sender"])["sender"]
        if bidir and row_sender != mine:
            continue
        if udp:
            u = s["udp"]
            out.write(_summary_line(u["socket"], u, "", f"  {u['jitter_ms']:.3f} ms  {u['lost_packets']}/"
                                    f"{u['packets']} ({u['lost_percent']:.2g}%)", tag) + "\n")
        else:
            out.write(_summary_line(s["sender"]["socket"], s["sender"], "sender",
                                    f"  {s['sender'].get('retransmits', 0):4d}", tag) + "\n")
            out.write(_summary_line(s["receiver"]["socket"], s["receiver"], "receiver", "      ", tag) + "\n")
    if udp:
        out.write(_summary_line("SUM", sent, "sender", f"  {0.0:.3f} ms  0/{sent['packets']} (0%)", tag) + "\n")
        out.write(_summary_line("SUM", recv, "receiver", f"  {recv['jitter_ms']:.3f} ms  {recv['lost_packets']}/"
                                f"{recv['packets']} ({recv['lost_percent']:.2g}%)", tag) + "\n")
    else:
        out.write(_summary_line("SUM", sent, "sender", f"  {sent.get('retransmits', 0):4d}", tag) + "\n")
        out.write(_summary_line("SUM", recv, "receiver", "      ", tag) + "\n")


def _write_footer(end: dict[str, Any], sender_side: bool, bidir: bool, out: TextIO) -> None:
    cpu = end.get("cpu_utilization_percent")
    if cpu:
        local = "sender" if sender_side else "receiver"
        remote = "receiver" if sender_side else "sender"
        if bidir:
            local = remote = "bidirectional"
        out.write(f"CPU Utilization: local/{local} {cpu['host_total']:.1f}% "
                  f"({cpu['host_user']:.1f}%u/{cpu['host_system']:.1f}%s), remote/"
                  f"{remote} {cpu['remote_total']:.1f}% "
                  f"({cpu['remote_user']:.1f}%u/{cpu['remote_system']:.1f}%s)\n")
    rtt = end.get("burstwatch", {}).get("rtt_us")
    if rtt:
        out.write(f"RTT ({rtt['source']}): min {rtt['min'] / 1000:.3f} ms, mean {rtt['mean'] / 1000:.3f} ms, "
                  f"max {rtt['max'] / 1000:.3f} ms\n")
    out.write("\nburstwatch probe done.\n")


def _role(sender: bool) -> str:
    return "[TX-C]" if sender else "[RX-C]"


def _label(sock: Any) -> str:
    return f"[{sock:>3}]" if isinstance(sock, str) else f"[{sock:3d}]"


def _interval_line(row: dict[str, Any], udp: bool, bidir: bool = False) -> str:
    tag = _role(bool(row.get("sender"))) if bidir else ""
    line = (f"{_label(row['socket'])}{tag} {row['start']:6.2f}-{row['end']:<6.2f} sec  {fmt_bytes(row['bytes']):>11}  "
            f"{fmt_rate(row['bits_per_second']):>15}")
    if udp and "jitter_ms" in row:
        line += f"  {row['jitter_ms']:.3f} ms  {row['lost_packets']}/{row['packets']} ({row['lost_percent']:.2g}%)"
    elif udp:
        line += f"  {row.get('packets', 0)}"
    elif "retransmits" in row:
        line += f"  {row['retransmits']:4d}"
        if "snd_cwnd" in row:
            line += f"   {fmt_bytes(row['snd_cwnd'])}"
    return line


def _summary_line(sock: Any, row: dict[str, Any], role: str, extra: str, tag: str = "") -> str:
    return (f"{_label(sock)}{tag} {row['start']:6.2f}-{row['end']:<6.2f} sec  {fmt_bytes(row['bytes']):>11}  "
            f"{fmt_rate(row['bits_per_second']):>15}{extra}  {role}").rstrip()


# -- commands --------------------------------------------------------------------------------------------

def _opt(args: argparse.Namespace, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def cmd_probe(args: argparse.Namespace) -> int:
    """Run one probe; exit 0 on success, 1 when the probe failed (the message names the peer), 2 on usage
    errors. Reads args.target, port, streams, time, reverse, json and, when the parser has them, udp,
    bitrate, interval and connect_timeout."""
    try:
        host, target_port = split_target(args.target)
    except ValueError as exc:
        print(f"burstwatch probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    port = getattr(args, "port", None)
    if target_port is not None and port not in (None, DEFAULT_PORT, target_port):
        print(f"burstwatch probe: {args.target!r} names port {target_port} but --port says {port}",
              file=sys.stderr)
        return EXIT_USAGE
    # The engine is imported here, not at module level: `burstwatch run` builds this parser too, and the
    # daemon need not keep the client resident.
    from agent.iperf3.client import ProbeError, ProbeRequest, run_probe, validate

    req = ProbeRequest(host=host, port=target_port or port or DEFAULT_PORT, streams=_opt(args, "streams", 4),
                       duration=float(_opt(args, "time", 5.0)), reverse=bool(getattr(args, "reverse", False)),
                       udp=bool(getattr(args, "udp", False)), bitrate=getattr(args, "bitrate", None),
                       bidir=bool(getattr(args, "bidir", False)),
                       interval=float(_opt(args, "interval", 1.0)),
                       connect_timeout=float(_opt(args, "connect_timeout", 5.0)))
    problem = validate(req)
    if problem:
        print(f"burstwatch probe: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        doc = run_probe(req)
    except ProbeError as exc:
        if getattr(args, "json", False):
            # iperf3 --json prints {"error": ...} on failure; tooling that parses stdout keeps working.
            json.dump({"start": {}, "intervals": [], "end": {}, "error": str(exc)}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        print(f"burstwatch probe: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if getattr(args, "json", False):
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render_text(doc, sys.stdout)
    return EXIT_OK


def vpc_cidrs_from_imds(cfg: configmod.Config) -> list[str]:
    """The VPC CIDRs of every attached ENI, from IMDS (empty when IMDS is off or unreachable)."""
    if not cfg.imds.enabled:
        return []
    from agent.readers.imds import ImdsClient, ImdsError, parse_eni, read_enis

    client = ImdsClient(cfg.imds.endpoint, timeout=cfg.imds.timeout, retries=cfg.imds.retries,
                        allow_imdsv1=cfg.imds.allow_imdsv1)
    try:
        enis = [parse_eni(mac, values) for mac, values in read_enis(client).items()]
    except ImdsError as exc:
        log.info("responder: IMDS gave no VPC CIDRs (%s)", exc)
        return []
    out: list[str] = []
    for eni in enis:
        out.extend(c for c in eni.vpc_ipv4_cidr_blocks if c not in out)
    return out


def standalone_profile(cfg: configmod.Config) -> BandwidthProfile:
    """This instance's bandwidth profile for the standalone responder, which has no discovery: `[instance]
    type` (else IMDS's) and `[instance.bandwidth]` over the bundled catalogue. The hourly budget is sized
    from it (docs/probes.md, "Credit guard"); with no credit model there is no floor to hold."""
    from agent.models.catalogue import catalogue_entry
    from agent.models.profile import resolve_profile

    itype = cfg.instance.type
    if itype is None and cfg.imds.enabled:
        from agent.readers.imds import ImdsClient, ImdsError, parse_identity, read_identity

        client = ImdsClient(cfg.imds.endpoint, timeout=cfg.imds.timeout, retries=cfg.imds.retries,
                            allow_imdsv1=cfg.imds.allow_imdsv1)
        try:
            itype = parse_identity(read_identity(client)).instance_type or None
        except (ImdsError, ValueError) as exc:
            log.info("responder: IMDS gave no instance type (%s); the budget is sized for the median size", exc)
    try:
        entry = catalogue_entry(itype) if itype else None
    except (OSError, ValueError) as exc:
        log.error("bundled instance-type catalogue unusable: %s", exc)
        entry = None
    return resolve_profile(itype, cfg.instance.bandwidth, None, entry)


def cmd_responder(args: argparse.Namespace) -> int:
    """`burstwatch responder [--config PATH] [--listen HOST:PORT] [--allow CIDR ...]`: serve tests in the
    foreground until SIGINT/SIGTERM. Exit 0 after a clean stop, 1 when the port cannot be bound, 2 on
    usage/config errors."""
    from agent.responder.server import Responder, resolve_allow

    try:
        cfg = configmod.load(getattr(args, "config", None))
    except configmod.ConfigError as exc:
        print(f"burstwatch responder: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    rcfg = cfg.responder
    listen = getattr(args, "listen", None)
    if listen:
        problem = check_hostport(listen)
        if problem:
            print(f"burstwatch responder: --listen {problem}", file=sys.stderr)
            return EXIT_USAGE
        rcfg = dataclasses.replace(rcfg, listen=listen)
    allow_args = getattr(args, "allow", None)
    if allow_args:
        problem = check_cidrs(list(allow_args))
        if problem:
            print(f"burstwatch responder: --allow {problem}", file=sys.stderr)
            return EXIT_USAGE
        rcfg = dataclasses.replace(rcfg, allow=list(allow_args))
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=cfg.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    allow = resolve_allow(rcfg.allow, lambda: vpc_cidrs_from_imds(cfg))
    profile = standalone_profile(cfg)
    responder = Responder(rcfg, allow, profile=lambda: profile)
    budget = responder.admission.budget(rcfg)
    log.info("responder: hourly budget %d bytes per direction, %d per source: %s", budget.total,
             budget.per_source, budget.describe())
    try:
        responder.bind()
    except OSError as exc:
        print(f"burstwatch responder: cannot listen on {rcfg.listen}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED

    def on_term(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        responder.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        responder.stop(5.0)
    snap = responder.stats.snapshot()
    log.info("responder stopped: %d tests completed, %d aborted, %d refused", snap.tests["completed"],
             snap.tests["aborted"], sum(snap.refused.values()))
    return EXIT_OK
