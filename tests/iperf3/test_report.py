"""The --json document: same shape as iperf3 3.12's (captured fixtures), figures computed right."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from agent.iperf3.report import Cpu, StartInfo, StreamRecord, build_document, summarize
from agent.iperf3.results import Results, StreamResult
from agent.iperf3.streams import Sample
from agent.iperf3.tcpinfo import TcpInfo

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"iperf3-3.12-{name}.json").read_text())["doc"]


def shape(obj: Any) -> Any:
    """Keys and value kinds, recursively (lists by their first element)."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    if isinstance(obj, bool):
        return "bool"
    if isinstance(obj, (int, float)):
        return "number"
    return type(obj).__name__


def missing(theirs: Any, ours: Any, path: str = "") -> list[str]:
    """Paths present in iperf3's document but absent (or of another kind) in ours."""
    if isinstance(theirs, dict):
        if not isinstance(ours, dict):
            return [path or "/"]
        out = []
        for k, v in theirs.items():
            out += missing(v, ours[k], f"{path}.{k}") if k in ours else [f"{path}.{k}"]
        return out
    if isinstance(theirs, list):
        if not isinstance(ours, list):
            return [path]
        return missing(theirs[0], ours[0], f"{path}[0]") if theirs and ours else []
    return [] if theirs == ours else [f"{path} ({theirs} vs {ours})"]


def info(retrans: int, rtt: int) -> TcpInfo:
    return TcpInfo(state=1, snd_mss=1448, rcv_mss=1448, unacked=0, lost=0, pmtu=9001, rtt_us=rtt, rttvar_us=10,
                   snd_cwnd_segments=100, rcv_rtt_us=0, total_retrans=retrans, bytes_acked=None,
                   bytes_received=None, min_rtt_us=None, delivery_rate=None, bytes_sent=None, snd_wnd=131072)


def tcp_records(sender: bool) -> list[StreamRecord]:
    """Two streams, 2 s at 1 s intervals: stream 1 moves 100 MB/s, stream 3 50 MB/s."""
    recs = []
    for sid, fd, rate in ((1, 5, 100_000_000), (3, 7, 50_000_000)):
        rec = StreamRecord(sid, fd, sender, ("127.0.0.1", 40000 + sid), ("127.0.0.1", 5201))
        for k, (t, retr, rtt) in enumerate(((100.0, 0, 0), (101.0, 3, 200), (102.0, 5, 400))):
            rec.samples.append(Sample(t=t, bytes=rate * k, info=info(retr, rtt) if k or sender else None))
        recs.append(rec)
    return recs


def start_info(reverse: bool, udp: bool = False) -> StartInfo:
    return StartInfo(host="127.0.0.1", port=5201, cookie="x" * 36, protocol="UDP" if udp else "TCP",
                     num_streams=2, blksize=131072, duration=2.0, reverse=reverse, target_bitrate=0,
                     timestamp=1_700_000_000.0, tcp_mss_default=32768)


def peer_results(sender: bool, bytes_: tuple[int, int]) -> Results:
    return Results(cpu_total=40.0, cpu_user=1.0, cpu_system=39.0, sender_has_retransmits=1 if sender else -1,
                   congestion_used="cubic",
                   streams=(StreamResult(1, bytes_[0], 7 if sender else -1, 0.0, 0, 0, 0.0, 2.01),
                            StreamResult(3, bytes_[1], 1 if sender else -1, 0.0, 0, 0, 0.0, 2.01)))


