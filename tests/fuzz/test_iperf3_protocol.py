"""Fuzzing what the responder reads from the network: iperf3's length-framed JSON, parameters and results.

Anyone in the allow list (by default the whole VPC) can send these bytes. The responder's session
(agent/responder/session.py `_run`) reads parameters and results as `parse_*(ctrl.recv_message(...))` and
turns ProtocolError (and its Timeout and PeerClosed) into a `dropped{reason="garbage"|"timeout"|"closed"}`
count; any other exception is counted as `stream_error` with a traceback in the log. So the one expected
failure of every function here is ProtocolError, and anything else escaping is a bug."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.iperf3 import protocol as p
from agent.iperf3.params import TestParams, parse_params
from agent.iperf3.results import Results, StreamResult, parse_results

CAPTURE = Path(__file__).resolve().parent.parent / "iperf3" / "fixtures" / "iperf3-3.12-control-messages.json"
MESSAGES: dict[str, Any] = json.loads(CAPTURE.read_text(encoding="utf-8"))
PARAMS = [v for k, v in MESSAGES.items() if k.endswith("_params")]
RESULTS = [v for k, v in MESSAGES.items() if k.endswith("_results")]
PARAM_KEYS = ["tcp", "udp", "sctp", "omit", "time", "num", "blockcount", "parallel", "reverse", "bidirectional",
              "len", "bandwidth", "fqrate", "window", "MSS", "nodelay", "TOS", "congestion", "get_server_output",
              "udp_counters_64bit", "client_version", "pacing_timer"]
RESULT_KEYS = ["cpu_util_total", "cpu_util_user", "cpu_util_system", "sender_has_retransmits", "congestion_used",
               "streams", "server_output_text"]
STREAM_KEYS = ["id", "bytes", "retransmits", "jitter", "errors", "packets", "start_time", "end_time"]

# Any integer: ones beyond a float's range once raised OverflowError from the parsers (issue 13 row 4).
scalars = (st.none() | st.booleans() | st.integers()
           | st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 1.8446744073709552e19])
           | st.floats() | st.text(max_size=12))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10)


def mutated(seeds: list[dict[str, Any]], keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """A captured message with some keys dropped and some (known or not) set to arbitrary JSON values."""
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        obj = dict(draw(st.sampled_from(seeds)))
        for key in draw(st.lists(st.sampled_from(sorted(obj)), max_size=3)):
            obj.pop(key, None)
        changes = draw(st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), json_values, max_size=3))
        obj.update(changes)
        return obj
    return build()


@st.composite
def mutated_results(draw: st.DrawFn) -> dict[str, Any]:
    """Captured results with arbitrary values in the top level and inside the per-stream objects."""
    obj = draw(mutated(RESULTS, RESULT_KEYS))
    if isinstance(obj.get("streams"), list) and draw(st.booleans()):
        streams = [dict(s) if isinstance(s, dict) else s for s in obj["streams"]]
        for s in streams:
            if isinstance(s, dict):
                s.update(draw(st.dictionaries(st.sampled_from(STREAM_KEYS), json_values, max_size=2)))
        obj["streams"] = streams
    return obj


params_objects = mutated(PARAMS, PARAM_KEYS) | st.dictionaries(st.sampled_from(PARAM_KEYS) | st.text(max_size=8),
                                                               json_values, max_size=10)
results_objects = mutated_results() | st.dictionaries(st.sampled_from(RESULT_KEYS), json_values, max_size=8)


def encode(obj: Any) -> bytes:
    """JSON text as a peer may write it: NaN and Infinity included (Python's decoder accepts them)."""
    return json.dumps(obj).encode("utf-8")


# Bodies: arbitrary bytes, JSON of any shape, and valid messages with a few bytes flipped or cut.
@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    body = bytearray(encode(draw(st.sampled_from(PARAMS + RESULTS))))
    for _ in range(draw(st.integers(1, 4))):
        body[draw(st.integers(0, len(body) - 1))] = draw(st.sampled_from(b'[]{}":,\\0e-.\x00\xff'))
    return bytes(body[:draw(st.integers(0, len(body)))])


bodies = st.binary(max_size=200) | json_values.map(encode) | params_objects.map(encode) | damaged()


class FeedSock:
    """Just enough of a socket for protocol.Control: hands out `data` in the given chunk sizes, then EOF."""

    def __init__(self, data: bytes, chunks: list[int]) -> None:
        self.data, self.chunks, self.pos = data, chunks or [len(data) or 1], 0

    def settimeout(self, _timeout: Optional[float]) -> None:
        pass

    def recv(self, n: int) -> bytes:
        size = min(n, self.chunks[0] if self.chunks else n)
        if len(self.chunks) > 1:
            self.chunks.pop(0)
        out = self.data[self.pos:self.pos + size]
        self.pos += len(out)
        return out


def control(data: bytes, chunks: Optional[list[int]] = None) -> p.Control:
    return p.Control(FeedSock(data, chunks or []), "fuzz")  # type: ignore[arg-type]


# -- the properties ------------------------------------------------------------------------------------------

@given(bodies)
@example(b"")
@example(b"\xff\xfe")
@example(b"[" * 200)  # nested, but within the recursion limit
@example(b'{"time": 1e999}')
def test_decode_message_returns_an_object_or_raises_protocol_error(body: bytes) -> None:
    try:
        obj = p.decode_message(body)
    except p.ProtocolError:
        return
    assert isinstance(obj, dict)


@given(params_objects)
@example({"time": None})
@example({"time": float("nan")})
@example({"time": 1e300, "parallel": -1e300})
@example({"congestion": ["bbr"]})
@example({"tcp": True, "udp": True, "len": 2**63})
def test_parse_params_returns_params_in_range_or_raises_protocol_error(obj: dict[str, Any]) -> None:
    try:
        tp = parse_params(obj)
    except p.ProtocolError:
        return
    # What the responder relies on before its own caps (session._run, policy.check_caps).
    assert tp.protocol in ("tcp", "udp", "sctp")
    assert 0 <= tp.duration <= 86400 and 0 <= tp.omit <= 600 and 1 <= tp.num_streams <= 1 << 20
    assert 0 <= tp.blksize <= 1 << 30 and 0 <= tp.window <= 1 << 31 and 0 <= tp.mss <= 1 << 20
    assert 0 <= tp.tos <= 255
    assert all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63
               for v in (tp.bytes, tp.blocks, tp.bandwidth, tp.fqrate))
    assert tp.congestion is None or (isinstance(tp.congestion, str) and len(tp.congestion) <= 16)
    assert tp.client_version is None or len(tp.client_version) <= 32


