"""The responder service: bind, accept, admit or turn away, and hand each admitted test to its session.

An iperf3-compatible server for peers' probes, split by phase as esnet/iperf's iperf_server_api.c is:
`policy` decides who may test and what, `admission` applies it with this host's credits and budget,
`pending` holds the connections that are not yet a test, `session` runs one test, `stats` counts; this
module owns the listening socket, the accept loop (one thread, one selector: a connection that owes its
cookie costs a descriptor, never a thread), the dispatch of cookies and the one-test-at-a-time rule.
"""

from __future__ import annotations

import errno
import functools
import logging
import selectors
import socket
import threading
import time
from typing import Callable, Optional, Sequence, Union

from agent.config import ResponderConfig
from agent.config_checks import split_hostport
from agent.iperf3 import protocol as p
from agent.iperf3.sockets import bind_socket
from agent.models.probe_cost import BusyFlag, CreditSource, ProfileSource
from agent.responder.admission import Admission
from agent.responder.logs import LogLimiter
from agent.responder.pending import Parked, Pending, PendingTable, fd_ceiling
from agent.responder.policy import Network, RateLimiter, client_ip, is_allowed, parse_allow, resolve_allow, valid_cookie
from agent.responder.refusals import deny
from agent.responder.session import Session, Timeouts
from agent.responder.stats import ResponderStats

# resolve_allow is the wiring's (daemon, `burstwatch responder`): it turns `[responder] allow` into networks.
__all__ = ["Responder", "resolve_allow"]

log = logging.getLogger(__name__)

# The listen backlog: when `max_pending` connections already owe their cookie, the accept loop stops
# accepting and new connections wait here, in the kernel, instead of being reset (the kernel caps it
# again at net.core.somaxconn, 4096 on Debian 12).
BACKLOG = 128
# When accept() fails for want of descriptors or memory, the loop stops accepting for this long, doubling
# while it goes on (up to the second figure); without it the loop spins at 100 % of a core, retrying at
# once a connection the kernel keeps offering (docs/security.md, "Responder limits").
ACCEPT_BACKOFF = (0.1, 1.0)
# accept() errors that mean "out of descriptors or memory", not "this connection went away".
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# How long a client that sent its cookie while the last test was showing its results waits for it to end
# before it is told "busy".
PARK_WAIT = 2.0
# At most this many connections are accepted per wake-up, so the loop also reads cookies and times out
# silent connections under a flood.
ACCEPT_BATCH = 64


