"""The responder: an iperf3-compatible server for peers' probes, fenced by an allow list, caps and timeouts."""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import logging
import queue
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from agent.config import ResponderConfig, split_hostport
from agent.iperf3 import protocol as p
from agent.iperf3.streams import ByteBudget, CpuMeter, Stream, StreamSettings
from agent.iperf3.tcpinfo import congestion_control

log = logging.getLogger(__name__)

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
LOOPBACK = ("127.0.0.0/8", "::1/128")

# Connections that have not yet sent their cookie are handled in parallel so that a silent one cannot
# hold the door shut; these bound how many such handshakes run at once (overall, per source).
MAX_PENDING = 16
MAX_PENDING_PER_SOURCE = 4
# Largest socket buffer a client may ask for ("window"); the kernel caps it again at net.core.*mem_max.
MAX_WINDOW = 64 * 1024 * 1024
REFUSAL_REASONS = ("not_allowed", "busy", "rate_limited", "duration", "streams", "bytes", "unsupported")
DROP_REASONS = ("timeout", "garbage", "closed", "terminated", "stream_error", "overload")


@dataclass(frozen=True)
class Timeouts:
    """Seconds each protocol state may take before the responder gives up on the client."""

    cookie: float = 5.0         # connection accepted -> 37-byte cookie
    params: float = 5.0         # PARAM_EXCHANGE sent -> parameters received
    streams: float = 10.0       # CREATE_STREAMS sent -> every data connection made
    stream_cookie: float = 5.0  # data connection accepted -> its cookie
    end_grace: float = 10.0     # the test's own length -> TEST_END (then the test is aborted)
    send_slack: float = 1.0     # a sending responder stops this long after the test's length, TEST_END or not
    results: float = 10.0       # EXCHANGE_RESULTS sent -> the client's results
    done: float = 5.0           # DISPLAY_RESULTS sent -> IPERF_DONE


def parse_allow(items: Sequence[Union[str, Network]]) -> list[Network]:
    return [ipaddress.ip_network(i, strict=False) if isinstance(i, str) else i for i in items]


def resolve_allow(configured: Optional[Sequence[str]], vpc_cidrs: Callable[[], Sequence[str]]) -> list[Network]:
    """The allow list in force: `[responder] allow` when set; else the VPC's CIDRs (from IMDS, via
    `vpc_cidrs`); else loopback only (contract.md). A failing `vpc_cidrs` means loopback, logged."""
    if configured is not None:
        return parse_allow(list(configured))
    try:
        cidrs = list(vpc_cidrs())
    except Exception as exc:
        log.warning("responder: cannot learn the VPC's CIDRs (%s); allowing loopback only", exc)
        cidrs = []
    if cidrs:
        return parse_allow(cidrs)
    return parse_allow(list(LOOPBACK))


def _ip(addr: str) -> Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d
    return ip


def is_allowed(addr: str, allow: Sequence[Network]) -> bool:
    ip = _ip(addr)
    return ip is not None and any(ip.version == n.version and ip in n for n in allow)


class Refused(Exception):
    """A test the responder will not run: `reason` is a REFUSAL_REASONS label, str() the explanation."""

    def __init__(self, reason: str, message: str, code: int = p.IEAUTHTEST) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


