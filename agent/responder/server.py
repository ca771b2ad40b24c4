"""The responder service: bind, accept, admit or turn away, and hand each admitted test to its session.

An iperf3-compatible server for peers' probes, split by phase as esnet/iperf's iperf_server_api.c is:
`policy` decides who may test and what, `session` runs one test, `stats` counts; this module owns the
listening socket, the accept loop and the one-test-at-a-time rule.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import select
import socket
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar, Union

from agent.config import ResponderConfig, split_hostport
from agent.iperf3 import protocol as p
from agent.iperf3.sockets import bind_socket
from agent.models.probe_cost import credit_state
from agent.models.profile import BandwidthProfile
from agent.responder.policy import (
    Network,
    RateLimiter,
    budget_refusal,
    check_caps,
    client_ip,
    credit_refusal,
    expected_bytes,
    is_allowed,
    parse_allow,
    resolve_allow,
    valid_cookie,
)
from agent.responder.session import Dropped, Session, Timeouts, deny
from agent.responder.stats import ResponderStats

# resolve_allow is the wiring's (daemon, `burstwatch responder`): it turns `[responder] allow` into networks.
__all__ = ["Responder", "resolve_allow"]

log = logging.getLogger(__name__)

T = TypeVar("T")
# The wiring's view of this host: direction -> agent.models.credit_model.CreditReading (or
# (remaining_bytes, bucket_bytes)); None or a missing direction is unknown.
CreditSource = Callable[[], Optional[Mapping[str, Any]]]
ProfileSource = Callable[[], Optional[BandwidthProfile]]

# Connections that have not yet sent their cookie are handled in parallel so that a silent one cannot
# hold the door shut; these bound how many such handshakes run at once (overall, per source).
MAX_PENDING = 16
MAX_PENDING_PER_SOURCE = 4


class Responder:
    """The responder as a daemon service (`start`/`stop`) or standalone (`serve_forever`).

    One test at a time; a connection that arrives while a test runs gets ACCESS_DENIED at once, as
    iperf3's server does (iperf_server_api.c iperf_accept: "the server is busy running a test").
    Connections still owing their cookie do not make the responder busy: each waits in its own thread,
    so a silent client only wastes its own time."""

    name = "responder"

    def __init__(self, cfg: ResponderConfig, allow: Sequence[Union[str, Network]], *,
                 credits: Optional[CreditSource] = None, profile: Optional[ProfileSource] = None,
                 timeouts: Optional[Timeouts] = None, clock: Callable[[], float] = time.monotonic,
                 stats: Optional[ResponderStats] = None,
                 external_busy: Callable[[], bool] = lambda: False) -> None:
        self.cfg = cfg
        self.allow = parse_allow(allow)
        # This host's latest credit readings and bandwidth profile, for the credit guard; without them
        # the host is credit-blind and only the hourly budget applies (docs/probes.md, "Credit guard").
        self._credits = credits
        self._profile = profile
        self.timeouts = timeouts or Timeouts()
        self.clock = clock
        self.stats = stats or ResponderStats(clock)
        self.stats.allowed = tuple(str(n) for n in self.allow)
        self.stats.hourly_budget_bytes = cfg.hourly_budget_bytes
        self.limiter = RateLimiter(cfg.max_tests_per_hour, clock)
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._active: Optional[Session] = None
        # True while this host runs a probe of its own: a test served meanwhile would compete with it on
        # the same NIC, so clients are told "busy" then too (the wiring hands in the probe service's flag).
        self.external_busy = external_busy
        self._pending: collections.Counter[str] = collections.Counter()
        self._waiting: set[socket.socket] = set()  # connections still owing their cookie
        self._threads: list[threading.Thread] = []
        self._thread: Optional[threading.Thread] = None
        self.address: tuple[str, int] = ("", 0)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def bind(self) -> None:
        host, port = split_hostport(self.cfg.listen)
        sock = bind_socket(host, port)
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
        self.stats.hourly_budget_bytes = cfg.hourly_budget_bytes
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
        source = str(client_ip(src) or src)
        if not is_allowed(src, self.allow):
            log.info("responder: refused peer=%s reason=not_allowed", source)
            self.stats.count("refused", "not_allowed")
            deny(conn, f"source {source} is not in the responder's allow list")
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
            deny(conn, None)
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
            if not valid_cookie(cookie):
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
                test = None if busy else Session(ctrl, source, cookie, cfg=self.cfg, timeouts=self.timeouts,
                                                 stats=self.stats, address=self.address,
                                                 admit=functools.partial(self._admit, self.cfg, source))
                if test is not None:
                    self._active = test
            if test is None:
                log.info("responder: refused peer=%s reason=busy", source)
                self.stats.count("refused", "busy")
                deny(conn, None)
                return
            try:
                if not self.limiter.allow(source):
                    self.stats.count("refused", "rate_limited")
                    log.info("responder: refused peer=%s reason=rate_limited (max_tests_per_hour %d)", source,
                             self.cfg.max_tests_per_hour)
                    deny(conn, f"source {source} already ran {self.cfg.max_tests_per_hour} tests in the last "
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

    # -- admission ---------------------------------------------------------------------------------------
    def _admit(self, cfg: ResponderConfig, source: str, params: p.TestParams) -> None:
        """Raise Refused for a test this responder will not run now: over a cap (for good), or, answered
        as busy, one that would drain a bucket under the credit floor or overspend the hourly budget."""
        check_caps(params, cfg)
        profile = self._read("profile", self._profile)
        peak = profile.peak_bytes_per_second if profile is not None else None
        expected = expected_bytes(params, peak, cfg)
        # Only a size with a burst bucket has credits to guard: an unknown profile, or one whose baseline
        # equals its peak, is credit-blind, and there only the budget applies.
        if profile is not None and profile.bursts:
            refusal = credit_refusal(params, credit_state(self._read("credits", self._credits)), expected,
                                     cfg.credit_floor)
            if refusal is not None:
                raise refusal
        refusal = budget_refusal(params, expected, self.stats.served.used(), self.stats.served.used(source), cfg)
        if refusal is not None:
            raise refusal

    @staticmethod
    def _read(what: str, source: Optional[Callable[[], T]]) -> Optional[T]:
        """A figure from the wiring; one that cannot be read counts as unknown (the budget still applies)."""
        if source is None:
            return None
        try:
            return source()
        except Exception:
            log.exception("responder: cannot read this host's %s; serving as credit-blind", what)
            return None

    def _release(self, conn: socket.socket, source: str) -> None:
        """A connection no longer owes its cookie (call with the lock held)."""
        self._waiting.discard(conn)
        self._pending[source] -= 1
        if self._pending[source] <= 0:
            del self._pending[source]