@given(results_objects)
@example({"cpu_util_total": 0, "cpu_util_user": 0, "cpu_util_system": 0, "sender_has_retransmits": 0,
          "streams": [{"id": 1, "bytes": 0, "retransmits": float("inf"), "jitter": 0, "errors": "x",
                       "packets": None}]})
def test_parse_results_returns_results_or_raises_protocol_error(obj: dict[str, Any]) -> None:
    try:
        res = parse_results(obj)
    except p.ProtocolError:
        return
    assert res.sender_has_retransmits in (-1, 0, 1)
    assert len(res.streams) <= 2 * p.MAX_STREAMS
    for s in res.streams:
        assert 0 <= s.id <= 1 << 20 and 0 <= s.bytes < 2**63
        assert s.retransmits >= -1 and s.errors >= 0 and s.packets >= 0


@given(bodies, st.lists(st.integers(1, 64), max_size=8), st.booleans())
def test_framing_returns_an_object_or_raises_protocol_error(body: bytes, chunks: list[int], lie: bool) -> None:
    """The responder's own read: a 4-byte length, then that many bytes of JSON, in any chunking; a
    length prefix that lies (too long: EOF mid-message) is a ProtocolError too."""
    size = len(body) + (7 if lie else 0)
    ctrl = control(struct.pack("!I", size) + body, chunks)
    try:
        parse_params(ctrl.recv_message(5.0, p.MAX_PARAMS_MESSAGE))
    except p.ProtocolError:
        return
    assert not lie


