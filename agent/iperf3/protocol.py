"""iperf3's control protocol (3.x): states, cookie, length-framed JSON, parameters and results."""

from __future__ import annotations

import json
import math
import secrets
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Optional

# Control states, sent as one signed byte on the control connection (esnet/iperf src/iperf_api.h).
TEST_START = 1
TEST_RUNNING = 2
TEST_END = 4
PARAM_EXCHANGE = 9
CREATE_STREAMS = 10
SERVER_TERMINATE = 11
CLIENT_TERMINATE = 12
EXCHANGE_RESULTS = 13
DISPLAY_RESULTS = 14
IPERF_START = 15
IPERF_DONE = 16
ACCESS_DENIED = -1
SERVER_ERROR = -2

STATE_NAMES = {
    TEST_START: "TEST_START", TEST_RUNNING: "TEST_RUNNING", TEST_END: "TEST_END",
    PARAM_EXCHANGE: "PARAM_EXCHANGE", CREATE_STREAMS: "CREATE_STREAMS", SERVER_TERMINATE: "SERVER_TERMINATE",
    CLIENT_TERMINATE: "CLIENT_TERMINATE", EXCHANGE_RESULTS: "EXCHANGE_RESULTS",
    DISPLAY_RESULTS: "DISPLAY_RESULTS", IPERF_START: "IPERF_START", IPERF_DONE: "IPERF_DONE",
    ACCESS_DENIED: "ACCESS_DENIED", SERVER_ERROR: "SERVER_ERROR",
}

# The cookie: 36 characters from this alphabet and a NUL (iperf.h COOKIE_SIZE, iperf_util.c make_cookie).
# The client sends it first on the control connection and again first on every data connection.
COOKIE_SIZE = 37
COOKIE_CHARS = "abcdefghijklmnopqrstuvwxyz234567"

DEFAULT_PORT = 5201
DEFAULT_TCP_BLKSIZE = 128 * 1024      # iperf_api.h DEFAULT_TCP_BLKSIZE
MAX_TCP_BLKSIZE = 1024 * 1024         # iperf.h MAX_BLOCKSIZE
MAX_UDP_BLKSIZE = 65535 - 8 - 20      # iperf.h MAX_UDP_BLOCKSIZE: the largest IPv4 UDP payload
DEFAULT_UDP_BLKSIZE = 1460            # iperf_api.h; clients use the control connection's MSS when known
DEFAULT_UDP_RATE = 1024 * 1024        # iperf.h UDP_RATE: `-u` without `-b` sends 1 Mbit/s per stream
MAX_STREAMS = 128                     # iperf.h MAX_STREAMS
MAX_MSS = 9 * 1024                    # iperf.h MAX_MSS
IPERF_PROTOCOL_VERSION = "3.12"       # what we announce as client_version: Debian 12's iperf3
# iperf3 writes these 4-byte UDP "connect" datagrams as native ints without htonl (iperf.h; iperf_udp.c):
# "6789"/"9876" since 3.11, the decimal 123456789/987654321 before. Servers accept any content.
UDP_CONNECT_MSG = struct.pack("=I", 0x36373839)
UDP_CONNECT_REPLY = struct.pack("=I", 0x39383736)
LEGACY_UDP_CONNECT_REPLY = struct.pack("=I", 987654321)

# Error numbers (iperf_api.h i_errno enum) that travel after SERVER_ERROR, with iperf_error.c's text.
IEDURATION = 5
IENUMSTREAMS = 6
IEBLOCKSIZE = 7
IEUDPBLOCKSIZE = 20
IETOTALRATE = 27
IECTRLCLOSE = 109
IEMESSAGE = 110
IERECVPARAMS = 114
IERECVRESULTS = 117
IECLIENTTERM = 119
IESERVERTERM = 120
IEACCESSDENIED = 121
IEPROTOCOL = 131
IEAUTHTEST = 142
IENOMSG = 144
IESTREAMID = 208

