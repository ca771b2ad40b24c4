"""The /metrics HTTP(S) server: one event loop reads requests within limits, a small pool answers slow ones."""

from __future__ import annotations

import collections
import errno
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from agent.exporters.http_drops import Tally
from agent.exporters.http_listen import remove_socket, tcp_listener, unix_listener
from agent.exporters.http_request import DEFAULT_LIMITS, Authenticator, Handler, Limits, Request, parse_request
from agent.exporters.http_response import Response, serialize, text_response

log = logging.getLogger(__name__)

SEND_CHUNK = 16384          # one TLS record; a retried SSL write must repeat the same chunk
_FD_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

HANDSHAKE, READING, BUSY, WRITING = "handshake", "reading", "busy", "writing"


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    peer: str
    state: str
    deadline: float
    buf: bytes = b""
    out: memoryview = field(default_factory=lambda: memoryview(b""))
    keep_alive: bool = False
    served: int = 0
    events: int = 0                  # what the selector watches for now (0: not registered)
    local: bool = False              # came in on the Unix socket: no TLS, no basic auth


@dataclass(eq=False)
class _Listener:
    sock: socket.socket
    local: bool                      # the Unix socket, whose file mode is its access control


class HttpServer:
    """HTTP/1.1 on one socket. A single event loop thread accepts, completes TLS handshakes, reads request
    heads and writes responses, all non-blocking, so a connection costs a socket and a small buffer, never a
    thread. Requests that need blocking work (a render, a bcrypt check) go to `limits.workers` threads; at most
    one request per connection is in flight, so their queue is bounded by `limits.max_connections`."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Handler], *, limits: Limits = DEFAULT_LIMITS,
                 tls: Optional[ssl.SSLContext] = None, auth: Optional[Authenticator] = None,
                 name: str = "metrics-http") -> None:
        self.routes = dict(routes)
        self.limits = limits
        self.tls, self.auth = tls, auth
        self.name = name
        tcp = tcp_listener(host, port, max(128, limits.backlog))
        self.port: int = tcp.getsockname()[1]
        self._listeners = [_Listener(tcp, local=False)]
        self.socket_path: Optional[str] = None     # the Unix socket, once listen_unix() got it
        self._socket_ino = 0
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._conns: dict[int, _Conn] = {}
        # Both in deadline order: a deadline is "now + a fixed timeout", so appending keeps them sorted.
        self._waiting: collections.OrderedDict[int, _Conn] = collections.OrderedDict()   # evictable
        self._writing: collections.OrderedDict[int, _Conn] = collections.OrderedDict()
        self._jobs: queue.SimpleQueue[Optional[tuple[_Conn, Request, bool]]] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[_Conn, Request, Response, bool]] = queue.SimpleQueue()
        self._stopping = False
        self._accept_paused_until = 0.0
        self.tally = Tally()
        self.counts = self.tally.counts
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._workers = [threading.Thread(target=self._work, name=f"{name}-worker-{i}", daemon=True)
                         for i in range(max(1, limits.workers))]

    # -- lifecycle ----------------------------------------------------------------------------------
    def listen_unix(self, path: str, create_dir: bool = True) -> bool:
        """Also serve on a local Unix socket (before start()): the same routes and limits, plain HTTP and
        no basic auth, since only who may open the file can connect. False (and logged) when it cannot."""
        got = unix_listener(path, max(128, self.limits.backlog), create_dir)
        if got is None:
            return False
        self._listeners.append(_Listener(got[0], local=True))
        self.socket_path, self._socket_ino = path, got[1]
        return True

    def start(self) -> None:
        self._listen(True)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        for w in self._workers:
            w.start()
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        if self._thread.is_alive():
            self._wake()
            self._thread.join(timeout)
        else:
            self._close_all()
        for _ in self._workers:
            self._jobs.put(None)
        for w in self._workers:
            if w.is_alive():
                w.join(timeout)

    def reconfigure(self, limits: Limits, tls: Optional[ssl.SSLContext], auth: Optional[Authenticator]) -> None:
        """New limits, TLS settings and users for connections and requests from now on (one assignment
        each; `workers` and `backlog` stay as they were at start). A shorter header_timeout reaches
        connections already waiting only once the longer deadlines ahead of them have passed."""
        self.limits, self.tls, self.auth = limits, tls, auth

    def open_connections(self) -> int:
        return len(self._conns)

    # -- the event loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                now = time.monotonic()
                for key, _events in self._sel.select(self._timeout(now)):
                    if isinstance(key.data, _Listener):
                        self._accept(key.data)
                    elif key.data == "wake":
                        self._drain_wake()
                    elif isinstance(key.data, _Conn) and key.data.sock.fileno() >= 0:
                        try:
                            self._service(key.data)
                        except Exception:  # a bug met by one connection closes that connection only
                            log.exception("%s: error serving peer=%s; closing it", self.name, key.data.peer)
                            self._close(key.data)
                self._finish_jobs()
                now = time.monotonic()
                self._expire(now)
                if self._accept_paused_until and now >= self._accept_paused_until:
                    self._accept_paused_until = 0.0
                    self._listen(True)
                self.tally.report(now, self.name, self.limits)
        except Exception:  # a bug here must not take the daemon down silently: log it, close everything
            log.exception("%s: event loop failed; /metrics is down", self.name)
        finally:
            self._close_all()

    def _timeout(self, now: float) -> float:
        nearest = now + 1.0
        for d in (self._waiting, self._writing):
            if d:
                nearest = min(nearest, next(iter(d.values())).deadline)
        if self._accept_paused_until:
            nearest = min(nearest, self._accept_paused_until)
        return max(0.0, nearest - now)

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        if self.socket_path is not None:
            remove_socket(self.socket_path, self._socket_ino)
        for s in (*(lst.sock for lst in self._listeners), self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        try:
            self._sel.close()
        except (OSError, RuntimeError):
            pass

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (the loop is already due to wake) or closed (stopping)
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    # -- accepting ----------------------------------------------------------------------------------
    def _listen(self, on: bool) -> None:
        for lst in self._listeners:
            if on:
                self._sel.register(lst.sock, selectors.EVENT_READ, lst)
            else:
                self._sel.unregister(lst.sock)

    def _accept(self, listener: _Listener) -> None:
        for _ in range(64):  # then let the other sockets have a turn
            try:
                sock, addr = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _FD_EXHAUSTED:
                    # Free a descriptor for the rest of the process and stop accepting for a moment: retrying
                    # at once spins on the same error (docs/security.md, "/metrics endpoint").
                    self._evict_one("fd-exhausted")
                    self._listen(False)
                    self._accept_paused_until = time.monotonic() + 0.1
                    self.counts["accept-paused"] += 1
                return
            peer = "unix" if listener.local else f"{addr[0]}:{addr[1]}"
            if len(self._conns) >= self.limits.max_connections and not self._evict_one("cap"):
                self.tally.drop("refused", peer)
                sock.close()
                continue
            sock.setblocking(False)
            tls = None if listener.local else self.tls
            now = time.monotonic()
            try:
                if tls is not None:
                    sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ssl.SSLError):
                sock.close()
                continue
            conn = _Conn(sock, peer, HANDSHAKE if tls is not None else READING,
                         now + self.limits.header_timeout, local=listener.local)
            self._conns[sock.fileno()] = conn
            self._waiting[sock.fileno()] = conn
            self.counts["accepted"] += 1
            self._want(conn, selectors.EVENT_READ)

    def _evict_one(self, reason: str) -> bool:
        """Close the connection that has waited longest without sending a complete request. A client that
        means to be served sends its request within a round trip of connecting, so it is never the oldest
        while connections are held open on purpose."""
        if not self._waiting:
            return False
        conn = next(iter(self._waiting.values()))
        self.tally.drop(f"evicted-{reason}", conn.peer)
        log.debug("%s: closing peer=%s (%s, %s)", self.name, conn.peer, conn.state, reason)
        self._close(conn)
        return True

    # -- per connection -----------------------------------------------------------------------------
    def _want(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events and events:
            self._sel.modify(conn.sock, events, conn)
        elif events:
            self._sel.register(conn.sock, events, conn)
        else:
            self._sel.unregister(conn.sock)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if conn.events:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.events = 0
        self._conns.pop(fd, None)
        self._waiting.pop(fd, None)
        self._writing.pop(fd, None)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _service(self, conn: _Conn) -> None:
        if conn.state == HANDSHAKE:
            self._handshake(conn)
        elif conn.state == READING:
            self._read(conn)
        elif conn.state == WRITING:
            self._flush(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._want(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._want(conn, selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError) as exc:
            self.counts["tls-failed"] += 1
            log.debug("%s: TLS handshake failed peer=%s: %s", self.name, conn.peer, exc)
            self._close(conn)
            return
        conn.state = READING
        self._want(conn, selectors.EVENT_READ)
        self._read(conn)  # the request may have come with the handshake's last flight

    def _read(self, conn: _Conn) -> None:
        while True:
            try:
                data = conn.sock.recv(4096)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                self._want(conn, selectors.EVENT_READ)
                return
            except ssl.SSLWantWriteError:
                self._want(conn, selectors.EVENT_WRITE)
                return
            except (ssl.SSLError, OSError):
                self._close(conn)
                return
            if not data:
                self._close(conn)
                return
            conn.buf += data
            end, sep = conn.buf.find(b"\r\n\r\n"), 4
            lf = conn.buf.find(b"\n\n")
            if lf >= 0 and (end < 0 or lf < end):
                end, sep = lf, 2
            if 0 <= end <= self.limits.max_header_bytes:
                head, rest = conn.buf[:end], conn.buf[end + sep:]
                conn.buf = b""
                self._dispatch(conn, head, pipelined=bool(rest) or (
                    isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending() > 0))
                return
            if len(conn.buf) > self.limits.max_header_bytes:
                self.counts["too-large"] += 1
                self._waiting.pop(conn.sock.fileno(), None)
                self._respond_now(conn, text_response(431), head_only=False, keep_alive=False)
                return

    def _dispatch(self, conn: _Conn, head: bytes, pipelined: bool) -> None:
        self._waiting.pop(conn.sock.fileno(), None)
        parsed = parse_request(head, conn.peer)
        if isinstance(parsed, Response):
            self.counts["bad-request"] += 1
            self._respond_now(conn, parsed, head_only=False, keep_alive=False)
            return
        req = parsed
        tokens = {t.strip().lower() for t in req.headers.get("connection", "").split(",")}
        # One request at a time per connection: a pipelined one is answered after a close, not queued.
        keep_alive = req.version == "HTTP/1.1" and "close" not in tokens and not pipelined
        conn.state = BUSY
        self._want(conn, 0)
        try:
            resp = self.answer(req, may_block=False, local=conn.local)
        except Exception:
            log.exception("%s: handler failed path=%s peer=%s", self.name, req.path, req.peer)
            resp = text_response(500)
        if resp is None:
            self._jobs.put((conn, req, keep_alive))
            return
        self._respond_now(conn, resp, head_only=req.method == "HEAD", keep_alive=keep_alive)

    def answer(self, req: Request, may_block: bool, local: bool = False) -> Optional[Response]:
        """Authentication first (exporter-toolkit wraps every path in it), then the route. A request on
        the Unix socket needs none: the socket file's mode already decided who may connect."""
        auth = None if local else self.auth
        if auth is not None:
            ok = auth(req.headers.get("authorization"), may_block)
            if ok is None:
                return None
            if not ok:
                self.counts["unauthorized"] += 1
                return text_response(401, (("WWW-Authenticate", 'Basic realm="burstwatch", charset="UTF-8"'),))
        handler = self.routes.get(req.path)
        if handler is None:
            return text_response(404)
        return handler(req, may_block)

    def _respond_now(self, conn: _Conn, resp: Response, head_only: bool, keep_alive: bool) -> None:
        log.debug("%s: peer=%s status=%d", self.name, conn.peer, resp.status)
        conn.out = memoryview(serialize(resp, head_only, keep_alive))
        conn.keep_alive = keep_alive
        conn.state = WRITING
        conn.deadline = time.monotonic() + self.limits.write_timeout
        self._writing[conn.sock.fileno()] = conn
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out[:SEND_CHUNK])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._want(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._want(conn, selectors.EVENT_READ)
                return
            except (ssl.SSLError, OSError):
                self._close(conn)
                return
            conn.out = conn.out[sent:]
        self._writing.pop(conn.sock.fileno(), None)
        conn.served += 1
        self.counts["responses"] += 1
        if not conn.keep_alive or self._stopping:
            self._close(conn)
            return
        conn.state = READING
        conn.deadline = time.monotonic() + self.limits.header_timeout
        self._waiting[conn.sock.fileno()] = conn
        self._want(conn, selectors.EVENT_READ)

    def _finish_jobs(self) -> None:
        while True:
            try:
                conn, req, resp, keep_alive = self._done.get_nowait()
            except queue.Empty:
                return
            if conn.sock.fileno() < 0:
                continue  # closed meanwhile (stop)
            self._respond_now(conn, resp, head_only=req.method == "HEAD", keep_alive=keep_alive)

    def _expire(self, now: float) -> None:
        for table, what in ((self._waiting, "timeout-header"), (self._writing, "timeout-write")):
            while table:
                conn = next(iter(table.values()))
                if conn.deadline > now:
                    break
                # A kept-alive connection that goes quiet after its responses is ordinary, not a fault.
                kind = "idle-closed" if conn.served and not conn.buf and conn.state == READING else what
                if kind == "idle-closed":
                    self.counts[kind] += 1
                else:
                    self.tally.drop(kind, conn.peer)
                self._close(conn)

    # -- workers ------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, req, keep_alive = job
            try:
                resp = self.answer(req, may_block=True, local=conn.local) or text_response(500)
            except Exception:
                log.exception("%s: handler failed path=%s peer=%s", self.name, req.path, req.peer)
                resp = text_response(500)
            self._done.put((conn, req, resp, keep_alive))
            self._wake()