@given(st.binary(max_size=64), st.lists(st.integers(1, 8), max_size=4))
def test_any_stream_of_bytes_is_a_message_or_a_protocol_error(data: bytes, chunks: list[int]) -> None:
    ctrl = control(data, chunks)
    try:
        ctrl.recv_state(5.0)
        res = parse_results(ctrl.recv_message(5.0, 1024 * 1024))
    except p.ProtocolError:
        return                                          # refused: the one exception allowed out
    assert isinstance(res, Results) and len(data) >= 5  # a state byte and a length prefix at least


@given(st.integers(p.MAX_PARAMS_MESSAGE + 1, 2**32 - 1))
def test_oversized_messages_are_refused_unread(size: int) -> None:
    sock = FeedSock(struct.pack("!I", size) + b"{}" * 8, [])
    with pytest.raises(p.ProtocolError, match="exceeds"):
        p.Control(sock, "fuzz").recv_message(5.0, p.MAX_PARAMS_MESSAGE)  # type: ignore[arg-type]
    assert sock.pos == 4


# -- round trips: what we send, a peer's parser (ours) reads back unchanged ------------------------------------

u63 = st.integers(0, 2**63 - 1)
test_params = st.builds(
    TestParams, protocol=st.sampled_from(["tcp", "udp", "sctp"]), duration=st.integers(0, 86400),
    omit=st.integers(0, 600), num_streams=st.integers(1, 1 << 20), reverse=st.booleans(),
    bidirectional=st.booleans(), blksize=st.integers(0, 1 << 30), bytes=u63, blocks=u63, bandwidth=u63,
    fqrate=u63, window=st.integers(0, 1 << 31), mss=st.integers(0, 1 << 20), nodelay=st.booleans(),
    tos=st.integers(0, 255), congestion=st.none() | st.text(min_size=1, max_size=16),
    get_server_output=st.booleans(), udp_counters_64bit=st.booleans(),
    client_version=st.none() | st.text(min_size=1, max_size=32), extra=st.just({}))


@given(test_params, st.lists(st.integers(1, 32), max_size=6))
def test_params_round_trip_through_the_framing(tp: TestParams, chunks: list[int]) -> None:
    got = parse_params(control(p.encode_message(tp.to_json()), chunks).recv_message(5.0, p.MAX_PARAMS_MESSAGE))
    assert got == TestParams(**{**tp.__dict__, "client_version": tp.client_version or p.IPERF_PROTOCOL_VERSION})


finite = st.floats(allow_nan=False, allow_infinity=False)
stream_results = st.builds(
    StreamResult, id=st.integers(0, 1 << 20), bytes=u63, retransmits=st.integers(-1, 2**63 - 1), jitter=finite,
    errors=u63, packets=u63, start_time=finite, end_time=finite)
results = st.builds(
    Results, cpu_total=finite, cpu_user=finite, cpu_system=finite,
    sender_has_retransmits=st.sampled_from([-1, 0, 1]), congestion_used=st.none() | st.text(min_size=1, max_size=16),
    streams=st.lists(stream_results, max_size=4).map(tuple), server_output_text=st.none() | st.text(max_size=40))


@given(results)
def test_results_round_trip(res: Results) -> None:
    assert parse_results(p.decode_message(p.encode_message(res.to_json())[4:])) == res


# -- issue 13 rows 4 and 5: inputs that once escaped the parser or flooded the log

NESTED = [b"[" * 60_000, b'{"a":' * 12_000]


@pytest.mark.parametrize("body", NESTED, ids=["brackets", "objects"])
def test_deeply_nested_json_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode_message(body)