ERROR_MESSAGES = {
    1: "cannot be both server and client",
    IEDURATION: "test duration too long",
    IENUMSTREAMS: "number of parallel streams too large",
    IEBLOCKSIZE: "block size too large",
    8: "socket buffer size too large",
    9: "invalid report interval",
    10: "TCP MSS too large",
    IEUDPBLOCKSIZE: "block size invalid",
    IETOTALRATE: "total required bandwidth is larger than server limit",
    100: "unable to create a new test",
    101: "test initialization failed",
    102: "unable to start listener for connections",
    103: "unable to connect to server",
    104: "unable to accept connection from client",
    105: "unable to send cookie to server",
    106: "unable to receive cookie at server",
    107: "unable to write to the control socket",
    108: "unable to read from the control socket",
    IECTRLCLOSE: "control socket has closed unexpectedly",
    IEMESSAGE: "received an unknown control message",
    111: "unable to send control message",
    112: "unable to receive control message",
    113: "unable to send parameters to server",
    IERECVPARAMS: "unable to receive parameters from client",
    115: "unable to package results",
    116: "unable to send results",
    IERECVRESULTS: "unable to receive results",
    IECLIENTTERM: "the client has terminated",
    IESERVERTERM: "the server has terminated",
    IEACCESSDENIED: "the server is busy running a test. try again later",
    124: "unable to set socket buffer size",
    IEPROTOCOL: "protocol does not exist",
    134: "unable to set TCP_CONGESTION",
    IEAUTHTEST: "test authorization failed",
    IENOMSG: "idle timeout for receiving data",
    200: "unable to create a new stream",
    201: "unable to initialize stream",
    202: "unable to start stream listener",
    203: "unable to connect stream",
    204: "unable to accept stream connection",
    205: "unable to write to stream socket",
    206: "unable to read from stream socket",
    207: "stream socket has closed unexpectedly",
    IESTREAMID: "stream has an invalid id",
}

# Upper bounds on what one length-framed JSON message may be, so a peer cannot make us allocate at will.
# A client's parameters are a few hundred bytes; results grow ~150 bytes per stream (128 at most), more
# when a server attaches its own output.
MAX_PARAMS_MESSAGE = 64 * 1024
MAX_RESULTS_MESSAGE = 16 * 1024 * 1024
# A burstwatch responder may follow ACCESS_DENIED / SERVER_ERROR with one framed JSON object
# {"burstwatch_error": "..."} saying why; iperf3 clients stop reading before it and never see it.
REASON_KEY = "burstwatch_error"
# Set (true) beside the reason when the refusal is temporary (the responder guards its credits or its
# hourly budget): the client should treat it as "busy" and try again later, as iperf3 clients do.
BUSY_KEY = "burstwatch_busy"
MAX_REASON_MESSAGE = 4096
# The most characters of a peer's value quoted in an error (and so in a log line): one bad parameter of
# 60 KB must not make a 60 KB log line.
MAX_QUOTED = 200


def clip(text: str, limit: int = MAX_QUOTED) -> str:
    """`text` cut to `limit` characters, saying how long it was when cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def quote(value: Any) -> str:
    """A peer's value for an error message: its repr, clipped. A huge container is not rendered whole."""
    if isinstance(value, (list, dict)) and len(value) > MAX_QUOTED:
        return f"a {type(value).__name__} of {len(value)} items"
    try:
        return clip(repr(value))
    except RecursionError:
        return f"a deeply nested {type(value).__name__}"


def _finite(value: Any) -> bool:
    """A JSON number that fits the parsers: not a bool, and for a float not inf/nan (an int of any size
    is finite; math.isfinite() of one beyond a float's range raises OverflowError)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


class ProtocolError(Exception):
    """The peer broke the protocol: garbage, an unexpected state, a timeout or a closed connection."""


class PeerClosed(ProtocolError):
    """The peer closed the connection (EOF) where we expected more."""


class Timeout(ProtocolError):
    """Nothing (or not enough) arrived before the deadline."""


def describe_error(code: int, errno_: int = 0) -> str:
    """iperf3's text for an i_errno sent after SERVER_ERROR, as its client would print it."""
    text = ERROR_MESSAGES.get(code, f"int_errno={code}")
    if errno_ > 0:
        try:
            import os

            text += f": {os.strerror(errno_)}"
        except ValueError:
            pass
    return text


