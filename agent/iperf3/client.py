"""An iperf3-compatible client: one probe against `iperf3 -s` or a burstwatch responder."""

from __future__ import annotations

import logging
import math
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Optional

from agent.iperf3 import protocol as p
from agent.iperf3.params import TestParams
from agent.iperf3.report import Cpu, StartInfo, StreamRecord, build_document
from agent.iperf3.results import Results, StreamResult, parse_results
from agent.iperf3.sockets import connect_data, make_streams
from agent.iperf3.streams import ByteBudget, CpuMeter, Stream, StreamSettings
from agent.iperf3.tcpinfo import congestion_control

log = logging.getLogger(__name__)

# Seconds to wait for the server's results after TEST_END: iperf3 servers answer at once, but a loaded
# one may first have to drain its sockets.
RESULTS_TIMEOUT = 15.0


@dataclass(frozen=True)
class ProbeRequest:
    """One probe. `bitrate` is bits per second *per stream* as iperf3's -b (None: unlimited for TCP,
    iperf3's 1 Mbit/s for UDP); `duration` and `interval` are seconds. `bidir` (iperf3 3.7+'s --bidir):
    `streams` each way at once, in one test; not with `reverse`."""

    host: str
    port: int = p.DEFAULT_PORT
    streams: int = 4
    duration: float = 5.0
    reverse: bool = False
    udp: bool = False
    bitrate: Optional[int] = None
    connect_timeout: float = 5.0
    interval: float = 1.0
    bidir: bool = False


class ProbeError(Exception):
    """A probe that did not complete; str() names the peer ("peer 10.0.1.23:5201: ..."). `kind` is one of
    resolve, connect, busy, refused, server_error, protocol, timeout, stream, invalid."""

    def __init__(self, peer: str, message: str, kind: str = "protocol") -> None:
        super().__init__(f"peer {peer}: {message}")
        self.peer = peer
        self.kind = kind
        self.reason = message