class Responder:
    """The responder as a daemon service (`start`/`stop`) or standalone (`serve_forever`).

    One test at a time; a connection that arrives while a test runs gets ACCESS_DENIED at once, as
    iperf3's server does (iperf_server_api.c iperf_accept: "the server is busy running a test").
    Connections still owing their cookie do not make the responder busy: the accept loop reads their
    cookies as they come, so a silent client only wastes its own time. Limits: `max_pending_per_source`
    such connections per source (past it the source's new ones are closed), `max_pending` in all (past it
    the loop stops accepting and new connections wait in the listen backlog), and no descriptor in the
    reserve above fd_ceiling()."""

    name = "responder"

    def __init__(self, cfg: ResponderConfig, allow: Sequence[Union[str, Network]], *,
                 credits: Optional[CreditSource] = None, profile: Optional[ProfileSource] = None,
                 timeouts: Optional[Timeouts] = None, clock: Callable[[], float] = time.monotonic,
                 stats: Optional[ResponderStats] = None,
                 external_busy: BusyFlag = lambda: False) -> None:
        self.cfg = cfg
        self.allow = parse_allow(allow)
        self.timeouts = timeouts or Timeouts()
        self.clock = clock
        self.stats = stats or ResponderStats(clock)
        # The credit guard and the hourly budget, fed this host's credits and profile by the wiring.
        self.admission = Admission(self.stats, credits, profile)
        self.stats.allowed = tuple(str(n) for n in self.allow)
        # The budget in force is sized at each snapshot from the config and profile of that moment.
        self.stats.budget = lambda: self.admission.budget(self.cfg)
        self.limiter = RateLimiter(cfg.max_tests_per_hour, clock)
        # Every line about one connection goes through here: a flood makes a few lines and a count.
        self.events = LogLimiter(log)
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._active: Optional[Session] = None
        # True while this host runs a probe of its own: a test served meanwhile would compete with it on
        # the same NIC, so clients are told "busy" then too (the wiring hands in the probe service's flag).
        self.external_busy = external_busy
        # The accept loop's own state (only its thread touches these, except the counts read by tests).
        self._sel: Optional[selectors.BaseSelector] = None
        self._pending = PendingTable()
        self._parked: list[Parked] = []
        self._paused_until = 0.0
        self._backoff = 0.0
        self._fd_ceiling = fd_ceiling()
        self._threads: list[threading.Thread] = []
        self._thread: Optional[threading.Thread] = None
        self.address: tuple[str, int] = ("", 0)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def bind(self) -> None:
        host, port = split_hostport(self.cfg.listen)
        sock = bind_socket(host, port, backlog=BACKLOG)
        try:
            # Made here, on the caller's thread, so that start() fails at once (and the loop can never
            # lack its selector later) when descriptors are short.
            self._sel = selectors.DefaultSelector()
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
        if self._sel is not None and (self._thread is None or not self._thread.is_alive()):
            self._sel.close()  # bound but never served (the loop closes its own on the way out)
            self._sel = None
        self.stats.listening = False
        self.events.flush(force=True)

    def reconfigure(self, cfg: ResponderConfig, allow: Sequence[Union[str, Network]]) -> None:
        """Apply a reloaded `[responder]` (SIGHUP): caps and the allow list take effect for the next test.
        `listen` is marked restart-only in agent/config.py: the reload hands the running address."""
        self.cfg = cfg
        self.allow = parse_allow(allow)
        self.stats.allowed = tuple(str(n) for n in self.allow)
        self.limiter.per_hour = cfg.max_tests_per_hour

    def pending(self) -> int:
        """Connections held before they became a test: owing their cookie, or parked."""
        return len(self._pending) + len(self._parked)

    def serve_forever(self) -> None:
        """Accept connections until stop(); binds first when start() did not."""
        if self._sock is None:
            self.bind()
        assert self._sock is not None and self._sel is not None
        lsock, sel = self._sock, self._sel
        lsock.setblocking(False)
        listening = False
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                want = now >= self._paused_until and self.pending() < self.cfg.max_pending
                if want != listening:
                    if want:
                        sel.register(lsock, selectors.EVENT_READ, None)
                    else:
                        sel.unregister(lsock)
                    listening = want
                try:
                    events = sel.select(self._wait(now))
                except (OSError, ValueError):
                    break
                for key, _ in events:
                    if key.data is None:
                        self._accept_batch(lsock)
                    else:
                        self._read_cookie(key.data)
                now = time.monotonic()
                self._expire(now)
                self._serve_parked(now)
                self.events.flush()
        finally:
            for pend in list(self._pending.by_fd.values()):
                self._forget(pend)
                pend.conn.close()
            for park in self._parked:
                deny(park.conn, None)
            self._parked = []
            sel.close()
            self._sel = None
            self._threads = [t for t in self._threads if t.is_alive()]

    def _wait(self, now: float) -> float:
        """Seconds the loop may sleep: until the next cookie deadline, the end of an accept pause, or
        0.25 s (stop() is noticed within that); a parked client is looked at every 20 ms."""
        wait = 0.25
        if self._parked:
            wait = 0.02
        nearest = self._pending.nearest_deadline()
        if nearest is not None:
            wait = min(wait, nearest - now)
        if now < self._paused_until:
            wait = min(wait, self._paused_until - now)
        return max(0.0, wait)

    # -- connections -------------------------------------------------------------------------------------
    def _accept_batch(self, lsock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _EXHAUSTED:
                    self._pause(f"cannot accept a connection: {exc.strerror}")
                    return
                log.debug("responder: accept failed: %s", exc)  # the peer left before we took it
                continue
            self._backoff = 0.0
            self.stats.connection()
            src = str(addr[0])
            if len(addr) >= 4 and addr[3] and "%" not in src:
                # A link-local peer: its interface, as accept() gives it (scope_id), for a scoped allow entry.
                src = f"{src}%{addr[3]}"
            try:
                self._on_accept(conn, src)
            except Exception:  # one bad connection must never stop the responder
                self.events.log(logging.ERROR, "dispatch error", "responder: dispatching a connection from %s "
                                "failed", str(addr[0]), exc_info=True)
                conn.close()
            if self.pending() >= self.cfg.max_pending:
                return

    def _pause(self, why: str) -> None:
        """Stop accepting for a while (descriptors or memory ran out), doubling while it goes on."""
        lo, hi = ACCEPT_BACKOFF
        self._backoff = min(hi, max(lo, self._backoff * 2))
        self._paused_until = time.monotonic() + self._backoff
        self.events.log(logging.WARNING, "accept paused", "responder: %s; not accepting for %.1f s", why,
                        self._backoff)

    def _drop(self, conn: socket.socket, source: str, reason: str, detail: str,
              level: int = logging.INFO) -> None:
        self.stats.count("dropped", reason)
        self.events.log(level, f"dropped {reason}", "responder: dropped peer=%s reason=%s: %s", source, reason,
                        detail)
        conn.close()

    def _refuse_busy(self, conn: socket.socket, source: str) -> None:
        self.stats.count("refused", "busy")
        self.events.log(logging.INFO, "refused busy", "responder: refused peer=%s reason=busy", source)
        deny(conn, None)

    def _on_accept(self, conn: socket.socket, src: str) -> None:
        source = str(client_ip(src) or src)
        if conn.fileno() >= self._fd_ceiling:
            self._drop(conn, source, "overload", f"descriptor {conn.fileno()} is in the reserve kept for "
                       f"sampling and /metrics (the responder keeps none from {self._fd_ceiling} up)",
                       logging.WARNING)
            self._pause("descriptors are running out")
            return
        if not is_allowed(src, self.allow):
            self.stats.count("refused", "not_allowed")
            self.events.log(logging.INFO, "refused not_allowed", "responder: refused peer=%s reason=not_allowed",
                            source)
            deny(conn, f"source {source} is not in the responder's allow list")
            return
        with self._lock:
            test = self._active
            stream = test is not None and test.wants_stream_from(source)
            busy = not stream and ((test is not None and not test.finishing) or self._stop.is_set()
                                   or self.external_busy())
            # The running test's own data connections come on top of its source's share.
            limit = self.cfg.max_pending_per_source + (test.data_connections() if stream and test else 0)
            over = self._pending.per_source[source] >= limit
        if busy:
            self._refuse_busy(conn, source)
            return
        if over:
            self._drop(conn, source, "overload", f"{self._pending.per_source[source]} of its connections already owe "
                       f"a cookie (max_pending_per_source {self.cfg.max_pending_per_source})", logging.WARNING)
            return
        assert self._sel is not None
        conn.setblocking(False)
        wait = self.timeouts.stream_cookie if stream else self.timeouts.cookie
        pend = Pending(conn, source, time.monotonic() + wait, stream)
        self._pending.add(pend)
        self._sel.register(conn, selectors.EVENT_READ, pend)
        # Most clients send their cookie with the handshake's last ACK: read it now, so a burst of
        # connections from one source is not held against its share while the batch is accepted.
        self._read_cookie(pend)

    def _forget(self, pend: Pending) -> None:
        """A connection no longer owes its cookie."""
        self._pending.forget(pend)
        if self._sel is not None:
            try:
                self._sel.unregister(pend.conn)
            except (KeyError, ValueError):
                pass

    def _read_cookie(self, pend: Pending) -> None:
        try:
            chunk = pend.conn.recv(p.COOKIE_SIZE - len(pend.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._forget(pend)
            self._drop(pend.conn, pend.source, "closed", f"failed before sending a cookie: {exc}")
            return
        if not chunk:
            self._forget(pend)
            self._drop(pend.conn, pend.source, "closed", "closed before sending a cookie")
            return
        pend.buf += chunk
        if len(pend.buf) < p.COOKIE_SIZE:
            return
        self._forget(pend)
        cookie = bytes(pend.buf)
        if not valid_cookie(cookie):
            self._drop(pend.conn, pend.source, "garbage", "sent something that is not an iperf3 cookie")
            return
        self._on_cookie(pend.conn, pend.source, cookie)

    def _expire(self, now: float) -> None:
        for pend in self._pending.expired(now):
            self._forget(pend)
            wait = self.timeouts.stream_cookie if pend.stream else self.timeouts.cookie
            self._drop(pend.conn, pend.source, "timeout", f"no cookie within {wait:g}s")

    def _on_cookie(self, conn: socket.socket, source: str, cookie: bytes) -> None:
        """A well-formed cookie: the running test's data connection, a new test, or a client told "busy"."""
        with self._lock:
            test = self._active
            if test is not None and test.accepting and source == test.source and cookie == test.cookie:
                if test.offer(conn):
                    return
                test = None  # more data connections than the test asked for
                extra = True
            else:
                extra = False
            busy = (test is not None and not test.finishing) or self._stop.is_set() or self.external_busy()
            if not busy and not extra:
                if test is None:
                    self._start(conn, source, cookie)
                    return
                # A test that has shown its results is as good as over: wait for it rather than turn away
                # a client that starts its next test the moment the last one ended.
                self._parked.append(Parked(conn, source, cookie, time.monotonic() + PARK_WAIT))
                return
        if extra:
            self._drop(conn, source, "overload", "a data connection beyond the test's streams")
            return
        self._refuse_busy(conn, source)

    def _serve_parked(self, now: float) -> None:
        if not self._parked:
            return
        keep = []
        for park in self._parked:
            with self._lock:
                test = self._active
                stopping = self._stop.is_set() or self.external_busy()
                if test is None and not stopping:
                    self._start(park.conn, park.source, park.cookie)
                    continue
                waiting = test is not None and test.finishing and not stopping and now < park.deadline
            if waiting:
                keep.append(park)
            else:
                self._refuse_busy(park.conn, park.source)
        self._parked = keep

    def _start(self, conn: socket.socket, source: str, cookie: bytes) -> None:
        """Make `conn` the test (call with the lock held): a Session run on its own thread."""
        conn.setblocking(True)
        # One-byte state messages go out back to back (TEST_START, TEST_RUNNING): without TCP_NODELAY
        # Nagle holds the second until the first is ACKed, and a delayed ACK makes that 40 ms (iperf3
        # sets TCP_NODELAY on its control socket too, iperf_server_api.c iperf_accept).
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        test = Session(p.Control(conn, source), source, cookie, cfg=self.cfg, timeouts=self.timeouts,
                       stats=self.stats, address=self.address, events=self.events,
                       admit=functools.partial(self.admission.admit, self.cfg, source))
        self._active = test
        t = threading.Thread(target=self._run_test, args=(test,), name=f"responder-{source}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _run_test(self, test: Session) -> None:
        source = test.source
        try:
            if not self.limiter.allow(source):
                self.stats.count("refused", "rate_limited")
                self.events.log(logging.INFO, "refused rate_limited", "responder: refused peer=%s "
                                "reason=rate_limited (max_tests_per_hour %d)", source, self.cfg.max_tests_per_hour)
                deny(test.ctrl.sock, f"source {source} already ran {self.cfg.max_tests_per_hour} tests in the "
                                     "last hour (max_tests_per_hour)")
                return
            test.run()
        except Exception:
            self.events.log(logging.ERROR, "test error", "responder: the test from %s failed", source,
                            exc_info=True)
            test.ctrl.sock.close()
        finally:
            with self._lock:
                self._active = None