def make_cookie() -> bytes:
    """A fresh 37-byte cookie: 36 random characters of COOKIE_CHARS and a NUL."""
    return "".join(secrets.choice(COOKIE_CHARS) for _ in range(COOKIE_SIZE - 1)).encode("ascii") + b"\0"


def cookie_text(cookie: bytes) -> str:
    """The printable part of a cookie (what iperf3 shows in `start.cookie`)."""
    return cookie.split(b"\0", 1)[0].decode("ascii", "replace")


def stream_ids(count: int) -> list[int]:
    """iperf3 numbers streams 1, 3, 4, 5, ... (iperf_api.c iperf_add_stream counts from 2 and then steps
    once per existing stream before assigning), and results are matched on these ids."""
    return [1] + list(range(3, count + 2)) if count > 0 else []


def encode_state(state: int) -> bytes:
    return struct.pack("b", state)


def encode_message(obj: Any) -> bytes:
    """A JSON message as iperf3 frames it: 4-byte big-endian length, then the JSON text (no NUL)."""
    body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return struct.pack("!I", len(body)) + body


def decode_message(body: bytes) -> dict[str, Any]:
    """Parse one message body; anything but a JSON object is a ProtocolError."""
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"malformed JSON message: {clip(str(exc))}") from None
    except RecursionError:
        # 60,000 '[' fit in MAX_PARAMS_MESSAGE; json's parser recurses once per level (issue 13, row 4).
        raise ProtocolError("malformed JSON message: nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"JSON message is a {type(obj).__name__}, not an object")
    return obj


# -- the control connection ----------------------------------------------------------------------------

class Control:
    """Blocking reads and writes on a control socket, each bounded by a timeout."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer

    def recv_exact(self, n: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"timed out after {timeout:g}s waiting for {n - len(buf)} more bytes")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(n - len(buf))
            except socket.timeout:
                raise Timeout(f"timed out after {timeout:g}s waiting for {n - len(buf)} more bytes") from None
            except OSError as exc:
                raise ProtocolError(f"control connection failed: {exc}") from None
            if not chunk:
                raise PeerClosed("the peer closed the control connection")
            buf += chunk
        return bytes(buf)

    def recv_state(self, timeout: float) -> int:
        return int(struct.unpack("b", self.recv_exact(1, timeout))[0])

    def recv_message(self, timeout: float, limit: int) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        (size,) = struct.unpack("!I", self.recv_exact(4, timeout))
        if size > limit:
            raise ProtocolError(f"JSON message of {size} bytes exceeds the {limit}-byte limit")
        body = self.recv_exact(size, max(0.0, deadline - time.monotonic()) or 0.001)
        return decode_message(body)

    def send(self, data: bytes, timeout: float = 10.0) -> None:
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise Timeout(f"timed out after {timeout:g}s sending on the control connection") from None
        except OSError as exc:
            raise ProtocolError(f"control connection failed: {exc}") from None

    def send_state(self, state: int, timeout: float = 10.0) -> None:
        self.send(encode_state(state), timeout)

    def send_message(self, obj: Any, timeout: float = 10.0) -> None:
        self.send(encode_message(obj), timeout)

    def readable(self, timeout: float) -> bool:
        """True when a read would not block (data, EOF or an error is waiting)."""
        try:
            r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        except (OSError, ValueError):
            return True
        return bool(r)


# -- parameters (client -> server, after PARAM_EXCHANGE) -------------------------------------------------

@dataclass(frozen=True)
class TestParams:
    """A client's test parameters as iperf_api.c send_parameters writes them (and get_parameters reads)."""

    protocol: str = "tcp"               # "tcp", "udp" or "sctp"
    duration: int = 10                  # "time", whole seconds; 0 = until `num`/`blockcount`
    omit: int = 0
    num_streams: int = 1                # "parallel"
    reverse: bool = False
    bidirectional: bool = False
    blksize: int = DEFAULT_TCP_BLKSIZE  # "len"
    bytes: int = 0                      # "num": end after this many bytes (0 = off)
    blocks: int = 0                     # "blockcount"
    bandwidth: int = 0                  # bits/s per stream (0 = unlimited)
    fqrate: int = 0
    window: int = 0                     # socket buffer size
    mss: int = 0
    nodelay: bool = False
    tos: int = 0
    congestion: Optional[str] = None
    get_server_output: bool = False
    udp_counters_64bit: bool = False
    client_version: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The parameter object a 3.12 client sends (keys it leaves out when zero are left out)."""
        out: dict[str, Any] = {self.protocol: True, "omit": self.omit, "time": self.duration,
                               "num": self.bytes, "blockcount": self.blocks, "parallel": self.num_streams}
        if self.reverse:
            out["reverse"] = True
        if self.bidirectional:
            out["bidirectional"] = True
        if self.window:
            out["window"] = self.window
        out["len"] = self.blksize
        if self.bandwidth:
            out["bandwidth"] = self.bandwidth
        if self.fqrate:
            out["fqrate"] = self.fqrate
        out["pacing_timer"] = 1000
        if self.mss:
            out["MSS"] = self.mss
        if self.nodelay:
            out["nodelay"] = True
        if self.tos:
            out["TOS"] = self.tos
        if self.congestion:
            out["congestion"] = self.congestion
        if self.get_server_output:
            out["get_server_output"] = 1
        if self.udp_counters_64bit:
            out["udp_counters_64bit"] = 1
        out["client_version"] = self.client_version or IPERF_PROTOCOL_VERSION
        return out


def _num(obj: dict[str, Any], key: str, default: int = 0, lo: int = 0, hi: int = 2**63 - 1) -> int:
    """A numeric parameter as cJSON's valueint would read it, range-checked (ProtocolError if not a number)."""
    value = obj.get(key, default)
    if not _finite(value):
        raise ProtocolError(f"parameter {key!r} is not a number: {quote(value)}")
    ivalue = int(value)
    if not lo <= ivalue <= hi:
        raise ProtocolError(f"parameter {key!r} = {quote(value)} is out of range {lo}..{hi}")
    return ivalue


def parse_params(obj: dict[str, Any]) -> TestParams:
    """Validate a client's parameter object. Types and absurd values are ProtocolErrors; whether the
    responder's caps allow the test is decided elsewhere."""
    protos = [p for p in ("tcp", "udp", "sctp") if p in obj]
    protocol = protos[-1] if protos else "tcp"  # get_parameters lets the last of tcp/udp/sctp win
    default_len = DEFAULT_TCP_BLKSIZE if protocol != "udp" else DEFAULT_UDP_BLKSIZE
    congestion = obj.get("congestion")
    if congestion is not None and (not isinstance(congestion, str) or len(congestion) > 16):
        raise ProtocolError(f"parameter 'congestion' is not an algorithm name: {quote(congestion)}")
    version = obj.get("client_version")
    known = {"tcp", "udp", "sctp", "omit", "time", "num", "blockcount", "parallel", "reverse",
             "bidirectional", "len", "bandwidth", "fqrate", "window", "MSS", "nodelay", "TOS", "congestion",
             "get_server_output", "udp_counters_64bit", "client_version", "pacing_timer"}
    return TestParams(
        protocol=protocol,
        duration=_num(obj, "time", 10, 0, 86400),
        omit=_num(obj, "omit", 0, 0, 600),
        num_streams=_num(obj, "parallel", 1, 1, 1 << 20),
        reverse="reverse" in obj,
        bidirectional="bidirectional" in obj,
        blksize=_num(obj, "len", default_len, 0, 1 << 30),
        bytes=_num(obj, "num"),
        blocks=_num(obj, "blockcount"),
        bandwidth=_num(obj, "bandwidth"),
        fqrate=_num(obj, "fqrate"),
        window=_num(obj, "window", 0, 0, 1 << 31),
        mss=_num(obj, "MSS", 0, 0, 1 << 20),
        nodelay="nodelay" in obj,
        tos=_num(obj, "TOS", 0, 0, 255),
        congestion=congestion,
        get_server_output="get_server_output" in obj,
        udp_counters_64bit="udp_counters_64bit" in obj,
        client_version=version[:32] if isinstance(version, str) else None,
        extra={k: v for k, v in obj.items() if k not in known},
    )


# -- results (exchanged both ways after EXCHANGE_RESULTS) ------------------------------------------------

@dataclass(frozen=True)
class StreamResult:
    id: int
    bytes: int
    retransmits: int = -1     # -1: unknown (a receiver, or no TCP_INFO)
    jitter: float = 0.0       # seconds (UDP receivers)
    errors: int = 0           # UDP datagrams lost
    packets: int = 0          # UDP datagrams
    start_time: float = 0.0
    end_time: float = 0.0


@dataclass(frozen=True)
class Results:
    cpu_total: float = 0.0
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    sender_has_retransmits: int = -1   # 1, 0, or -1 when the side was a receiver
    congestion_used: Optional[str] = None
    streams: tuple[StreamResult, ...] = ()
    server_output_text: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu_util_total": self.cpu_total, "cpu_util_user": self.cpu_user,
                               "cpu_util_system": self.cpu_system,
                               "sender_has_retransmits": self.sender_has_retransmits}
        if self.congestion_used:
            out["congestion_used"] = self.congestion_used
        if self.server_output_text is not None:
            out["server_output_text"] = self.server_output_text
        out["streams"] = [{"id": s.id, "bytes": s.bytes, "retransmits": s.retransmits, "jitter": s.jitter,
                           "errors": s.errors, "packets": s.packets, "start_time": s.start_time,
                           "end_time": s.end_time} for s in self.streams]
        return out