def test_forward_tcp_document() -> None:
    doc = build_document(start_info(False), tcp_records(True), 100.0, 102.0, 1.0,
                         peer_results(False, (199_000_000, 99_000_000)), Cpu(30, 1, 29), "bbr", udp=False)
    assert missing(shape(fixture("tcp-forward")), shape(doc)) == []
    iv = doc["intervals"]
    assert len(iv) == 2
    assert iv[0]["sum"]["bytes"] == 150_000_000 and iv[0]["sum"]["retransmits"] == 6
    assert iv[1]["streams"][0]["retransmits"] == 2 and iv[1]["streams"][0]["rtt"] == 400
    assert iv[0]["streams"][0]["snd_cwnd"] == 144800
    end = doc["end"]
    assert end["sum_sent"]["bytes"] == 300_000_000
    assert end["sum_sent"]["bits_per_second"] == pytest.approx(300_000_000 * 8 / 2.0)
    assert end["sum_sent"]["retransmits"] == 10
    assert end["sum_received"]["bytes"] == 298_000_000
    assert end["sum_received"]["seconds"] == pytest.approx(2.01)
    s0 = end["streams"][0]
    assert (s0["sender"]["max_rtt"], s0["sender"]["min_rtt"], s0["sender"]["mean_rtt"]) == (400, 200, 300)
    assert s0["sender"]["sender"] is True and s0["receiver"]["bytes"] == 199_000_000
    assert end["sender_tcp_congestion"] == "bbr" and end["receiver_tcp_congestion"] == "cubic"
    assert end["cpu_utilization_percent"]["remote_total"] == 40.0
    assert end["burstwatch"]["direction"] == "out"
    s = summarize(doc)
    assert (s.protocol, s.reverse, s.streams, s.retransmits) == ("TCP", False, 2, 10)
    assert s.rtt_mean_seconds == pytest.approx(300e-6)


def test_reverse_tcp_document() -> None:
    doc = build_document(start_info(True), tcp_records(False), 100.0, 102.0, 1.0,
                         peer_results(True, (201_000_000, 101_000_000)), Cpu(), "bbr", udp=False)
    assert missing(shape(fixture("tcp-reverse")), shape(doc)) == []
    end = doc["end"]
    assert end["sum_sent"]["bytes"] == 302_000_000 and end["sum_sent"]["retransmits"] == 8
    assert end["sum_received"]["bytes"] == 300_000_000
    assert end["sum_sent"]["sender"] is False  # iperf3 marks the whole reverse summary sender: false
    assert "retransmits" not in doc["intervals"][0]["streams"][0]
    assert end["streams"][0]["sender"]["max_rtt"] == 0  # the remote sender's RTT is unknown, as in iperf3
    assert end["burstwatch"]["direction"] == "in"


def udp_records(sender: bool) -> list[StreamRecord]:
    rec = StreamRecord(1, 5, sender, ("127.0.0.1", 40001), ("127.0.0.1", 5201))
    rec.samples = [Sample(t=10.0, bytes=0), Sample(t=11.0, bytes=1000 * 1400, packets=1000, errors=10, jitter=0.001),
                   Sample(t=12.0, bytes=2000 * 1400, packets=2000, errors=30, outoforder=2, jitter=0.002)]
    return [rec]


def test_udp_documents() -> None:
    peer = Results(sender_has_retransmits=-1, streams=(StreamResult(1, 1960 * 1400, -1, 0.0015, 40, 2000,
                                                                         0.0, 2.0),))
    fwd = build_document(start_info(False, udp=True), udp_records(True), 10.0, 12.0, 1.0, peer, Cpu(), None, udp=True)
    assert missing(shape(fixture("udp-forward")), shape(fwd)) == []
    u = fwd["end"]["streams"][0]["udp"]
    assert (u["lost_packets"], u["packets"], u["lost_percent"]) == (40, 2000, 2.0)
    assert u["jitter_ms"] == pytest.approx(1.5)
    rev_peer = Results(sender_has_retransmits=0, streams=(StreamResult(1, 2030 * 1400, -1, 0, 0, 2030, 0, 2.0),))
    rev = build_document(start_info(True, udp=True), udp_records(False), 10.0, 12.0, 1.0, rev_peer, Cpu(), None,
                         udp=True)
    assert missing(shape(fixture("udp-reverse")), shape(rev)) == []
    iv = rev["intervals"][1]["streams"][0]
    assert (iv["lost_packets"], iv["packets"], iv["jitter_ms"]) == (20, 1000, 2.0)
    s = summarize(rev)
    assert s.protocol == "UDP" and s.jitter_seconds == pytest.approx(0.002) and s.lost_percent == pytest.approx(1.5)


