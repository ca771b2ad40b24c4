"""iperf3 control protocol: framing, cookies, stream ids, parameters and results against captured messages."""

from __future__ import annotations

import json
import socket
import struct
import threading
from pathlib import Path

import pytest

from agent.iperf3 import protocol as p
from agent.iperf3.params import TestParams, parse_params
from agent.iperf3.results import Results, StreamResult, parse_results

FIXTURES = Path(__file__).parent / "fixtures"


def messages() -> dict:
    return json.loads((FIXTURES / "iperf3-3.12-control-messages.json").read_text())


def test_state_numbers_are_iperf3s() -> None:
    # iperf_api.h: these single bytes are the whole control vocabulary.
    assert (p.TEST_START, p.TEST_RUNNING, p.TEST_END, p.PARAM_EXCHANGE, p.CREATE_STREAMS) == (1, 2, 4, 9, 10)
    assert (p.SERVER_TERMINATE, p.CLIENT_TERMINATE, p.EXCHANGE_RESULTS, p.DISPLAY_RESULTS) == (11, 12, 13, 14)
    assert (p.IPERF_START, p.IPERF_DONE, p.ACCESS_DENIED, p.SERVER_ERROR) == (15, 16, -1, -2)
    assert p.encode_state(p.ACCESS_DENIED) == b"\xff"
    assert p.encode_state(p.SERVER_ERROR) == b"\xfe"
    assert p.encode_state(p.PARAM_EXCHANGE) == b"\x09"


def test_cookie_shape() -> None:
    cookies = {p.make_cookie() for _ in range(50)}
    assert len(cookies) == 50
    for c in cookies:
        assert len(c) == p.COOKIE_SIZE == 37
        assert c[-1] == 0
        assert set(c[:-1].decode()) <= set(p.COOKIE_CHARS)
        assert p.cookie_text(c) == c[:-1].decode()


@pytest.mark.parametrize(("n", "ids"), [(0, []), (1, [1]), (2, [1, 3]), (4, [1, 3, 4, 5])])
def test_stream_ids_skip_two_like_iperf3(n: int, ids: list[int]) -> None:
    assert p.stream_ids(n) == ids


def test_framing_round_trip_and_limits() -> None:
    frame = p.encode_message({"tcp": True, "time": 5})
    (size,) = struct.unpack("!I", frame[:4])
    assert size == len(frame) - 4
    assert p.decode_message(frame[4:]) == {"tcp": True, "time": 5}
    for bad in (b"[1, 2]", b"{not json", b"\xff\xfe", b'"text"'):
        with pytest.raises(p.ProtocolError):
            p.decode_message(bad)


def pair() -> tuple[p.Control, socket.socket]:
    a, b = socket.socketpair()
    return p.Control(a, "test"), b


def test_control_reads_frames_and_enforces_the_size_limit() -> None:
    ctrl, peer = pair()
    with ctrl.sock, peer:
        peer.sendall(p.encode_state(p.CREATE_STREAMS) + p.encode_message({"a": 1}))
        assert ctrl.recv_state(1.0) == p.CREATE_STREAMS
        assert ctrl.recv_message(1.0, 100) == {"a": 1}
        peer.sendall(struct.pack("!I", 1 << 30))  # a 1 GiB "message": refused before any allocation
        with pytest.raises(p.ProtocolError, match="exceeds"):
            ctrl.recv_message(1.0, 64 * 1024)


def test_control_times_out_and_sees_eof() -> None:
    ctrl, peer = pair()
    with ctrl.sock:
        peer.sendall(b"\x00\x00")  # half a length prefix, then silence
        with pytest.raises(p.Timeout):
            ctrl.recv_message(0.2, 100)
        peer.close()
        with pytest.raises(p.PeerClosed):
            ctrl.recv_state(1.0)


def test_control_assembles_a_message_sent_byte_by_byte() -> None:
    ctrl, peer = pair()
    frame = p.encode_message({"streams": [1, 2, 3]})

    def dribble() -> None:
        for i in range(len(frame)):
            peer.send(frame[i:i + 1])

    t = threading.Thread(target=dribble)
    t.start()
    with ctrl.sock, peer:
        assert ctrl.recv_message(2.0, 1000) == {"streams": [1, 2, 3]}
    t.join()


