"""One test's state machine on the responder: parameters, streams, the running test, results."""

from __future__ import annotations

import dataclasses
import logging
import queue
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from agent.config import ResponderConfig
from agent.iperf3 import protocol as p
from agent.iperf3.params import TestParams, parse_params
from agent.iperf3.results import Results, StreamResult, parse_results
from agent.iperf3.sockets import answer_udp, apply_test_options, bind_socket, make_streams
from agent.iperf3.streams import ByteBudget, CpuMeter, Sample, Stream, StreamSettings
from agent.iperf3.tcpinfo import congestion_control
from agent.responder.logs import LogLimiter
from agent.responder.policy import Refused, check_caps, client_ip, data_connections
from agent.responder.refusals import Dropped, deny
from agent.responder.stats import ResponderStats

log = logging.getLogger(__name__)

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


class Session:
    """One test from PARAM_EXCHANGE to IPERF_DONE, run on its own thread once the accept loop has read
    the client's cookie. `address` is the responder's own (host, port): UDP streams are made there."""

    def __init__(self, ctrl: p.Control, source: str, cookie: bytes, *, cfg: ResponderConfig,
                 timeouts: Timeouts, stats: ResponderStats, address: tuple[str, int],
                 admit: Optional[Callable[[TestParams], None]] = None,
                 events: Optional[LogLimiter] = None) -> None:
        self.cfg = cfg
        # Raises Refused for a test the responder will not run (caps, credit guard); default: the caps.
        self.admit = admit or (lambda params: check_caps(params, cfg))
        self.t = timeouts
        self.stats = stats
        self.events = events or LogLimiter(log)
        self.address = address
        self.ctrl = ctrl
        self.source = source
        self.cookie = cookie
        self.params: Optional[TestParams] = None
        # Data connections whose cookie the accept loop has checked, for _collect. Bounded: a test never
        # needs more than max_streams, and a client that opens more gets them closed (docs/security.md,
        # "Responder limits").
        self.incoming: queue.Queue[socket.socket] = queue.Queue(maxsize=max(1, cfg.max_streams))
        self.accepting = False
        # Cookie and parameters accepted: only such a test counts in tests_total (docs/security.md,
        # "Responder limits").
        self.started = False
        self.streams: list[Stream] = []
        self.udp_sock: Optional[socket.socket] = None
        self.aborted = threading.Event()
        self.finishing = False  # results shown (or the test failed): a new client may queue up

    def wants_stream_from(self, source: str) -> bool:
        return self.accepting and source == self.source

    def data_connections(self) -> int:
        """How many data connections the test makes (0 before its parameters are known)."""
        return data_connections(self.params) if self.params is not None else 0

    def offer(self, conn: socket.socket) -> bool:
        """A data connection with the test's cookie; False when the test has all it asked for."""
        try:
            self.incoming.put_nowait(conn)
        except queue.Full:
            return False
        return True

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
        stats = self.stats
        stats.set_live(self.live_bytes)
        # None: not a test (refused, or dropped before its parameters were accepted): it counts only
        # under its refusal or drop reason, never in tests_total.
        result: Optional[str] = None
        try:
            self._run()
            result = "completed"
        except Refused as exc:
            stats.count("refused", exc.reason)
            self.events.log(logging.INFO, f"refused {exc.reason}", "responder: refused peer=%s reason=%s: %s",
                            self.source, exc.reason, str(exc))
            if exc.busy:
                self._send_refusal(p.encode_state(p.ACCESS_DENIED), str(exc), busy=True)
            else:
                self._send_refusal(p.encode_state(p.SERVER_ERROR) + struct.pack("!ii", exc.code, 0), str(exc))
        except Dropped as exc:
            result = "aborted" if self.started else None
            stats.count("dropped", exc.reason)
            self.events.log(logging.INFO, f"dropped {exc.reason}", "responder: dropped peer=%s reason=%s: %s",
                            self.source, exc.reason, str(exc))
        except Exception:
            result = "aborted" if self.started else None
            stats.count("dropped", "stream_error")
            self.events.log(logging.ERROR, "dropped stream_error", "responder: test from %s failed",
                            self.source, exc_info=True)
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
                stats.finish(result, bytes_in, bytes_out, self.source)
            try:
                self.ctrl.sock.close()
            except OSError:
                pass
        if result is not None:
            log.info("responder: test from %s %s: %d bytes in, %d bytes out", self.source, result, bytes_in,
                     bytes_out)

    def _send_refusal(self, head: bytes, text: str, busy: bool = False) -> None:
        """Refuse after the parameter exchange: SERVER_ERROR, i_errno, errno (iperf_api.c
        iperf_exchange_parameters) for a test we will never run, or ACCESS_DENIED for one a client may
        try again later (iperf3 prints "the server is busy"); then our reason for burstwatch clients."""
        # A refused test is over: a client that tries again the moment it reads the error must find the
        # responder free, not busy (the same rule as after DISPLAY_RESULTS).
        self.finishing = True
        reason: dict[str, object] = {p.REASON_KEY: text}
        if busy:
            reason[p.BUSY_KEY] = True
        try:
            self.ctrl.send(head + p.encode_message(reason), 2.0)
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
        t = self.t
        params = self._receive_params()
        self.admit(params)
        self.params = params
        self.started = True
        udp = params.protocol == "udp"
        if udp:
            self.udp_sock = self._udp_listener()
        roles = self._roles(params)
        socks = self._make_connections(len(roles), udp)
        length = (params.duration + params.omit) or self.cfg.max_duration
        asked = params.bytes or params.blocks * params.blksize
        # max_bytes (or the client's -n/-k, when smaller) bounds each direction on its own: a --bidir test
        # drains both buckets, and the credit guard reckons each the same way (policy.expected_bytes).
        cap = min(self.cfg.max_bytes, asked) if asked else self.cfg.max_bytes
        for sock in socks:
            apply_test_options(sock, params)
        self._send_state(p.TEST_START)
        self._send_state(p.TEST_RUNNING)
        cpu = CpuMeter()
        t0 = time.monotonic()
        settings = StreamSettings(rate=params.bandwidth, blksize=params.blksize,
                                  udp_counters_64bit=params.udp_counters_64bit,
                                  deadline=t0 + min(length, self.cfg.max_duration) + t.send_slack)
        self.streams = make_streams(socks, sender=roles, udp=udp, settings=settings, budget=ByteBudget(cap),
                                    send_budget=ByteBudget(cap), label="r")
        first = [s.sample(t0) for s in self.streams]
        for s in self.streams:
            s.start(t0)
        t0, first, t_end = self._until_test_end(t0, first, length, params.omit)
        mine = self._my_results(params, cpu, socks, first, t_end - t0, t_end)
        self._exchange_results(mine)

    def _receive_params(self) -> TestParams:
        t = self.t
        self._send_state(p.PARAM_EXCHANGE)
        try:
            return parse_params(self.ctrl.recv_message(t.params, p.MAX_PARAMS_MESSAGE))
        except p.Timeout:
            raise Dropped("timeout", f"no parameters within {t.params:g}s") from None
        except p.PeerClosed:
            raise Dropped("closed", "closed before sending parameters") from None
        except (p.ProtocolError, struct.error) as exc:
            raise Dropped("garbage", f"bad parameters: {exc}") from None

    def _roles(self, params: TestParams) -> list[bool]:
        """Whether we send on each data connection, in the order the client makes them."""
        n = params.num_streams
        if params.bidirectional:
            # iperf_server_api.c: with --bidir the first -P data connections are the client's senders
            # (we receive), the next -P its receivers (we send); iperf_client_api.c makes them in that order.
            roles = [False] * n + [True] * n
            mode = "bidirectional (we receive and send)"
        else:
            roles = [params.reverse] * n
            mode = "reverse (we send)" if params.reverse else "we receive"
        log.info("responder: test from %s: %s, %d streams, %ds, %s", self.source, params.protocol.upper(),
                 n, params.duration, mode)
        return roles

    def _make_connections(self, count: int, udp: bool) -> list[socket.socket]:
        self.accepting = True
        self._send_state(p.CREATE_STREAMS)
        socks = (self._collect(count, "UDP streams", self._take_udp) if udp
                 else self._collect(count, "streams", self._take_tcp))
        self.accepting = False
        self._drain_incoming()
        return socks

    def _until_test_end(self, t0: float, first: list[Sample], length: float,
                        omit: int) -> tuple[float, list[Sample], float]:
        """Running: the client speaks next, with TEST_END, when its clock says the test is over. Returns the
        start of the counted part (after --omit), its first samples, and the instant TEST_END came."""
        t = self.t
        deadline = t0 + min(length, self.cfg.max_duration) + t.end_grace
        # With --omit the client leaves the first seconds out; so do our results (iperf_reset_stats).
        omit_at = t0 + omit if omit else None
        while True:
            if self.aborted.is_set():
                raise Dropped("terminated", "the responder is stopping")
            now = time.monotonic()
            if omit_at is not None and now >= omit_at:
                t0, first, omit_at = now, [s.sample(now) for s in self.streams], None
            left = deadline - now
            if left <= 0:
                raise Dropped("timeout", f"no TEST_END within {length}s + {t.end_grace:g}s")
            if not self.ctrl.readable(min(left, 0.5, (omit_at - now) if omit_at is not None else 0.5)):
                continue
            # Stamp the end before anything else: under GIL contention from busy stream threads every
            # further statement may wait a switch interval (5 ms), and the client's end is now.
            t_end = time.monotonic()
            state = self._recv_state(1.0, "TEST_END")
            if state == p.TEST_END:
                return t0, first, t_end
            if state == p.CLIENT_TERMINATE:
                raise Dropped("terminated", "the client terminated the test")
            raise Dropped("garbage", f"sent state {state} during the test")

    def _my_results(self, params: TestParams, cpu: CpuMeter, socks: list[socket.socket], first: list[Sample],
                    seconds: float, t_end: float) -> Results:
        """As iperf3: stop and close the data connections, then count. Byte counts are read after the
        workers have finished their last call, so what we report is exactly what we sent or took (and what
        burstwatch_responder_bytes_total counts)."""
        udp = params.protocol == "udp"
        for s in self.streams:
            s.stop()
        last = [s.sample(t_end) for s in self.streams]  # TCP_INFO while the sockets are open
        congestion = congestion_control(socks[0]) if socks and not udp else None
        for s in self.streams:
            s.close()
        last = [dataclasses.replace(x, bytes=s.bytes, packets=s.packets, errors=s.errors,
                                    outoforder=s.outoforder, jitter=s.jitter) for s, x in zip(self.streams, last)]
        total, user, system = cpu.read()
        has_retrans = -1  # iperf3 says -1 for a side that only received
        if any(s.sender for s in self.streams):
            has_retrans = 1 if not udp and all(x.info is not None for s, x in zip(self.streams, last)
                                               if s.sender) else 0
        return Results(
            cpu_total=total, cpu_user=user, cpu_system=system, sender_has_retransmits=has_retrans,
            congestion_used=congestion,
            streams=tuple(StreamResult(
                id=s.id, bytes=b.bytes - a.bytes,
                retransmits=(b.info.total_retrans - (a.info.total_retrans if a.info else 0))
                if s.sender and b.info is not None else -1,
                jitter=b.jitter, errors=b.errors - a.errors, packets=b.packets - a.packets, start_time=0.0,
                end_time=seconds)
                for s, a, b in zip(self.streams, first, last)),
            server_output_text=self._summary(seconds) if params.get_server_output else None)

    def _exchange_results(self, mine: Results) -> None:
        t, ctrl = self.t, self.ctrl
        self._send_state(p.EXCHANGE_RESULTS)
        try:
            parse_results(ctrl.recv_message(t.results, 1024 * 1024))
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

    def _collect(self, count: int, what: str,
                 take: Callable[[float, float], Optional[socket.socket]]) -> list[socket.socket]:
        """Make the test's `count` data connections: `take(wait, deadline)` returns the next one or None,
        for TCP and UDP alike; the control connection must stay quiet meanwhile, and all must come in time."""
        socks: list[socket.socket] = []
        deadline = time.monotonic() + self.t.streams
        try:
            while len(socks) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Dropped("timeout", f"made {len(socks)} of {count} {what} within "
                                  f"{self.t.streams:g}s")
                self._check_ctrl_quiet()
                sock = take(min(left, 0.2), deadline)
                if sock is not None:
                    socks.append(sock)
        except BaseException:
            for s in socks:
                s.close()
            raise
        return socks

    def _take_tcp(self, wait: float, deadline: float) -> Optional[socket.socket]:
        """A data connection the accept loop offered: it has read the test's cookie from it already (one
        with another cookie got ACCESS_DENIED there, as in iperf_tcp.c iperf_tcp_accept)."""
        try:
            conn = self.incoming.get(timeout=wait)
        except queue.Empty:
            return None
        conn.setblocking(True)
        return conn

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
        host, port = self.address[0], self.address[1]
        try:
            return bind_socket(host, port, udp=True)
        except OSError as exc:
            raise Refused("unsupported", f"cannot listen for UDP on port {port}: {exc}", 202) from None

    def _take_udp(self, wait: float, deadline: float) -> Optional[socket.socket]:
        """iperf_udp.c's handshake: a datagram from the client, `connect` back to its address, reply, and a
        fresh listener for the next stream. Datagrams from any address but the control peer's are ignored,
        so a spoofed source cannot point the responder's traffic elsewhere."""
        assert self.udp_sock is not None
        ready, _, _ = select.select([self.udp_sock], [], [], wait)
        if not ready:
            return None
        try:
            _, addr = self.udp_sock.recvfrom(64)
        except OSError:
            return None
        if str(client_ip(str(addr[0])) or addr[0]) != self.source:
            return None
        sock = self.udp_sock
        self.udp_sock = answer_udp(sock, addr, self._udp_listener)
        return sock

    def _drain_incoming(self) -> None:
        while True:
            try:
                conn = self.incoming.get_nowait()
            except queue.Empty:
                return
            deny(conn, None)

