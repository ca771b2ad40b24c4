"""Turn stream samples and the peer's results into iperf3's --json document (3.12 schema); no I/O."""

from __future__ import annotations

import email.utils
import platform
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from agent import __version__
from agent.iperf3.results import Results, StreamResult
from agent.iperf3.streams import Sample

# iperf_api.c iperf_print_intermediate: a last interval shorter than 10 % of the interval that moved no
# data is an artefact of stopping, and is left out.
SHORT_INTERVAL = 0.10


@dataclass
class StreamRecord:
    """What one local stream did: its id and socket, the role this host played, samples taken at the
    start, at every interval boundary and at the end."""

    id: int
    socket: int
    sender: bool
    local: tuple[str, int]
    remote: tuple[str, int]
    samples: list[Sample] = field(default_factory=list)


@dataclass
class StartInfo:
    host: str
    port: int
    cookie: str
    protocol: str                 # "TCP" or "UDP"
    num_streams: int
    blksize: int
    duration: float
    reverse: bool
    target_bitrate: int
    timestamp: float              # Unix time of the start
    tcp_mss_default: Optional[int] = None
    sock_bufsize: int = 0
    sndbuf_actual: int = 0
    rcvbuf_actual: int = 0
    omit: int = 0
    bytes: int = 0
    tos: int = 0
    bidir: bool = False


@dataclass
class Cpu:
    total: float = 0.0
    user: float = 0.0
    system: float = 0.0


def version_string() -> str:
    return f"burstwatch {__version__} (iperf3 protocol)"


def system_info() -> str:
    u = platform.uname()
    return f"{u.system} {u.node} {u.release} {u.version} {u.machine}"


def _rate(nbytes: float, seconds: float) -> float:
    return nbytes * 8.0 / seconds if seconds > 0 else 0.0


def _interval_sum(items: list[tuple[StreamRecord, dict[str, Any]]], udp: bool,
                  has_retransmits: bool) -> dict[str, Any]:
    """One interval's `sum` over streams of one role (iperf_print_intermediate sums each role apart)."""
    first = items[0][1]
    sender = items[0][0].sender
    total_bytes = sum(item["bytes"] for _, item in items)
    total: dict[str, Any] = {"start": first["start"], "end": first["end"], "seconds": first["seconds"],
                             "bytes": total_bytes, "bits_per_second": _rate(total_bytes, first["seconds"])}
    if not udp and sender and has_retransmits:
        total["retransmits"] = sum(item.get("retransmits", 0) for _, item in items)
    elif udp and sender:
        total["packets"] = sum(item["packets"] for _, item in items)
    elif udp:
        packets = sum(item["packets"] for _, item in items)
        lost = sum(item["lost_packets"] for _, item in items)
        total["jitter_ms"] = sum(item["jitter_ms"] for _, item in items) / len(items)
        total["lost_packets"] = lost
        total["packets"] = packets
        total["lost_percent"] = 100.0 * lost / packets if packets else 0.0
    total["omitted"] = False
    total["sender"] = sender
    return total


def _intervals(records: list[StreamRecord], t0: float, interval: float, udp: bool,
               has_retransmits: bool, primary_sender: bool) -> list[dict[str, Any]]:
    """iperf3's `intervals`: per stream, and summed per role from consecutive samples (the local side's
    view): `sum` for the test's own direction (`primary_sender`: this side sends), `sum_bidir_reverse`
    for the other one of a --bidir test."""
    out: list[dict[str, Any]] = []
    if not records:
        return out
    n = min(len(r.samples) for r in records)
    for k in range(1, n):
        items: list[tuple[StreamRecord, dict[str, Any]]] = []
        for rec in records:
            s0, s1 = rec.samples[k - 1], rec.samples[k]
            start, end = s0.t - t0, s1.t - t0
            seconds = end - start
            nbytes = s1.bytes - s0.bytes
            item: dict[str, Any] = {"socket": rec.socket, "start": round(start, 6), "end": round(end, 6),
                                    "seconds": seconds, "bytes": nbytes, "bits_per_second": _rate(nbytes, seconds)}
            if not udp and rec.sender and has_retransmits and s1.info is not None:
                base = s0.info.total_retrans if s0.info is not None else 0
                item["retransmits"] = max(0, s1.info.total_retrans - base)
                item["snd_cwnd"] = s1.info.snd_cwnd_bytes
                if s1.info.snd_wnd is not None:
                    item["snd_wnd"] = s1.info.snd_wnd
                item["rtt"] = s1.info.rtt_us
                item["rttvar"] = s1.info.rttvar_us
                item["pmtu"] = s1.info.pmtu
            elif udp and rec.sender:
                item["packets"] = s1.packets - s0.packets
            elif udp:
                item["jitter_ms"] = s1.jitter * 1000.0
                item["lost_packets"] = s1.errors - s0.errors
                item["packets"] = s1.packets - s0.packets
                item["lost_percent"] = 100.0 * item["lost_packets"] / item["packets"] if item["packets"] else 0.0
            item["omitted"] = False
            item["sender"] = rec.sender
            items.append((rec, item))
        first = items[0][1]
        if k == n - 1 and first["seconds"] < interval * SHORT_INTERVAL and sum(i["bytes"] for _, i in items) == 0:
            continue
        entry: dict[str, Any] = {"streams": [item for _, item in items]}
        own = [x for x in items if x[0].sender == primary_sender]
        back = [x for x in items if x[0].sender != primary_sender]
        if own:
            entry["sum"] = _interval_sum(own, udp, has_retransmits)
        if back:
            entry["sum" if not own else "sum_bidir_reverse"] = _interval_sum(back, udp, has_retransmits)
        out.append(entry)
    return out