class Dropped(Exception):
    """A client dropped for protocol trouble: `reason` is a DROP_REASONS label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_caps(params: p.TestParams, cfg: ResponderConfig) -> None:
    """Raise Refused when the parameters ask for more than `[responder]` allows. Over-long or too-wide
    tests are refused, not clamped: iperf3 clients end a test by their own clock, so a clamped test would
    report a rate over the wrong duration."""
    if params.protocol not in ("tcp", "udp"):
        raise Refused("unsupported", f"protocol {params.protocol} is not supported (TCP and UDP are)", p.IEPROTOCOL)
    if params.bidirectional:
        raise Refused("unsupported", "bidirectional tests are not supported (run one each way)")
    if params.num_streams > cfg.max_streams:
        raise Refused("streams", f"{params.num_streams} streams exceed max_streams {cfg.max_streams}")
    if params.duration == 0 and not params.bytes and not params.blocks:
        raise Refused("duration", f"an open-ended test (time 0 without a byte or block count) exceeds "
                      f"max_duration {cfg.max_duration:g}s")
    if params.duration + params.omit > cfg.max_duration:
        raise Refused("duration", f"{params.duration + params.omit}s (time + omit) exceeds max_duration "
                      f"{cfg.max_duration:g}s")
    limit = params.bytes or params.blocks * params.blksize
    if limit > cfg.max_bytes:
        raise Refused("bytes", f"{limit} bytes exceed max_bytes {cfg.max_bytes}")
    if params.protocol == "udp":
        if not 16 <= params.blksize <= p.MAX_UDP_BLKSIZE:
            raise Refused("unsupported", f"UDP block size {params.blksize} is not 16..{p.MAX_UDP_BLKSIZE}",
                          p.IEUDPBLOCKSIZE)
        # UDP goes at the asked rate whatever the receiver does, so its volume is known in advance.
        planned = params.bandwidth / 8 * params.num_streams * (params.duration or cfg.max_duration)
        if planned > cfg.max_bytes:
            raise Refused("bytes", f"{params.num_streams} x {params.bandwidth} bit/s for "
                          f"{params.duration or cfg.max_duration:g}s is {planned:.0f} bytes, over max_bytes "
                          f"{cfg.max_bytes}")
    elif not 1 <= params.blksize <= p.MAX_TCP_BLKSIZE:
        raise Refused("unsupported", f"block size {params.blksize} is not 1..{p.MAX_TCP_BLKSIZE}", p.IEBLOCKSIZE)


class RateLimiter:
    """At most `per_hour` tests per source address in any sliding hour."""

    def __init__(self, per_hour: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_hour = per_hour
        self.clock = clock
        self._seen: dict[str, collections.deque[float]] = {}
        self._lock = threading.Lock()

    def allow(self, source: str) -> bool:
        """Record a test from `source` and say whether it is within the limit (refusals are not recorded)."""
        now = self.clock()
        with self._lock:
            for key in [k for k, q in self._seen.items() if not q or q[-1] <= now - 3600]:
                del self._seen[key]
            q = self._seen.setdefault(source, collections.deque())
            while q and q[0] <= now - 3600:
                q.popleft()
            if len(q) >= self.per_hour:
                return False
            q.append(now)
            return True


@dataclass(frozen=True)
class ResponderSnapshot:
    """The responder's counters at one instant, for the Prometheus view and `burstwatch status`."""

    listening: bool
    busy: bool
    connections: int
    tests: dict[str, int]          # result ("completed", "aborted") -> tests
    refused: dict[str, int]        # REFUSAL_REASONS -> refusals
    dropped: dict[str, int]        # DROP_REASONS -> connections or tests dropped
    bytes: dict[str, int]          # "in" (received by the responder), "out" (sent by it)
    last_test_timestamp: float     # Unix time the last test ended; 0 before the first
    allowed_networks: tuple[str, ...] = ()