def _signed(value: Any) -> int:
    """iperf3 writes -1 through an unsigned 64-bit path (1.8446744073709552e+19); read that as -1.
    A number beyond 64 bits is no counter at all: ProtocolError."""
    if not _finite(value):
        return -1
    if value > 2**64:
        raise ProtocolError(f"result counter {quote(value)} exceeds 64 bits")
    return -1 if value < 0 or value >= 2**63 else int(value)


def _float(obj: dict[str, Any], key: str) -> float:
    value = obj.get(key, 0.0)
    if _finite(value):
        try:
            return float(value)
        except OverflowError:  # an int beyond a float's range
            pass
    raise ProtocolError(f"result {key!r} is not a number: {quote(value)}")


def parse_results(obj: dict[str, Any]) -> Results:
    """Validate a results object (get_results requires the cpu_util_* keys, sender_has_retransmits and
    streams with id, bytes, retransmits, jitter, errors and packets)."""
    for key in ("cpu_util_total", "cpu_util_user", "cpu_util_system", "sender_has_retransmits", "streams"):
        if key not in obj:
            raise ProtocolError(f"results lack {key!r}")
    raw_streams = obj["streams"]
    if not isinstance(raw_streams, list) or len(raw_streams) > MAX_STREAMS * 2:
        raise ProtocolError("results 'streams' is not a list of at most 256 streams")
    streams = []
    for item in raw_streams:
        if not isinstance(item, dict):
            raise ProtocolError("a results stream is not an object")
        for key in ("id", "bytes", "retransmits", "jitter", "errors", "packets"):
            if key not in item:
                raise ProtocolError(f"a results stream lacks {key!r}")
        streams.append(StreamResult(
            id=_num(item, "id", 0, 0, 1 << 20), bytes=_num(item, "bytes", 0, 0, 2**63 - 1),
            retransmits=_signed(item.get("retransmits")), jitter=_float(item, "jitter"),
            errors=max(0, _signed(item.get("errors"))), packets=max(0, _signed(item.get("packets"))),
            start_time=_float(item, "start_time"), end_time=_float(item, "end_time")))
    has = _signed(obj.get("sender_has_retransmits"))
    congestion = obj.get("congestion_used")
    text = obj.get("server_output_text")
    return Results(cpu_total=_float(obj, "cpu_util_total"), cpu_user=_float(obj, "cpu_util_user"),
                   cpu_system=_float(obj, "cpu_util_system"), sender_has_retransmits=has if has in (0, 1) else -1,
                   congestion_used=congestion if isinstance(congestion, str) else None,
                   streams=tuple(streams), server_output_text=text if isinstance(text, str) else None)