def format_peer(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def validate(req: ProbeRequest) -> Optional[str]:
    """What is wrong with a request (None when it is fine): the first rule it breaks, in this order."""
    rules = (
        (not req.host, "no host"),
        (not 0 < req.port < 65536, f"port {req.port} is not 1..65535"),
        (not 1 <= req.streams <= p.MAX_STREAMS, f"streams {req.streams} is not 1..{p.MAX_STREAMS}"),
        (not 0 < req.duration <= 86400, f"duration {req.duration:g}s is not in (0, 86400]"),
        (not 0.1 <= req.interval <= 60, f"interval {req.interval:g}s is not 0.1..60"),
        (req.bitrate is not None and req.bitrate < 0, f"bitrate {req.bitrate} is negative"),
        (req.connect_timeout <= 0, "connect_timeout must be positive"),
        (req.bidir and req.reverse,
         "bidir and reverse cannot be used together (iperf3: cannot be both reverse and bidirectional)"),
    )
    return next((message for broken, message in rules if broken), None)


def run_probe(req: ProbeRequest) -> dict[str, Any]:
    """Run one test and return iperf3's --json document; raises ProbeError (never anything else for
    network or peer trouble)."""
    problem = validate(req)
    peer = format_peer(req.host, req.port)
    if problem:
        raise ProbeError(peer, problem, "invalid")
    for attempt in range(HANDSHAKE_ATTEMPTS):
        test = _ClientTest(req, peer)
        try:
            return test.run()
        except ProbeError as exc:
            # iperf3's server closes and re-opens its listening socket between tests: a connection that
            # lands in that window is reset before PARAM_EXCHANGE. Only that case is tried again.
            if test.handshake_done or exc.kind != "protocol" or attempt == HANDSHAKE_ATTEMPTS - 1:
                raise
            log.debug("peer=%s: reset during the handshake (%s); trying again", peer, exc)
            time.sleep(0.3)
    raise AssertionError("unreachable")


def _read_reason(ctrl: p.Control) -> tuple[Optional[str], bool]:
    """A burstwatch responder's optional explanation after a refusal (iperf3 servers send none), and
    whether it says the refusal is temporary ("busy": try again later)."""
    try:
        msg = ctrl.recv_message(timeout=1.0, limit=p.MAX_REASON_MESSAGE)
    except (p.ProtocolError, struct.error):
        return None, False
    reason = msg.get(p.REASON_KEY)
    return (str(reason)[:500] if reason else None), msg.get(p.BUSY_KEY) is True


HANDSHAKE_ATTEMPTS = 3


class _ClientTest:
    def __init__(self, req: ProbeRequest, peer: str) -> None:
        self.handshake_done = False
        self.req = req
        self.peer = peer
        self.ctrl: Optional[p.Control] = None
        self.socks: list[socket.socket] = []    # data connections, until they become streams
        self.streams: list[Stream] = []
        self.records: list[StreamRecord] = []
        self.cookie = p.make_cookie()
        self.server_addr: Any = None
        self.family = socket.AF_INET

    def fail(self, message: str, kind: str = "protocol") -> ProbeError:
        return ProbeError(self.peer, message, kind)

    # -- the control conversation ---------------------------------------------------------------------
    def expect(self, wanted: tuple[int, ...], timeout: float, what: str) -> int:
        assert self.ctrl is not None
        try:
            state = self.ctrl.recv_state(timeout)
        except p.PeerClosed:
            raise self.fail(f"the server closed the control connection while we waited for {what}") from None
        except p.Timeout:
            raise self.fail(f"no {what} from the server within {timeout:g}s", "timeout") from None
        except p.ProtocolError as exc:
            raise self.fail(str(exc)) from None
        if state == p.ACCESS_DENIED:
            reason, busy = _read_reason(self.ctrl)
            if reason and busy:
                # A burstwatch responder's credit guard: turned away for now, and why (docs/probes.md,
                # "What a refused client sees"); "busy", so the scheduler does not back off from the peer.
                raise self.fail(f"refused: {reason}", "busy")
            if reason:
                raise self.fail(f"access denied: {reason}", "refused")
            raise self.fail("the server is busy running a test (or refused us: access denied)", "busy")
        if state == p.SERVER_ERROR:
            try:
                code, err = struct.unpack("!ii", self.ctrl.recv_exact(8, 2.0))
            except p.ProtocolError:
                code, err = 0, 0
            reason, _ = _read_reason(self.ctrl)
            text = p.describe_error(code, err) if code else "server error"
            raise self.fail(f"server error: {reason or text}", "refused" if reason else "server_error")
        if state == p.SERVER_TERMINATE:
            raise self.fail("the server has terminated the test", "server_error")
        if state not in wanted:
            raise self.fail(f"unexpected control state {p.STATE_NAMES.get(state, state)} while waiting for {what}")
        return state

    def params(self, mss: Optional[int]) -> TestParams:
        req = self.req
        if req.udp:
            blksize = min(mss or p.DEFAULT_UDP_BLKSIZE, p.MAX_UDP_BLKSIZE)
            rate = p.DEFAULT_UDP_RATE if req.bitrate is None else req.bitrate
        else:
            blksize, rate = p.DEFAULT_TCP_BLKSIZE, req.bitrate or 0
        # iperf3 sends whole seconds; the server only uses them for its own safety timer, and we end the
        # test ourselves at exactly `duration`.
        return TestParams(protocol="udp" if req.udp else "tcp", duration=max(1, math.ceil(req.duration)),
                          num_streams=req.streams, reverse=req.reverse, bidirectional=req.bidir,
                          blksize=blksize, bandwidth=rate)

    def connect_control(self) -> None:
        req = self.req
        try:
            infos = socket.getaddrinfo(req.host, req.port, 0, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise self.fail(f"cannot resolve host: {exc.strerror}", "resolve") from None
        last: Optional[OSError] = None
        for family, stype, proto, _, addr in infos:
            sock = socket.socket(family, stype, proto)
            sock.settimeout(req.connect_timeout)
            try:
                sock.connect(addr)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            self.family, self.server_addr = family, sock.getpeername()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.ctrl = p.Control(sock, self.peer)
            return
        detail = "timed out" if isinstance(last, socket.timeout) else (last.strerror if last else "no address")
        raise self.fail(f"cannot connect: {detail}", "connect")

    def connect_stream(self, sid: int) -> socket.socket:
        req = self.req
        try:
            return connect_data(self.family, self.server_addr, udp=req.udp, cookie=self.cookie,
                                timeout=req.connect_timeout)
        except socket.timeout:
            raise self.fail(f"stream {sid}: no answer from the server within {req.connect_timeout:g}s",
                            "timeout") from None
        except OSError as exc:
            raise self.fail(f"stream {sid}: cannot connect: {exc.strerror or exc}", "stream") from None

    def check_control(self) -> None:
        """During the test the server speaks only to abort; read what it says and raise."""
        assert self.ctrl is not None
        if self.ctrl.readable(0):
            self.expect((), 1.0, "nothing during the test")

    def check_streams(self) -> None:
        for s in self.streams:
            if s.error:
                raise self.fail(f"stream {s.id}: {s.error}", "stream")
            if s.eof and s.counting:
                raise self.fail(f"stream {s.id}: the server closed the data connection during the test",
                                "stream")

    # -- the test ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        except BaseException:
            self.abort()
            raise
        finally:
            self.cleanup()

    def _run(self) -> dict[str, Any]:
        req = self.req
        setup = max(req.connect_timeout, 1.0)
        self.connect_control()
        started_wall = time.time()
        params, mss = self._handshake(setup)
        self._open_streams(params)
        self.expect((p.TEST_START,), setup, "TEST_START")
        self.expect((p.TEST_RUNNING,), setup, "TEST_RUNNING")
        cpu = CpuMeter()
        t0 = time.monotonic()
        self._measure(t0)
        # With --bidir the server sends until it reads TEST_END, and our receivers have stopped counting:
        # say it before waiting for our senders' last write (up to 0.2 s), or the reverse half would read
        # that much low (iperf3's single-threaded client sends TEST_END at once too).
        early_end = req.bidir
        t_end = self._stop_streams(setup, early_end)
        cpu_now = Cpu(*cpu.read())
        congestion = congestion_control(self.streams[0].sock) if not req.udp and self.streams else None
        mine = self._my_results(cpu_now, congestion, t_end - t0)
        theirs = self._exchange_results(mine, setup, early_end)
        assert self.ctrl is not None
        first = self.streams[0].sock if self.streams else self.ctrl.sock
        start = StartInfo(
            host=req.host, port=req.port, cookie=p.cookie_text(self.cookie), protocol="UDP" if req.udp else "TCP",
            num_streams=req.streams, blksize=params.blksize, duration=req.duration, reverse=req.reverse,
            bidir=req.bidir,
            target_bitrate=params.bandwidth, timestamp=started_wall, tcp_mss_default=mss,
            sndbuf_actual=_sockopt(first, socket.SO_SNDBUF), rcvbuf_actual=_sockopt(first, socket.SO_RCVBUF))
        return build_document(start, self.records, t0, t_end, req.interval, theirs, cpu_now, congestion, req.udp)

    def _handshake(self, setup: float) -> tuple[TestParams, Optional[int]]:
        """Cookie, PARAM_EXCHANGE with our parameters, CREATE_STREAMS: the parameters sent and the control
        connection's MSS (None when the kernel does not say)."""
        assert self.ctrl is not None
        ctrl = self.ctrl
        try:
            ctrl.send(self.cookie, setup)
            self.expect((p.PARAM_EXCHANGE,), setup, "PARAM_EXCHANGE")
            try:
                mss: Optional[int] = ctrl.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
            except OSError:
                mss = None
            params = self.params(mss)
            ctrl.send_message(params.to_json(), setup)
            self.expect((p.CREATE_STREAMS,), setup, "CREATE_STREAMS")
            self.handshake_done = True
        except p.ProtocolError as exc:
            raise self.fail(str(exc)) from None
        return params, mss

    def _open_streams(self, params: TestParams) -> None:
        req = self.req
        local_sender = not req.reverse
        # iperf_client_api.c: with --bidir the client makes its sending streams first, then its receiving
        # ones; the server takes them in that order (iperf_server_api.c), and both number them 1, 3, 4, ...
        roles = [True] * req.streams + [False] * req.streams if req.bidir else [local_sender] * req.streams
        settings = StreamSettings(rate=params.bandwidth, blksize=params.blksize)
        for sid in p.stream_ids(len(roles)):
            self.socks.append(self.connect_stream(sid))
        self.streams = make_streams(self.socks, sender=roles, udp=req.udp, settings=settings,
                                    budget=ByteBudget(None), label="c")

    def _measure(self, t0: float) -> None:
        """Start the streams at t0 and sample them every interval until `duration`, watching the control
        connection (the server speaks only to abort) and the streams' health meanwhile."""
        req = self.req
        for s in self.streams:
            self.records.append(StreamRecord(s.id, s.fd, s.sender, _hostport(s.local), _hostport(s.remote)))
        for s, rec in zip(self.streams, self.records):
            rec.samples.append(s.sample(t0))
            s.start(t0)
        t_stop = t0 + req.duration
        boundary = t0 + req.interval
        while True:
            now = time.monotonic()
            wake = min(boundary, t_stop)
            if now < wake:
                assert self.ctrl is not None
                if self.ctrl.readable(min(wake - now, 0.1)):
                    self.check_control()
                self.check_streams()
                continue
            if wake >= t_stop:
                return
            for s, rec in zip(self.streams, self.records):
                rec.samples.append(s.sample(now))
            boundary += req.interval

    def _stop_streams(self, setup: float, early_end: bool) -> float:
        """The end: senders finish their current write, receivers stop counting (and keep draining); the
        last sample is taken when the senders are done. Returns that instant."""
        assert self.ctrl is not None
        for s in self.streams:
            if s.sender:
                s.stop()
            else:
                s.stop_counting()
        if early_end:
            try:
                self.ctrl.send_state(p.TEST_END, setup)
            except p.ProtocolError as exc:
                raise self.fail(str(exc)) from None
        for s in self.streams:
            if s.sender:
                s.join(5.0)
        t_end = time.monotonic()
        for s, rec in zip(self.streams, self.records):
            rec.samples.append(s.sample(t_end))
        return t_end

    def _my_results(self, cpu: Cpu, congestion: Optional[str], duration: float) -> Results:
        has_retrans = -1  # iperf3 says -1 for a side that only received
        if any(r.sender for r in self.records):
            has_retrans = 1 if not self.req.udp and all(r.samples[-1].info is not None for r in self.records
                                                        if r.sender) else 0
        return Results(cpu_total=cpu.total, cpu_user=cpu.user, cpu_system=cpu.system,
                       sender_has_retransmits=has_retrans, congestion_used=congestion,
                       streams=tuple(self._my_result(s, rec, duration)
                                     for s, rec in zip(self.streams, self.records)))

    def _exchange_results(self, mine: Results, setup: float, early_end: bool) -> Results:
        """TEST_END (unless sent already), EXCHANGE_RESULTS both ways, DISPLAY_RESULTS, IPERF_DONE: the
        server's results, checked against our streams."""
        assert self.ctrl is not None
        ctrl = self.ctrl
        try:
            if not early_end:
                ctrl.send_state(p.TEST_END, setup)
            self.expect((p.EXCHANGE_RESULTS,), RESULTS_TIMEOUT, "EXCHANGE_RESULTS")
            ctrl.send_message(mine.to_json(), setup)
            theirs = parse_results(ctrl.recv_message(RESULTS_TIMEOUT, p.MAX_RESULTS_MESSAGE))
            self.expect((p.DISPLAY_RESULTS,), RESULTS_TIMEOUT, "DISPLAY_RESULTS")
            for s in self.streams:
                s.close()
            ctrl.send_state(p.IPERF_DONE, setup)
            self._wait_server_reset()
        except p.ProtocolError as exc:
            raise self.fail(str(exc)) from None
        unknown = {r.id for r in theirs.streams} - {s.id for s in self.streams}
        if unknown:
            raise self.fail(f"results name streams we do not have: {sorted(unknown)}")
        return theirs

    def _wait_server_reset(self, timeout: float = 1.0) -> None:
        """Wait (briefly) for the server to close the control connection after IPERF_DONE.

        iperf3's server resets its test and closes the control socket only after IPERF_DONE; a next
        test that connects before that is told "busy". Waiting for the close makes back-to-back
        probes (the scheduler's, or a script's) reliable."""
        sock = self.ctrl.sock if self.ctrl is not None else None
        if sock is None:
            return
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                if not sock.recv(4096):
                    return
        except OSError:  # timeout or reset: the server is done with us either way
            return

    @staticmethod
    def _my_result(s: Stream, rec: StreamRecord, duration: float) -> StreamResult:
        last, first = rec.samples[-1], rec.samples[0]
        retrans = -1
        if s.sender and last.info is not None:
            retrans = max(0, last.info.total_retrans - (first.info.total_retrans if first.info else 0))
        return StreamResult(id=s.id, bytes=last.bytes, retransmits=retrans, jitter=last.jitter,
                            errors=last.errors, packets=last.packets, start_time=0.0, end_time=duration)

    def abort(self) -> None:
        """Tell the server we are giving up (iperf3's CLIENT_TERMINATE), best effort."""
        if self.ctrl is not None:
            try:
                self.ctrl.send_state(p.CLIENT_TERMINATE, 1.0)
            except (p.ProtocolError, OSError):
                pass

    def cleanup(self) -> None:
        for s in self.streams:
            s.close()
        if not self.streams:
            for sock in self.socks:
                sock.close()
        if self.ctrl is not None:
            try:
                self.ctrl.sock.close()
            except OSError:
                pass


def _hostport(addr: Any) -> tuple[str, int]:
    host, port = str(addr[0]), int(addr[1])
    if host.startswith("::ffff:"):
        host = host[7:]
    return host, port


def _sockopt(sock: socket.socket, opt: int) -> int:
    try:
        return int(sock.getsockopt(socket.SOL_SOCKET, opt))
    except OSError:
        return 0