def _rtt_stats(samples: list[Sample], receiver: bool) -> tuple[int, int, int]:
    """(max, min, mean) RTT in microseconds over the interval samples, as iperf3 sums them per interval;
    a receiver uses the kernel's receive-side estimate (tcpi_rcv_rtt) when it has one."""
    values = []
    for s in samples[1:]:
        if s.info is None:
            continue
        v = s.info.rcv_rtt_us if receiver and s.info.rcv_rtt_us else s.info.rtt_us
        if v:
            values.append(v)
    if not values:
        return 0, 0, 0
    return max(values), min(values), int(sum(values) / len(values))


@dataclass
class _EndStream:
    """One stream's end-of-test figures, both sides' (ours from samples, the peer's from its results)."""

    sender: bool          # this side's role on the stream
    json: dict[str, Any]
    s_bytes: int
    s_time: float
    r_bytes: int
    r_time: float
    retrans: int
    packets_sent: int = 0
    packets_recv: int = 0
    lost: int = 0
    jitter: float = 0.0
    rtt: tuple[int, int, int] = (0, 0, 0)   # (max, min, mean) microseconds; 0s when unknown


def _end_stream(rec: StreamRecord, remote: StreamResult, duration: float, t_end: float, udp: bool) -> _EndStream:
    last = rec.samples[-1] if rec.samples else Sample(t=t_end, bytes=0)
    first_info = rec.samples[0].info if rec.samples else None
    peer_time = max(0.0, remote.end_time - remote.start_time)
    sender = rec.sender
    if sender:
        s_bytes, s_time = last.bytes, duration
        r_bytes, r_time = remote.bytes, peer_time or duration
        if last.info is not None:
            base = first_info.total_retrans if first_info is not None else 0
            retrans = max(0, last.info.total_retrans - base)
        else:
            retrans = -1
    else:
        s_bytes, s_time = remote.bytes, peer_time or duration
        r_bytes, r_time = last.bytes, duration
        retrans = remote.retransmits
    rtt = _rtt_stats(rec.samples, receiver=not sender) if not udp else (0, 0, 0)
    if udp:
        if sender:
            packets_sent, packets_recv = last.packets, remote.packets
            lost, jitter, ooo = remote.errors, remote.jitter, 0
        else:
            packets_sent, packets_recv = remote.packets, last.packets
            lost, jitter, ooo = last.errors, last.jitter, last.outoforder
        # iperf_print_results takes loss over this side's own count: datagrams sent, or the highest
        # sequence number received.
        own = packets_sent if sender else packets_recv
        nbytes = s_bytes if sender else r_bytes
        doc = {"udp": {
            "socket": rec.socket, "start": 0, "end": duration, "seconds": duration, "bytes": nbytes,
            "bits_per_second": _rate(nbytes, duration), "jitter_ms": jitter * 1000.0, "lost_packets": lost,
            "packets": own, "lost_percent": 100.0 * lost / own if own else 0.0, "out_of_order": ooo,
            "sender": sender}}
        return _EndStream(sender, doc, s_bytes, s_time, r_bytes, r_time, retrans, packets_sent, packets_recv,
                          lost, jitter)
    max_rtt, min_rtt, mean_rtt = rtt if sender else (0, 0, 0)
    max_cwnd = max((s.info.snd_cwnd_bytes for s in rec.samples[1:] if s.info), default=0) if sender else 0
    max_wnd = max((s.info.snd_wnd or 0 for s in rec.samples[1:] if s.info), default=0) if sender else 0
    doc = {
        "sender": {"socket": rec.socket, "start": 0, "end": s_time, "seconds": s_time, "bytes": s_bytes,
                   "bits_per_second": _rate(s_bytes, s_time), "retransmits": max(retrans, 0),
                   "max_snd_cwnd": max_cwnd, "max_snd_wnd": max_wnd, "max_rtt": max_rtt,
                   "min_rtt": min_rtt, "mean_rtt": mean_rtt, "sender": sender},
        "receiver": {"socket": rec.socket, "start": 0, "end": r_time, "seconds": s_time, "bytes": r_bytes,
                     "bits_per_second": _rate(r_bytes, r_time), "sender": sender},
    }
    return _EndStream(sender, doc, s_bytes, s_time, r_bytes, r_time, retrans, rtt=rtt)


