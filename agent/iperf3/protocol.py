"""iperf3's control protocol (3.x): states, error codes, cookie, length-framed JSON and the control connection.

The parameter object is parsed in params.py and the results object in results.py."""

from __future__ import annotations

import json
import math
import secrets
import select
import socket
import struct
import time
from typing import Any

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


def finite_number(value: Any) -> bool:
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


def json_int(obj: dict[str, Any], key: str, default: int = 0, lo: int = 0, hi: int = 2**63 - 1) -> int:
    """A numeric parameter as cJSON's valueint would read it, range-checked (ProtocolError if not a number)."""
    value = obj.get(key, default)
    if not finite_number(value):
        raise ProtocolError(f"parameter {key!r} is not a number: {quote(value)}")
    ivalue = int(value)
    if not lo <= ivalue <= hi:
        raise ProtocolError(f"parameter {key!r} = {quote(value)} is out of range {lo}..{hi}")
    return ivalue


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
    """iperf3 numbers streams 1, 3, 4, 5, ... (iperf_api.c iperf_add_stream counts from 2 and then adds one
    per existing stream before assigning), and results are matched on these ids."""
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
        # 60,000 '[' fit in MAX_PARAMS_MESSAGE; json's parser recurses once per level (docs/security.md,
        # "Responder limits").
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