def test_parse_params_from_iperf3_3_12() -> None:
    m = messages()
    tcp = parse_params(m["tcp_reverse_params"])
    assert (tcp.protocol, tcp.duration, tcp.num_streams, tcp.reverse, tcp.blksize) == ("tcp", 2, 2, True, 131072)
    assert tcp.client_version == "3.12" and tcp.bandwidth == 0 and not tcp.extra
    udp = parse_params(m["udp_forward_params"])
    assert (udp.protocol, udp.reverse, udp.blksize, udp.bandwidth) == ("udp", False, 32768, 100_000_000)


def test_our_params_look_like_iperf3s() -> None:
    ours = TestParams(protocol="tcp", duration=2, num_streams=2, reverse=True).to_json()
    assert ours == messages()["tcp_reverse_params"]


@pytest.mark.parametrize("bad", [
    {"tcp": True, "time": "10"},                 # a string where cJSON wants a number
    {"tcp": True, "parallel": -1},
    {"tcp": True, "time": 1e300},
    {"tcp": True, "len": True},
    {"tcp": True, "congestion": ["cubic"]},
    {"tcp": True, "TOS": 999},
])
def test_parse_params_rejects_garbage(bad: dict) -> None:
    with pytest.raises(p.ProtocolError):
        parse_params(bad)


def test_parse_results_reads_minus_one_through_uint64() -> None:
    # iperf3 writes -1 as 2**64 - 1 (or 1.8446744073709552e+19): both mean "unknown".
    m = messages()
    client = parse_results(m["tcp_reverse_client_results"])
    assert client.sender_has_retransmits == -1
    assert [s.id for s in client.streams] == [1, 3]
    assert all(s.retransmits == -1 for s in client.streams)
    assert client.streams[0].bytes == 2282487808  # > 2**31: 64-bit counts survive
    server = parse_results(m["tcp_reverse_server_results"])
    assert server.sender_has_retransmits == 1
    assert [s.retransmits for s in server.streams] == [35, 20]
    assert server.streams[0].end_time == pytest.approx(2.001151)
    udp = parse_results(m["udp_forward_server_results"])
    assert udp.sender_has_retransmits == -1
    assert udp.streams[0].jitter == pytest.approx(1.1995e-05, rel=1e-3)
    assert udp.streams[0].packets == 763 and udp.streams[0].errors == 0


def test_results_round_trip() -> None:
    r = Results(cpu_total=12.5, cpu_user=1.0, cpu_system=11.5, sender_has_retransmits=1,
                congestion_used="cubic", streams=(StreamResult(1, 10, 2, 0.0, 0, 0, 0.0, 1.5),
                                                  StreamResult(3, 20, 0, 0.0, 0, 0, 0.0, 1.5)))
    wire = p.encode_message(r.to_json())
    assert parse_results(p.decode_message(wire[4:])) == r


@pytest.mark.parametrize("bad", [
    {"cpu_util_total": 1, "cpu_util_user": 1, "cpu_util_system": 1, "streams": []},  # no sender_has_retransmits
    {"cpu_util_total": 1, "cpu_util_user": 1, "cpu_util_system": 1, "sender_has_retransmits": 0,
     "streams": [{"id": 1, "bytes": 1}]},
    {"cpu_util_total": "x", "cpu_util_user": 1, "cpu_util_system": 1, "sender_has_retransmits": 0, "streams": []},
    {"cpu_util_total": 1, "cpu_util_user": 1, "cpu_util_system": 1, "sender_has_retransmits": 0,
     "streams": [{"id": 1} for _ in range(300)]},
])
def test_parse_results_rejects_garbage(bad: dict) -> None:
    with pytest.raises(p.ProtocolError):
        parse_results(bad)


def test_error_texts_match_iperf3() -> None:
    assert p.describe_error(p.IEACCESSDENIED) == "the server is busy running a test. try again later"
    assert p.describe_error(p.IEAUTHTEST) == "test authorization failed"
    assert p.describe_error(999) == "int_errno=999"
    assert p.describe_error(203, 111).startswith("unable to connect stream: ")