def _end_sums(group: list[_EndStream], sender: bool, udp: bool, suffix: str) -> dict[str, Any]:
    """`sum_sent`/`sum_received` (and `sum` for UDP) over the streams of one role; `suffix` is
    "_bidir_reverse" for the second role of a --bidir test (iperf_print_results)."""
    sent_bytes = sum(e.s_bytes for e in group)
    recv_bytes = sum(e.r_bytes for e in group)
    sent_end = max((e.s_time for e in group), default=0.0)
    recv_end = max((e.r_time for e in group), default=0.0)
    out: dict[str, Any] = {}
    if udp:
        sent_packets = sum(e.packets_sent for e in group)
        recv_packets = sum(e.packets_recv for e in group)
        lost_total = sum(e.lost for e in group)
        own_total = sent_packets if sender else recv_packets
        lost_pct = 100.0 * lost_total / own_total if own_total else 0.0
        jitter_ms = sum(e.jitter for e in group) / len(group) * 1000.0 if group else 0.0
        out["sum" + suffix] = {"start": 0, "end": recv_end, "seconds": recv_end, "bytes": sent_bytes,
                               "bits_per_second": _rate(sent_bytes, recv_end), "jitter_ms": jitter_ms,
                               "lost_packets": lost_total, "packets": own_total, "lost_percent": lost_pct,
                               "sender": sender}
        out["sum_sent" + suffix] = {"start": 0, "end": sent_end, "seconds": sent_end, "bytes": sent_bytes,
                                    "bits_per_second": _rate(sent_bytes, sent_end), "jitter_ms": 0,
                                    "lost_packets": 0, "packets": sent_packets, "lost_percent": 0, "sender": True}
        out["sum_received" + suffix] = {"start": 0, "end": recv_end, "seconds": recv_end, "bytes": recv_bytes,
                                        "bits_per_second": _rate(recv_bytes, recv_end), "jitter_ms": jitter_ms,
                                        "lost_packets": lost_total, "packets": recv_packets,
                                        "lost_percent": lost_pct, "sender": False}
    else:
        out["sum_sent" + suffix] = {"start": 0, "end": sent_end, "seconds": sent_end, "bytes": sent_bytes,
                                    "bits_per_second": _rate(sent_bytes, sent_end),
                                    "retransmits": sum(e.retrans for e in group if e.retrans > 0), "sender": sender}
        out["sum_received" + suffix] = {"start": 0, "end": recv_end, "seconds": recv_end, "bytes": recv_bytes,
                                        "bits_per_second": _rate(recv_bytes, recv_end), "sender": sender}
    return out