class ResponderStats:
    """Thread-safe counters; `snapshot()` includes the bytes of a test still running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.listening = False
        self.connections = 0
        self.tests = {"completed": 0, "aborted": 0}
        self.refused = {r: 0 for r in REFUSAL_REASONS}
        self.dropped = {r: 0 for r in DROP_REASONS}
        self.bytes = {"in": 0, "out": 0}
        self.last_test = 0.0
        self.allowed: tuple[str, ...] = ()
        self._live: Optional[Callable[[], tuple[int, int]]] = None

    def count(self, table: str, key: str) -> None:
        with self._lock:
            getattr(self, table)[key] += 1

    def connection(self) -> None:
        with self._lock:
            self.connections += 1

    def set_live(self, live: Optional[Callable[[], tuple[int, int]]]) -> None:
        with self._lock:
            self._live = live

    def finish(self, result: str, bytes_in: int, bytes_out: int) -> None:
        with self._lock:
            self.tests[result] += 1
            self.bytes["in"] += bytes_in
            self.bytes["out"] += bytes_out
            self.last_test = time.time()
            self._live = None

    def snapshot(self) -> ResponderSnapshot:
        with self._lock:
            live_in = live_out = 0
            if self._live is not None:
                live_in, live_out = self._live()
            return ResponderSnapshot(
                listening=self.listening, busy=self._live is not None, connections=self.connections,
                tests=dict(self.tests), refused=dict(self.refused), dropped=dict(self.dropped),
                bytes={"in": self.bytes["in"] + live_in, "out": self.bytes["out"] + live_out},
                last_test_timestamp=self.last_test, allowed_networks=self.allowed)


def _refuse(conn: socket.socket, reason_text: Optional[str], state: int = p.ACCESS_DENIED) -> None:
    """Answer a connection we will not serve without ever blocking: take whatever the client already
    sent (so closing does not turn into a reset), send ACCESS_DENIED and, for burstwatch clients, why."""
    try:
        conn.setblocking(False)
        try:
            conn.recv(256)
        except OSError:
            pass
        data = p.encode_state(state)
        if reason_text:
            data += p.encode_message({p.REASON_KEY: reason_text})
        conn.send(data)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()


def _valid_cookie(cookie: bytes) -> bool:
    """iperf3 cookies are 36 printable characters and a NUL; anything else is not an iperf3 client."""
    return len(cookie) == p.COOKIE_SIZE and cookie[-1] == 0 and all(0x21 <= b <= 0x7E for b in cookie[:-1])


class Responder:
    """The responder as a daemon service (`start`/`stop`) or standalone (`serve_forever`).

    One test at a time; a connection that arrives while a test runs gets ACCESS_DENIED at once, as
    iperf3's server does (iperf_server_api.c iperf_accept: "the server is busy running a test").
    Connections still owing their cookie do not make the responder busy: each waits in its own thread,
    so a silent client only wastes its own time."""

    name = "responder"

    def __init__(self, cfg: ResponderConfig, allow: Sequence[Union[str, Network]], *,
                 timeouts: Optional[Timeouts] = None, clock: Callable[[], float] = time.monotonic,
                 stats: Optional[ResponderStats] = None) -> None:
        self.cfg = cfg
        self.allow = parse_allow(allow)
        self.timeouts = timeouts or Timeouts()
        self.clock = clock
        self.stats = stats or ResponderStats()
        self.stats.allowed = tuple(str(n) for n in self.allow)
        self.limiter = RateLimiter(cfg.max_tests_per_hour, clock)
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._active: Optional[_ServerTest] = None
        # True while this host runs a probe of its own: a test served meanwhile would compete with it on
        # the same NIC, so clients are told "busy" then too (the daemon wires the probe service in).
        self.external_busy: Callable[[], bool] = lambda: False
        self._pending: collections.Counter[str] = collections.Counter()
        self._waiting: set[socket.socket] = set()  # connections still owing their cookie
        self._threads: list[threading.Thread] = []
        self._thread: Optional[threading.Thread] = None
        self.address: tuple[str, int] = ("", 0)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def bind(self) -> None:
        host, port = split_hostport(self.cfg.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        if host and ":" not in host and not _is_ip(host):
            family = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "[::]" serves IPv4 too
            sock.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.address = sock.getsockname()[:2]
        self.stats.listening = True
        log.info("responder listening on %s port %d; allowed sources: %s", self.address[0], self.address[1],
                 ", ".join(str(n) for n in self.allow) or "none")

    def start(self) -> None:
        """Bind and serve in a thread. A port already in use is logged and shown as
        burstwatch_responder_listening 0; the daemon keeps running."""
        try:
            self.bind()
        except OSError as exc:
            log.error("responder cannot listen on %s: %s", self.cfg.listen, exc)
            self.stats.listening = False
            return
        self._thread = threading.Thread(target=self.serve_forever, name="responder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            test = self._active
            for conn in self._waiting:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if test is not None:
            test.abort()
        deadline = time.monotonic() + timeout
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.stats.listening = False

    def reconfigure(self, cfg: ResponderConfig, allow: Sequence[Union[str, Network]]) -> None:
        """Apply a reloaded `[responder]` (SIGHUP): caps and the allow list take effect for the next test;
        a new `listen` needs a restart (logged), as metrics.listen does."""
        if cfg.listen != self.cfg.listen:
            log.warning("responder.listen changed to %s; it takes effect at the next restart", cfg.listen)
            cfg = dataclasses.replace(cfg, listen=self.cfg.listen)
        self.cfg = cfg
        self.allow = parse_allow(allow)
        self.stats.allowed = tuple(str(n) for n in self.allow)
        self.limiter.per_hour = cfg.max_tests_per_hour

    def serve_forever(self) -> None:
        """Accept connections until stop(); binds first when start() did not."""
        if self._sock is None:
            self.bind()
        assert self._sock is not None
        lsock = self._sock
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([lsock], [], [], 0.25)
            except (OSError, ValueError):
                break
            if not ready:
                continue
            try:
                conn, addr = lsock.accept()
            except OSError as exc:
                log.debug("responder: accept failed: %s", exc)
                continue
            self.stats.connection()
            try:
                self._dispatch(conn, str(addr[0]))
            except Exception:  # one bad connection must never stop the responder
                log.exception("responder: dispatching a connection from %s failed", addr[0])
                conn.close()
        self._threads = [t for t in self._threads if t.is_alive()]

    # -- connections -------------------------------------------------------------------------------------
    def _dispatch(self, conn: socket.socket, src: str) -> None:
        source = str(_ip(src) or src)
        if not is_allowed(src, self.allow):
            log.info("responder: refused peer=%s reason=not_allowed", source)
            self.stats.count("refused", "not_allowed")
            _refuse(conn, f"source {source} is not in the responder's allow list")
            return
        with self._lock:
            test = self._active
            if test is not None and test.wants_stream_from(source):
                test.offer(conn)
                return
            busy = (test is not None and not test.finishing) or self._stop.is_set() or self.external_busy()
            overloaded = (sum(self._pending.values()) >= MAX_PENDING
                          or self._pending[source] >= MAX_PENDING_PER_SOURCE)
            if not busy and not overloaded:
                self._pending[source] += 1
                self._waiting.add(conn)
        if busy:
            log.info("responder: refused peer=%s reason=busy", source)
            self.stats.count("refused", "busy")
            _refuse(conn, None)
            return
        if overloaded:
            log.warning("responder: dropped peer=%s reason=overload (too many connections owe a cookie)", source)
            self.stats.count("dropped", "overload")
            conn.close()
            return
        t = threading.Thread(target=self._handshake, args=(conn, source), name=f"responder-{source}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _handshake(self, conn: socket.socket, source: str) -> None:
        # One-byte state messages go out back to back (TEST_START, TEST_RUNNING): without TCP_NODELAY
        # Nagle holds the second until the first is ACKed, and a delayed ACK makes that 40 ms (iperf3
        # sets TCP_NODELAY on its control socket too, iperf_server_api.c iperf_accept).
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        ctrl = p.Control(conn, source)
        claimed = False
        try:
            try:
                cookie = ctrl.recv_exact(p.COOKIE_SIZE, self.timeouts.cookie)
            except p.Timeout:
                raise Dropped("timeout", f"no cookie within {self.timeouts.cookie:g}s") from None
            except p.PeerClosed:
                raise Dropped("closed", "closed before sending a cookie") from None
            except p.ProtocolError as exc:
                raise Dropped("closed", str(exc)) from None
            if not _valid_cookie(cookie):
                raise Dropped("garbage", "sent something that is not an iperf3 cookie")
            with self._cond:
                self._release(conn, source)
                claimed = True
                # A test that has shown its results is as good as over: wait for it rather than turn away
                # a client that starts its next test the moment the last one ended.
                deadline = time.monotonic() + 2.0
                while (self._active is not None and self._active.finishing and not self._stop.is_set()
                       and time.monotonic() < deadline):
                    self._cond.wait(max(0.0, deadline - time.monotonic()))
                busy = self._active is not None or self._stop.is_set() or self.external_busy()
                test = None if busy else _ServerTest(self, ctrl, source, cookie)
                if test is not None:
                    self._active = test
            if test is None:
                log.info("responder: refused peer=%s reason=busy", source)
                self.stats.count("refused", "busy")
                _refuse(conn, None)
                return
            try:
                if not self.limiter.allow(source):
                    self.stats.count("refused", "rate_limited")
                    log.info("responder: refused peer=%s reason=rate_limited (max_tests_per_hour %d)", source,
                             self.cfg.max_tests_per_hour)
                    _refuse(conn, f"source {source} already ran {self.cfg.max_tests_per_hour} tests in the last "
                                  "hour (max_tests_per_hour)")
                    return
                test.run()
            finally:
                with self._cond:
                    self._active = None
                    self._cond.notify_all()
        except Dropped as exc:
            log.info("responder: dropped peer=%s reason=%s: %s", source, exc.reason, exc)
            self.stats.count("dropped", exc.reason)
            conn.close()
        except Exception:
            log.exception("responder: handshake with %s failed", source)
            conn.close()
        finally:
            if not claimed:
                with self._lock:
                    self._release(conn, source)

    def _release(self, conn: socket.socket, source: str) -> None:
        """A connection no longer owes its cookie (call with the lock held)."""
        self._waiting.discard(conn)
        self._pending[source] -= 1
        if self._pending[source] <= 0:
            del self._pending[source]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _ServerTest:
    """One test from PARAM_EXCHANGE to IPERF_DONE, run in the handshake thread."""

    def __init__(self, responder: Responder, ctrl: p.Control, source: str, cookie: bytes) -> None:
        self.r = responder
        self.cfg = responder.cfg
        self.t = responder.timeouts
        self.ctrl = ctrl
        self.source = source
        self.cookie = cookie
        self.params: Optional[p.TestParams] = None
        self.incoming: queue.Queue[socket.socket] = queue.Queue()
        self.accepting = False
        self.streams: list[Stream] = []
        self.udp_sock: Optional[socket.socket] = None
        self.aborted = threading.Event()
        self.finishing = False  # results shown (or the test failed): a new client may queue up

    def wants_stream_from(self, source: str) -> bool:
        return self.accepting and source == self.source

    def offer(self, conn: socket.socket) -> None:
        self.incoming.put(conn)

    def abort(self) -> None:
        """Called from another thread (stop()): unblock everything this test waits on."""
        self.aborted.set()
        try:
            self.ctrl.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for s in list(self.streams):
            s.stop()

    def live_bytes(self) -> tuple[int, int]:
        bytes_in = sum(s.bytes for s in self.streams if not s.sender)
        bytes_out = sum(s.bytes for s in self.streams if s.sender)
        return bytes_in, bytes_out

    # -- the state machine -------------------------------------------------------------------------------
    def run(self) -> None:
        stats = self.r.stats
        stats.set_live(self.live_bytes)
        result: Optional[str] = "aborted"
        try:
            self._run()
            result = "completed"
        except Refused as exc:
            result = None  # counted as a refusal, not as a test
            stats.count("refused", exc.reason)
            log.info("responder: refused peer=%s reason=%s: %s", self.source, exc.reason, exc)
            self._send_error(exc.code, str(exc))
        except Dropped as exc:
            stats.count("dropped", exc.reason)
            log.info("responder: dropped peer=%s reason=%s: %s", self.source, exc.reason, exc)
        except Exception:
            stats.count("dropped", "stream_error")
            log.exception("responder: test from %s failed", self.source)
        finally:
            self.accepting = False
            self.finishing = True
            for s in self.streams:
                s.close()
            self._drain_incoming()
            if self.udp_sock is not None:
                self.udp_sock.close()
            bytes_in, bytes_out = self.live_bytes()
            if result is None:
                stats.set_live(None)
            else:
                stats.finish(result, bytes_in, bytes_out)
            try:
                self.ctrl.sock.close()
            except OSError:
                pass
        if result is not None:
            log.info("responder: test from %s %s: %d bytes in, %d bytes out", self.source, result, bytes_in,
                     bytes_out)

    def _send_error(self, code: int, text: str) -> None:
        """SERVER_ERROR, i_errno, errno (iperf_api.c iperf_exchange_parameters), then our reason."""
        # A refused test is over: a client that tries again the moment it reads the error must find the
        # responder free, not busy (the same rule as after DISPLAY_RESULTS).
        self.finishing = True
        try:
            self.ctrl.send(p.encode_state(p.SERVER_ERROR) + struct.pack("!ii", code, 0)
                           + p.encode_message({p.REASON_KEY: text}), 2.0)
            self.ctrl.sock.shutdown(socket.SHUT_WR)
            self.ctrl.recv_exact(1, 1.0)  # let the client close first; it will not send more
        except (p.ProtocolError, OSError):
            pass

    def _recv_state(self, timeout: float, what: str) -> int:
        try:
            return self.ctrl.recv_state(timeout)
        except p.Timeout:
            raise Dropped("timeout", f"no {what} within {timeout:g}s") from None
        except p.PeerClosed:
            raise Dropped("closed", f"closed the control connection before {what}") from None
        except p.ProtocolError as exc:
            raise Dropped("closed", str(exc)) from None

    def _send_state(self, state: int) -> None:
        try:
            self.ctrl.send_state(state, 5.0)
        except p.ProtocolError as exc:
            raise Dropped("closed", str(exc)) from None

    def _run(self) -> None:
        t, ctrl = self.t, self.ctrl
        self._send_state(p.PARAM_EXCHANGE)
        try:
            params = p.parse_params(ctrl.recv_message(t.params, p.MAX_PARAMS_MESSAGE))
        except p.Timeout:
            raise Dropped("timeout", f"no parameters within {t.params:g}s") from None
        except p.PeerClosed:
            raise Dropped("closed", "closed before sending parameters") from None
        except (p.ProtocolError, struct.error) as exc:
            raise Dropped("garbage", f"bad parameters: {exc}") from None
        self.params = params
        check_caps(params, self.cfg)
        udp = params.protocol == "udp"
        if udp:
            self.udp_sock = self._udp_listener()
        log.info("responder: test from %s: %s, %d streams, %ds, %s", self.source, params.protocol.upper(),
                 params.num_streams, params.duration, "reverse (we send)" if params.reverse else "we receive")

        self.accepting = True
        self._send_state(p.CREATE_STREAMS)
        socks = self._collect_udp(params) if udp else self._collect_tcp(params)
        self.accepting = False
        self._drain_incoming()

        length = (params.duration + params.omit) or self.cfg.max_duration
        asked = params.bytes or params.blocks * params.blksize
        budget = ByteBudget(min(self.cfg.max_bytes, asked) if asked else self.cfg.max_bytes)
        for sock in socks:
            self._apply_options(sock, params)
        self._send_state(p.TEST_START)
        self._send_state(p.TEST_RUNNING)
        cpu = CpuMeter()
        t0 = time.monotonic()
        settings = StreamSettings(rate=params.bandwidth, blksize=params.blksize,
                                  udp_counters_64bit=params.udp_counters_64bit,
                                  deadline=t0 + min(length, self.cfg.max_duration) + t.send_slack)
        for sid, sock in zip(p.stream_ids(len(socks)), socks):
            self.streams.append(Stream(sid, sock, sender=params.reverse, udp=udp, settings=settings,
                                       budget=budget, label="r"))
        first = [s.sample(t0) for s in self.streams]
        for s in self.streams:
            s.start(t0)

        # Running: the client speaks next, with TEST_END, when its clock says the test is over.
        deadline = t0 + min(length, self.cfg.max_duration) + t.end_grace
        # With --omit the client leaves the first seconds out; so do our results (iperf_reset_stats).
        omit_at = t0 + params.omit if params.omit else None
        while True:
            if self.aborted.is_set():
                raise Dropped("terminated", "the responder is stopping")
            now = time.monotonic()
            if omit_at is not None and now >= omit_at:
                t0, first, omit_at = now, [s.sample(now) for s in self.streams], None
            left = deadline - now
            if left <= 0:
                raise Dropped("timeout", f"no TEST_END within {length}s + {t.end_grace:g}s")
            if not ctrl.readable(min(left, 0.5, (omit_at - now) if omit_at is not None else 0.5)):
                continue
            # Stamp the end before anything else: under GIL contention from busy stream threads every
            # further step may wait a switch interval (5 ms), and the client's end is now.
            t_end = time.monotonic()
            state = self._recv_state(1.0, "TEST_END")
            if state == p.TEST_END:
                break
            if state == p.CLIENT_TERMINATE:
                raise Dropped("terminated", "the client terminated the test")
            raise Dropped("garbage", f"sent state {state} during the test")

        # As iperf3: stop and close the data connections, then exchange results.
        # Byte counts are read after the workers have finished their last call, so what we report is
        # exactly what we sent or took (and what burstwatch_responder_bytes_total counts).
        for s in self.streams:
            s.stop()
        last = [s.sample(t_end) for s in self.streams]  # TCP_INFO while the sockets are open
        congestion = congestion_control(socks[0]) if socks and not udp else None
        for s in self.streams:
            s.close()
        last = [dataclasses.replace(x, bytes=s.bytes, packets=s.packets, errors=s.errors,
                                    outoforder=s.outoforder, jitter=s.jitter) for s, x in zip(self.streams, last)]
        total, user, system = cpu.read()
        has_retrans = -1
        if params.reverse:
            has_retrans = 1 if not udp and all(x.info is not None for x in last) else 0
        mine = p.Results(
            cpu_total=total, cpu_user=user, cpu_system=system, sender_has_retransmits=has_retrans,
            congestion_used=congestion,
            streams=tuple(p.StreamResult(
                id=s.id, bytes=b.bytes - a.bytes,
                retransmits=(b.info.total_retrans - (a.info.total_retrans if a.info else 0))
                if s.sender and b.info is not None else -1,
                jitter=b.jitter, errors=b.errors - a.errors, packets=b.packets - a.packets, start_time=0.0,
                end_time=t_end - t0)
                for s, a, b in zip(self.streams, first, last)),
            server_output_text=self._summary(t_end - t0) if params.get_server_output else None)
        self._send_state(p.EXCHANGE_RESULTS)
        try:
            p.parse_results(ctrl.recv_message(t.results, 1024 * 1024))
        except p.Timeout:
            raise Dropped("timeout", f"no results within {t.results:g}s") from None
        except p.PeerClosed:
            raise Dropped("closed", "closed before sending results") from None
        except (p.ProtocolError, struct.error) as exc:
            raise Dropped("garbage", f"bad results: {exc}") from None
        try:
            ctrl.send_message(mine.to_json(), 5.0)
        except p.ProtocolError as exc:
            raise Dropped("closed", str(exc)) from None
        # Marked before the client can read it: a client that starts its next test the moment it has
        # sent IPERF_DONE must find the responder free, not busy.
        self.finishing = True
        self._send_state(p.DISPLAY_RESULTS)
        try:
            state = ctrl.recv_state(t.done)
            if state != p.IPERF_DONE:
                log.debug("responder: %s ended with state %s instead of IPERF_DONE", self.source, state)
        except p.ProtocolError:
            pass  # the results are exchanged: a client that leaves without IPERF_DONE still completed

    def _summary(self, seconds: float) -> str:
        lines = [f"burstwatch responder: {len(self.streams)} streams, {seconds:.2f} s"]
        for s in self.streams:
            lines.append(f"[{s.id:3d}] {s.bytes} bytes {'sent' if s.sender else 'received'}"
                         f" {s.bytes * 8 / seconds / 1e6 if seconds > 0 else 0:.1f} Mbit/s")
        return "\n".join(lines) + "\n"

    def _apply_options(self, sock: socket.socket, params: p.TestParams) -> None:
        """The socket options a client may ask for, within reason; failures are ignored as iperf3 warns."""
        opts: list[tuple[int, int, Any]] = []
        if params.window:
            w = min(params.window, MAX_WINDOW)
            opts += [(socket.SOL_SOCKET, socket.SO_SNDBUF, w), (socket.SOL_SOCKET, socket.SO_RCVBUF, w)]
        if params.protocol == "tcp":
            if params.nodelay:
                opts.append((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1))
            if params.congestion:
                opts.append((socket.IPPROTO_TCP, getattr(socket, "TCP_CONGESTION", 13),
                             params.congestion.encode("ascii", "replace")))
        if params.tos:
            opts.append((socket.IPPROTO_IP, socket.IP_TOS, params.tos))
        if params.fqrate and hasattr(socket, "SO_MAX_PACING_RATE"):
            opts.append((socket.SOL_SOCKET, socket.SO_MAX_PACING_RATE, min(params.fqrate // 8, 2**32 - 1)))
        for level, opt, value in opts:
            try:
                sock.setsockopt(level, opt, value)
            except OSError as exc:
                log.debug("responder: setsockopt(%s, %s) failed: %s", level, opt, exc)

    def _collect_tcp(self, params: p.TestParams) -> list[socket.socket]:
        """Accept the client's data connections (offered by the accept loop), checking each one's cookie."""
        socks: list[socket.socket] = []
        deadline = time.monotonic() + self.t.streams
        try:
            while len(socks) < params.num_streams:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Dropped("timeout", f"made {len(socks)} of {params.num_streams} streams within "
                                  f"{self.t.streams:g}s")
                self._check_ctrl_quiet()
                try:
                    conn = self.incoming.get(timeout=min(left, 0.2))
                except queue.Empty:
                    continue
                got = self._stream_cookie(conn, max(0.1, min(self.t.stream_cookie, deadline - time.monotonic())))
                if got == self.cookie:
                    socks.append(conn)
                else:
                    # iperf_tcp.c iperf_tcp_accept: a wrong cookie gets ACCESS_DENIED; the test goes on.
                    _refuse(conn, None)
        except BaseException:
            for s in socks:
                s.close()
            raise
        return socks

    def _stream_cookie(self, conn: socket.socket, timeout: float) -> Optional[bytes]:
        try:
            return p.Control(conn, self.source).recv_exact(p.COOKIE_SIZE, timeout)
        except p.ProtocolError:
            return None

    def _check_ctrl_quiet(self) -> None:
        """Before TEST_START the client says nothing; data (or EOF) on the control connection ends the test."""
        if self.aborted.is_set():
            raise Dropped("terminated", "the responder is stopping")
        if self.ctrl.readable(0):
            state = self._recv_state(1.0, "streams")
            if state == p.CLIENT_TERMINATE:
                raise Dropped("terminated", "the client terminated the test")
            raise Dropped("garbage", f"sent state {state} while streams were being made")

    def _udp_listener(self) -> socket.socket:
        host, port = self.r.address[0], self.r.address[1]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise Refused("unsupported", f"cannot listen for UDP on port {port}: {exc}", 202) from None
        return sock

    def _collect_udp(self, params: p.TestParams) -> list[socket.socket]:
        """iperf_udp.c's handshake: a datagram from the client, `connect` back to its address, reply, and a
        fresh listener for the next stream. Datagrams from any address but the control peer's are ignored,
        so a spoofed source cannot point the responder's traffic elsewhere."""
        socks: list[socket.socket] = []
        deadline = time.monotonic() + self.t.streams
        try:
            while len(socks) < params.num_streams:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Dropped("timeout", f"made {len(socks)} of {params.num_streams} UDP streams within "
                                  f"{self.t.streams:g}s")
                self._check_ctrl_quiet()
                assert self.udp_sock is not None
                ready, _, _ = select.select([self.udp_sock], [], [], min(left, 0.2))
                if not ready:
                    continue
                try:
                    _, addr = self.udp_sock.recvfrom(64)
                except OSError:
                    continue
                if str(_ip(str(addr[0])) or addr[0]) != self.source:
                    continue
                sock = self.udp_sock
                sock.connect(addr)
                self.udp_sock = self._udp_listener()
                sock.send(p.UDP_CONNECT_REPLY)
                socks.append(sock)
        except BaseException:
            for s in socks:
                s.close()
            raise
        return socks

    def _drain_incoming(self) -> None:
        while True:
            try:
                conn = self.incoming.get_nowait()
            except queue.Empty:
                return
            _refuse(conn, None)

