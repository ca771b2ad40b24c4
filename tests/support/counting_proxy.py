"""A real HTTP proxy in front of one moto server that counts every AWS request by API and caller.

Each request is named `service:Action` (EC2 and CloudWatch: the query protocol's `Action=` in the form body or
the query string; S3: the REST method and path shape, e.g. `s3:ListObjectsV2`, `s3:PutObject`) and, for S3,
by the key's area under the fleet prefix (`learned/`, `agents/`, `access-check/`). The caller is the
`Credential=<access key id>/...` of the SigV4 Authorization header, so agents that sign with their own key
ids are told apart. PutMetricData bodies are parsed into metric identities (name + dimensions)."""

from __future__ import annotations

import collections
import http.client
import re
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

_CRED = re.compile(r"Credential=([^/,\s]+)/\d{8}/[^/]+/([^/]+)/aws4_request")
_NAME = re.compile(r"^MetricData\.member\.(\d+)\.MetricName$")
_DIM = re.compile(r"^MetricData\.member\.(\d+)\.Dimensions\.member\.(\d+)\.(Name|Value)$")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
AREAS = ("learned/", "agents/", "access-check/")


@dataclass(frozen=True)
class Call:
    caller: str                  # the signing access key id ("" when unsigned)
    api: str                     # service:Action
    area: str                    # S3: learned/, agents/, access-check/ or ""; others ""
    status: int


def s3_action(method: str, path: str, query: dict[str, list[str]]) -> tuple[str, str]:
    """(Action, key) for a path-style S3 request."""
    parts = path.lstrip("/").split("/", 1)
    key = urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
    if not key:
        if method == "GET" and "list-type" in query:
            return "ListObjectsV2", urllib.parse.unquote(query.get("prefix", [""])[0])
        return {"GET": "ListObjects", "PUT": "CreateBucket", "HEAD": "HeadBucket",
                "DELETE": "DeleteBucket"}.get(method, method), ""
    return {"GET": "GetObject", "PUT": "PutObject", "HEAD": "HeadObject",
            "DELETE": "DeleteObject"}.get(method, method), key


def area_of(key: str) -> str:
    for a in AREAS:
        if f"/{a}" in f"/{key}":
            return a
    return ""


def metric_identities(form: dict[str, list[str]]) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """(MetricName, sorted dimensions) of each datum of a PutMetricData form."""
    names: dict[str, str] = {}
    dims: dict[str, dict[str, dict[str, str]]] = collections.defaultdict(lambda: collections.defaultdict(dict))
    for k, v in form.items():
        m = _NAME.match(k)
        if m:
            names[m.group(1)] = v[0]
            continue
        d = _DIM.match(k)
        if d:
            dims[d.group(1)][d.group(2)][d.group(3)] = v[0]
    out = []
    for n, name in names.items():
        pairs = tuple(sorted((x.get("Name", ""), x.get("Value", "")) for x in dims[n].values()))
        out.append((name, pairs))
    return out


class CountingProxy:
    """Forwards everything to `upstream` and counts it; `url` is the endpoint the agents use."""

    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        u = urllib.parse.urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.lock = threading.Lock()
        self.calls: collections.Counter[Call] = collections.Counter()
        self.metrics: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = collections.defaultdict(set)
        self._local = threading.local()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self)

            do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

            def handle_error(self, request: object, client_address: object) -> None:
                pass        # an agent stopping mid-connection is no news

        self._server = Server((host, 0), Handler)
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="counting-proxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- figures -------------------------------------------------------------------------------------------
    def snapshot(self) -> collections.Counter[Call]:
        with self.lock:
            return collections.Counter(self.calls)

    def count(self, api: str, area: Optional[str] = None, caller: Optional[str] = None) -> int:
        with self.lock:
            return sum(n for c, n in self.calls.items() if c.api == api and (area is None or c.area == area)
                       and (caller is None or c.caller == caller))

    # -- the proxy -----------------------------------------------------------------------------------------
    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(*self.upstream, timeout=30)
            self._local.conn = conn
        return conn

    def _classify(self, h: BaseHTTPRequestHandler, body: bytes) -> tuple[str, str, str]:
        m = _CRED.search(h.headers.get("Authorization", ""))
        caller, service = (m.group(1), m.group(2)) if m else ("", "")
        url = urllib.parse.urlsplit(h.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        if service == "s3":
            action, key = s3_action(h.command, url.path, query)
            # The fleet_access check lists learned/ with MaxKeys 1 (docs/fleet.md, "fleet_access"); the
            # fleet reader lists whole pages: told apart by that.
            if action == "ListObjectsV2" and query.get("max-keys") == ["1"]:
                return caller, f"s3:{action}", "access-check/"
            return caller, f"s3:{action}", area_of(key)
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True) if body else {}
        action = (form.get("Action") or query.get("Action") or [""])[0]
        target = h.headers.get("X-Amz-Target", "")
        if not action and target:
            action = target.rsplit(".", 1)[-1]
        if action == "PutMetricData":
            with self.lock:
                self.metrics[caller].update(metric_identities(form))
        return caller, f"{service or 'unknown'}:{action or h.command}", ""

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        caller, api, area = self._classify(h, body)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
        status, rheaders, rbody = 502, [], b""
        for attempt in range(2):      # a kept-alive upstream connection that moto closed is retried once
            try:
                conn = self._conn()
                conn.request(h.command, h.path, body=body, headers=headers)
                resp = conn.getresponse()
                status, rheaders, rbody = resp.status, resp.getheaders(), resp.read()
                break
            except (OSError, http.client.HTTPException):
                self._local.conn = None
                if attempt:
                    status, rheaders, rbody = 502, [], b""
        with self.lock:
            self.calls[Call(caller, api, area, status)] += 1
        h.send_response(status)
        for k, v in rheaders:
            if k.lower() not in _HOP and k.lower() != "content-length":
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(rbody)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(rbody)