def build_document(start: StartInfo, records: list[StreamRecord], t0: float, t_end: float, interval: float,
                   peer: Results, local_cpu: Cpu, local_congestion: Optional[str],
                   udp: bool) -> dict[str, Any]:
    """The iperf3 client's --json document for a finished test (what `iperf3 -c ... --json` prints).
    Each record's role says which way its stream went; with --bidir the streams this side sends are the
    test's own direction and the others its `_bidir_reverse` half, as iperf3 3.7+ reports them."""
    reverse = start.reverse and not start.bidir
    local_sender = not reverse
    peer_by_id: dict[int, StreamResult] = {s.id: s for s in peer.streams}
    has_retransmits = any(r.sender and r.samples and r.samples[-1].info is not None for r in records)
    duration = t_end - t0

    doc_start: dict[str, Any] = {
        "connected": [{"socket": r.socket, "local_host": r.local[0], "local_port": r.local[1],
                       "remote_host": r.remote[0], "remote_port": r.remote[1]} for r in records],
        "version": version_string(),
        "system_info": system_info(),
        "timestamp": {"time": email.utils.formatdate(start.timestamp, usegmt=True),
                      "timesecs": int(start.timestamp)},
        "connecting_to": {"host": start.host, "port": start.port},
        "cookie": start.cookie,
    }
    if start.tcp_mss_default is not None and not udp:
        doc_start["tcp_mss_default"] = start.tcp_mss_default
    test_start: dict[str, Any] = {"protocol": start.protocol, "num_streams": start.num_streams,
                                  "blksize": start.blksize, "omit": start.omit, "duration": start.duration,
                                  "bytes": start.bytes, "blocks": 0, "reverse": int(reverse),
                                  "tos": start.tos, "target_bitrate": start.target_bitrate}
    if start.bidir:
        test_start["bidir"] = 1  # as iperf3 3.8+ writes it (3.12 leaves it out for one-way tests)
    doc_start.update({"target_bitrate": start.target_bitrate, "sock_bufsize": start.sock_bufsize,
                      "sndbuf_actual": start.sndbuf_actual, "rcvbuf_actual": start.rcvbuf_actual,
                      "test_start": test_start})

    intervals = _intervals(records, t0, interval, udp, has_retransmits, local_sender)
    ends = [_end_stream(rec, peer_by_id.get(rec.id, StreamResult(id=rec.id, bytes=0)), duration, t_end, udp)
            for rec in records]
    end: dict[str, Any] = {"streams": [e.json for e in ends]}
    own = [e for e in ends if e.sender == local_sender]
    back = [e for e in ends if e.sender != local_sender]
    end.update(_end_sums(own, local_sender, udp, ""))
    if start.bidir:
        end.update(_end_sums(back, not local_sender, udp, "_bidir_reverse"))
    end["cpu_utilization_percent"] = {"host_total": local_cpu.total, "host_user": local_cpu.user,
                                      "host_system": local_cpu.system, "remote_total": peer.cpu_total,
                                      "remote_user": peer.cpu_user, "remote_system": peer.cpu_system}
    if not udp:
        local_cc, remote_cc = local_congestion or "unknown", peer.congestion_used or "unknown"
        end["sender_tcp_congestion"] = local_cc if local_sender else remote_cc
        end["receiver_tcp_congestion"] = remote_cc if local_sender else local_cc
    # burstwatch's own additions live under one key that iperf3 readers (and Athena's JsonSerDe) ignore.
    ext: dict[str, Any] = {"version": __version__,
                           "direction": "both" if start.bidir else ("out" if local_sender else "in"),
                           "duration": duration}
    # The RTT of the test's own direction (with --bidir: of the streams this side sends).
    rtts = [e.rtt for e in own if e.rtt[0]]
    if rtts:
        ext["rtt_us"] = {"source": "tcpi_rtt" if local_sender else "tcpi_rcv_rtt",
                         "max": max(r[0] for r in rtts), "min": min(r[1] for r in rtts),
                         "mean": int(sum(r[2] for r in rtts) / len(rtts))}
    end["burstwatch"] = ext
    return {"start": doc_start, "intervals": intervals, "end": end}


class ProbeSummary(NamedTuple):
    """The figures a scheduler or a person wants from an iperf3 document (ours or iperf3's own)."""

    protocol: str
    reverse: bool
    streams: int
    seconds: float
    sent_bytes: int
    received_bytes: int
    sent_bits_per_second: float
    received_bits_per_second: float
    retransmits: Optional[int]
    rtt_mean_seconds: Optional[float]
    rtt_min_seconds: Optional[float]
    rtt_max_seconds: Optional[float]
    jitter_seconds: Optional[float]
    lost_percent: Optional[float]


def summarize(doc: dict[str, Any]) -> ProbeSummary:
    """Read the headline figures out of an iperf3 --json document (KeyError/TypeError if it is not one)."""
    end = doc["end"]
    ts = doc.get("start", {}).get("test_start", {})
    sent, recv = end["sum_sent"], end["sum_received"]
    udp = ts.get("protocol") == "UDP"
    retrans = sent.get("retransmits")
    rtt_mean = rtt_min = rtt_max = None
    ext = end.get("burstwatch", {}).get("rtt_us")
    if ext:
        rtt_mean, rtt_min, rtt_max = ext["mean"] / 1e6, ext["min"] / 1e6, ext["max"] / 1e6
    elif not udp:
        senders = [s["sender"] for s in end.get("streams", []) if "sender" in s and s["sender"].get("mean_rtt")]
        if senders:
            rtt_mean = sum(s["mean_rtt"] for s in senders) / len(senders) / 1e6
            rtt_min = min(s["min_rtt"] for s in senders) / 1e6
            rtt_max = max(s["max_rtt"] for s in senders) / 1e6
    return ProbeSummary(
        protocol="UDP" if udp else "TCP", reverse=bool(ts.get("reverse", 0)),
        streams=int(ts.get("num_streams", len(end.get("streams", [])))),
        seconds=float(sent.get("seconds", 0.0)), sent_bytes=int(sent["bytes"]), received_bytes=int(recv["bytes"]),
        sent_bits_per_second=float(sent["bits_per_second"]),
        received_bits_per_second=float(recv["bits_per_second"]),
        retransmits=int(retrans) if retrans is not None and not udp else None,
        rtt_mean_seconds=rtt_mean, rtt_min_seconds=rtt_min, rtt_max_seconds=rtt_max,
        jitter_seconds=float(recv["jitter_ms"]) / 1000.0 if udp else None,
        lost_percent=float(recv["lost_percent"]) if udp else None)