def test_short_trailing_interval_is_dropped_like_iperf3() -> None:
    recs = tcp_records(True)
    for r in recs:
        last = r.samples[-1]
        r.samples.append(Sample(t=last.t + 0.05, bytes=last.bytes, info=last.info))  # 5 % of 1 s, no bytes
    doc = build_document(start_info(False), recs, 100.0, 102.05, 1.0, peer_results(False, (1, 1)), Cpu(), None,
                         udp=False)
    assert len(doc["intervals"]) == 2


@pytest.mark.parametrize("name", ["tcp-forward", "tcp-reverse", "udp-forward", "udp-reverse"])
def test_summarize_reads_iperf3s_own_documents(name: str) -> None:
    doc = fixture(name)
    s = summarize(doc)
    assert s.sent_bytes == doc["end"]["sum_sent"]["bytes"]
    assert s.received_bits_per_second == doc["end"]["sum_received"]["bits_per_second"]
    assert s.reverse == ("reverse" in name)
    if name.startswith("tcp") and not s.reverse:
        assert s.rtt_mean_seconds is not None and s.rtt_mean_seconds > 0


def test_bidir_tcp_document() -> None:
    """--bidir (issue 13, row 9): streams 1, 3 are ours to send, 4, 5 the peer's; each role summed apart,
    the second as iperf3 3.7+'s `_bidir_reverse` keys; the shape of a captured 3.12 --bidir document."""
    mine, theirs = tcp_records(True), tcp_records(False)
    for rec, sid in zip(theirs, (4, 5)):
        rec.id, rec.socket = sid, sid + 5
    start = dataclasses.replace(start_info(False), bidir=True)
    peer = Results(cpu_total=40.0, sender_has_retransmits=1, congestion_used="cubic", streams=(
        StreamResult(1, 199_000_000, -1, end_time=2.01), StreamResult(3, 99_000_000, -1, end_time=2.01),
        StreamResult(4, 201_000_000, 7, end_time=2.01), StreamResult(5, 101_000_000, 1, end_time=2.01)))
    doc = build_document(start, mine + theirs, 100.0, 102.0, 1.0, peer, Cpu(30, 1, 29), "bbr", udp=False)
    assert missing(shape(fixture("tcp-bidir")), shape(doc)) == []
    assert doc["start"]["test_start"]["bidir"] == 1 and doc["start"]["test_start"]["reverse"] == 0
    iv = doc["intervals"][0]
    assert [s["sender"] for s in iv["streams"]] == [True, True, False, False]
    assert iv["sum"]["sender"] is True and iv["sum"]["bytes"] == 150_000_000 and iv["sum"]["retransmits"] == 6
    assert iv["sum_bidir_reverse"]["sender"] is False and iv["sum_bidir_reverse"]["bytes"] == 150_000_000
    end = doc["end"]
    assert (end["sum_sent"]["bytes"], end["sum_received"]["bytes"]) == (300_000_000, 298_000_000)
    assert end["sum_sent"]["sender"] is True and end["sum_sent"]["retransmits"] == 10
    assert (end["sum_sent_bidir_reverse"]["bytes"], end["sum_received_bidir_reverse"]["bytes"]) == (
        302_000_000, 300_000_000)
    assert end["sum_sent_bidir_reverse"]["sender"] is False and end["sum_sent_bidir_reverse"]["retransmits"] == 8
    assert end["burstwatch"]["direction"] == "both"
    assert summarize(doc).sent_bytes == 300_000_000


def test_bidir_udp_document_has_iperf3s_keys() -> None:
    mine, theirs = udp_records(True), udp_records(False)
    for rec, sid in zip(theirs, (4, 5)):
        rec.id = sid
    start = dataclasses.replace(start_info(False, udp=True), bidir=True)
    peer = Results(streams=tuple(StreamResult(sid, 1_000_000, packets=100, end_time=2.0) for sid in (1, 3, 4, 5)))
    doc = build_document(start, mine + theirs, 10.0, 12.0, 1.0, peer, Cpu(), None, udp=True)
    assert missing(shape(fixture("udp-bidir")), shape(doc)) == []
    assert doc["end"]["sum"]["sender"] is True and doc["end"]["sum_bidir_reverse"]["sender"] is False