def test_deeply_nested_params_through_the_framing_are_a_protocol_error() -> None:
    body = NESTED[0]
    assert len(body) <= p.MAX_PARAMS_MESSAGE
    with pytest.raises(p.ProtocolError):
        parse_params(control(struct.pack("!I", len(body)) + body).recv_message(5.0, p.MAX_PARAMS_MESSAGE))


HUGE = "1" + "0" * 400  # an integer beyond a float's range, valid JSON (and within Python's 4300 digits)


@pytest.mark.parametrize("key", ["time", "num", "parallel", "TOS"])
def test_params_with_a_huge_integer_are_a_protocol_error(key: str) -> None:
    with pytest.raises(p.ProtocolError):
        parse_params(p.decode_message(f'{{"tcp": true, "{key}": {HUGE}}}'.encode()))


def results_with(top: dict[str, str], stream: dict[str, str]) -> bytes:
    base = {"cpu_util_total": "1", "cpu_util_user": "0", "cpu_util_system": "1", "sender_has_retransmits": "0"}
    one = {"id": "1", "bytes": "5", "retransmits": "0", "jitter": "0", "errors": "0", "packets": "0",
           "start_time": "0", "end_time": "1", **stream}
    inner = ",".join(f'"{k}":{v}' for k, v in one.items())
    return ("{" + ",".join(f'"{k}":{v}' for k, v in {**base, **top}.items()) + f',"streams":[{{{inner}}}]}}').encode()


@pytest.mark.parametrize(("top", "stream"), [
    ({"cpu_util_total": HUGE}, {}),          # _float: float() of it overflows
    ({"sender_has_retransmits": HUGE}, {}),  # _signed
    ({}, {"bytes": HUGE}),                   # _num
    ({}, {"retransmits": HUGE}),             # _signed
    ({}, {"jitter": HUGE}),                  # _float
], ids=["cpu", "has_retransmits", "bytes", "retransmits", "jitter"])
def test_results_with_a_huge_integer_are_a_protocol_error(top: dict[str, str], stream: dict[str, str]) -> None:
    body = results_with(top, stream)
    assert parse_results(p.decode_message(results_with({}, {}))).streams[0].bytes == 5  # the base is valid
    with pytest.raises(p.ProtocolError):
        parse_results(p.decode_message(body))


# One bad value must not make a 60 KB log line: the responder logs str(ProtocolError) for every drop.
MAX_ERROR_TEXT = 512


@pytest.mark.parametrize("obj", [{"time": "x" * 60_000}, {"congestion": "c" * 60_000},
                                 {"time": [[0] * 10_000]}], ids=["number", "congestion", "list"])
def test_protocol_errors_quote_a_bounded_part_of_the_value(obj: dict[str, Any]) -> None:
    with pytest.raises(p.ProtocolError) as info:
        parse_params(obj)
    assert len(str(info.value)) <= MAX_ERROR_TEXT


def test_responder_counts_deeply_nested_params_as_garbage() -> None:
    """The row as the issue found it, end to end on loopback: `[` x 60,000 as parameters."""
    from tests.support.iperf3 import responder, wait_until

    with responder() as r:
        ctrl = p.Control(socket.create_connection(r.address), "fuzz")
        ctrl.send(p.make_cookie())
        assert ctrl.recv_state(2.0) == p.PARAM_EXCHANGE
        ctrl.send(struct.pack("!I", 60_000) + b"[" * 60_000)
        ctrl.sock.settimeout(5.0)
        try:
            ctrl.sock.recv(16)  # the responder closes the connection when it has counted the drop
        except OSError:
            pass
        ctrl.sock.close()
        wait_until(lambda: sum(r.stats.snapshot().dropped.values()) >= 1, what="a drop")
        dropped = r.stats.snapshot().dropped
        assert dropped["garbage"] == 1 and dropped["stream_error"] == 0, dropped
