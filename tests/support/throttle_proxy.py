"""A tiny real HTTP proxy in front of moto: answers chosen CloudWatch calls with real AWS errors, goes
down and comes back on the same port, holds requests, and records every PutMetricData it sees.

The error bodies are the query protocol's `ErrorResponse` documents that CloudWatch sends, so botocore
parses and retries them exactly as it would AWS's (standard retry mode retries `Throttling`)."""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

ERROR_BODY = ('<ErrorResponse xmlns="http://monitoring.amazonaws.com/doc/2010-08-01/">'
              "<Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>"
              "<RequestId>{rid}</RequestId></ErrorResponse>")

_DATUM = re.compile(r"^MetricData\.member\.(\d+)\.MetricName$")
_DIM = re.compile(r"^MetricData\.member\.(\d+)\.Dimensions\.member\.(\d+)\.Name$")
_MEMBER = re.compile(r"^MetricData\.member\.(\d+)\.(.+)$")
_VALUES = re.compile(r"^MetricData\.member\.(\d+)\.Values\.member\.(\d+)$")


@dataclass
class Record:
    """One request the proxy saw."""

    action: str
    body_bytes: int
    status: int
    datums: int = 0
    max_dimensions: int = 0
    max_values: int = 0
    time: float = field(default_factory=time.monotonic)


@dataclass
class Fault:
    """Answer the next `count` calls of `action` with this error instead of forwarding them."""

    count: int
    status: int
    code: str
    message: str
    action: str = "PutMetricData"


class ThrottleProxy:
    """Forward everything to `upstream` (moto's URL) unless a fault, an old datum limit or a hold says
    otherwise. `url` is what the client under test uses."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0) -> None:
        u = urllib.parse.urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.host = host
        self.records: list[Record] = []
        self.faults: list[Fault] = []
        self.max_datums: Optional[int] = None   # emulate the pre-2022 limit (20) when set
        self.slice_fields = 600
        self.release = threading.Event()        # hold mode: requests wait for this
        self.release.set()
        self.lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._conns: set[socket.socket] = set()
        self.port = port
        self.up()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------------
    def up(self) -> None:
        """Listen (again) on the same port."""
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with proxy.lock:
                    proxy._conns.add(self.connection)

            def finish(self) -> None:
                with proxy.lock:
                    proxy._conns.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                proxy._handle(self)

            def do_GET(self) -> None:
                proxy._handle(self)

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

        deadline = time.monotonic() + 10
        while True:
            try:
                self._server = Server((self.host, self.port), Handler)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="throttle-proxy", daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stop listening: new connections are refused, as from a dead endpoint."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:            # and the kept-alive connections go too, as they would
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.release.set()
        self.down()

    def fail_next(self, count: int, code: str = "Throttling", status: int = 400,
                  message: str = "Rate exceeded", action: str = "PutMetricData") -> None:
        with self.lock:
            self.faults.append(Fault(count, status, code, message, action))

    def puts(self) -> list[Record]:
        with self.lock:
            return [r for r in self.records if r.action == "PutMetricData"]

    # -- one request ---------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        action = (form.get("Action") or [""])[0]
        rec = Record(action, len(body), 200)
        if action == "PutMetricData":
            dims: dict[str, int] = {}
            vals: dict[str, int] = {}
            for key in form:
                if _DATUM.match(key):
                    rec.datums += 1
                m = _DIM.match(key)
                if m:
                    dims[m.group(1)] = max(dims.get(m.group(1), 0), int(m.group(2)))
                m = _VALUES.match(key)
                if m:
                    vals[m.group(1)] = max(vals.get(m.group(1), 0), int(m.group(2)))
            rec.max_dimensions = max(dims.values(), default=0)
            rec.max_values = max(vals.values(), default=0)
        with self.lock:
            self.records.append(rec)
        self.release.wait(30)
        error: Optional[tuple[int, str, str]] = None
        with self.lock:
            for f in self.faults:
                if f.count > 0 and f.action == action:
                    f.count -= 1
                    error = (f.status, f.code, f.message)
                    break
            if error is None and action == "PutMetricData" and self.max_datums is not None \
                    and rec.datums > self.max_datums:
                error = (400, "InvalidParameterValue",
                         f"The collection MetricData must not have a size greater than {self.max_datums}.")
            rec.status = error[0] if error else 0
        if error is not None:
            status, code, message = error
            payload = ERROR_BODY.format(code=code, message=message, rid=uuid.uuid4()).encode()
            h.send_response(status)
            h.send_header("Content-Type", "text/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.send_header("x-amzn-RequestId", str(uuid.uuid4()))
            h.end_headers()
            h.wfile.write(payload)
            return
        headers = {k: v for k, v in h.headers.items()
                   if k.lower() not in ("host", "connection", "content-length")}
        bodies = self._slices(body) if action == "PutMetricData" else [body]
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            for part in bodies:   # the first failure is the answer; else the last success
                conn.request(h.command, h.path, body=part, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                if resp.status >= 300:
                    break
            rec.status = resp.status
            h.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                    h.send_header(k, v)
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
        finally:
            conn.close()

    def _slices(self, body: bytes) -> list[bytes]:
        """moto 5.0 parses a query-protocol body in time quadratic in its fields (1000 datums take
        ~11 s, more than the client's read timeout), so a PutMetricData is forwarded in slices of at
        most `slice_fields` fields, renumbered; the record above keeps the request as the client sent it."""
        pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True)
        head = [(k, v) for k, v in pairs if not k.startswith("MetricData.member.")]
        members: dict[int, list[tuple[str, str]]] = {}
        for k, v in pairs:
            m = _MEMBER.match(k)
            if m:
                members.setdefault(int(m.group(1)), []).append((m.group(2), v))
        out: list[bytes] = []
        cur: list[tuple[str, str]] = []
        n = 0
        for idx in sorted(members):
            fields = members[idx]
            if cur and len(cur) + len(fields) > self.slice_fields:
                out.append(urllib.parse.urlencode(head + cur).encode())
                cur, n = [], 0
            n += 1
            cur += [(f"MetricData.member.{n}.{rest}", v) for rest, v in fields]
        if cur or not out:
            out.append(urllib.parse.urlencode(head + cur).encode())
        return out
