"""The /metrics HTTP server (agent/exporters/http.py) and the exposition it serves (prometheus.py): routes,
methods, request parsing, header timeout, the connection cap, keep-alive, and one render per snapshot."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Optional
from wsgiref.util import setup_testing_defaults

import pytest
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.config import MetricsConfig
from agent.exporters.http import HttpServer
from agent.exporters.http_request import Limits, Request, parse_request
from agent.exporters.http_response import Response
from agent.exporters.prometheus import BuildInfoView, Exposition, MetricsServer, build_registry

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=0.0.1; charset=utf-8"
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


class Ticking:
    """A view whose value changes at every collect(): it shows exactly when a render happened."""

    def __init__(self) -> None:
        self.collects = 0

    def collect(self) -> Iterable[Metric]:
        self.collects += 1
        yield CounterMetricFamily("burstwatch_test_collects", "Collects so far.", value=self.collects)
        g = GaugeMetricFamily("burstwatch_test_value", "Labelled values.", labels=["interface", "direction"])
        for i in range(20):
            for d in ("in", "out"):
                g.add_metric([f"eth{i}", d], i * 1.5)
        yield g


class Token:
    """The generation the daemon passes: a new object per sample (here, per bump())."""

    def __init__(self) -> None:
        self.value = object()

    def bump(self) -> None:
        self.value = object()

    def __call__(self) -> object:
        return self.value


@pytest.fixture
def served() -> Iterator[tuple[MetricsServer, Ticking, Token]]:
    view, token = Ticking(), Token()
    server = MetricsServer("127.0.0.1", 0, build_registry([BuildInfoView(), view]),
                           config=MetricsConfig(header_timeout=1.0), generation=token)
    server.start()
    try:
        yield server, view, token
    finally:
        server.stop()


def get(port: int, path: str = "/metrics", headers: Optional[dict[str, str]] = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send bytes, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


# -- routes and methods ---------------------------------------------------------------------------

def test_landing_page_links_to_metrics_and_other_paths_are_404(served: tuple) -> None:
    server, _, _ = served
    status, headers, body = get(server.port, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'<a href="/metrics">' in body
    for path in ("/foo", "/metrics/", "/favicon.ico", "/metricsx", "/-/healthy"):
        status, _, body = get(server.port, path)
        assert status == 404, path
        assert b"/metrics" not in body and b"burstwatch_" not in body


def test_only_get_and_head(served: tuple) -> None:
    server, _, _ = served
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "TRACE"):
        status, headers, _ = get(server.port, "/metrics", method=method)
        assert status == 405, method
        assert headers["Allow"] == "GET, HEAD"
    status, headers, body = get(server.port, "/metrics", method="HEAD")
    full = get(server.port, "/metrics")
    assert status == 200 and body == b""
    assert int(headers["Content-Length"]) == len(full[2]) and headers["Content-Type"] == TEXT


@pytest.mark.parametrize("head, status", [
    (b"GET /metrics HTTP/1.1\r\nHost: x", None),
    (b"GET /metrics?name[]=a HTTP/1.0", None),
    (b"GET http://host:9786/metrics HTTP/1.1\r\nHost: host", None),
    (b"GET /metrics HTTP/2.0", 505),
    (b"GET /metrics", 400),
    (b"GET  /metrics HTTP/1.1", 400),
    (b"GET metrics HTTP/1.1", 400),
    (b"\x16\x03\x01\x02\x00\x01", 400),                                  # a TLS ClientHello on the plain port
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded", 400),               # obs-fold
    (b"GET /metrics HTTP/1.1\r\nHost : x", 400),                         # space before the colon
    (b"GET /metrics HTTP/1.1\r\nno colon here", 400),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 5", 400),                # a body on a GET
    (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked", 400),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 0", None),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 5", 405),
    (b"GET /metrics HTTP/1.1" + b"\r\nX: y" * 101, 431),
])
def test_parse_request(head: bytes, status: Optional[int]) -> None:
    out = parse_request(head, "peer")
    if status is None:
        assert isinstance(out, Request) and out.path == "/metrics"
    else:
        assert isinstance(out, Response) and out.status == status


def test_parse_request_fields() -> None:
    req = parse_request(b"GET /metrics?name[]=x&b=2 HTTP/1.1\r\nAccept: a\r\nACCEPT: b\r\nHost:h", "1.2.3.4:5")
    assert isinstance(req, Request)
    assert (req.method, req.path, req.query, req.version) == ("GET", "/metrics", "name[]=x&b=2", "HTTP/1.1")
    assert req.headers == {"accept": "a, b", "host": "h"}


def test_oversized_and_malformed_requests_get_an_error_and_a_close(served: tuple) -> None:
    server, _, _ = served
    assert raw(server.port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000).startswith(b"HTTP/1.1 431 ")
    out = raw(server.port, b"GET /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    assert out.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in out
    assert raw(server.port, b"BREW /pot HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert raw(server.port, b"\x00\xff\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert server.httpd.open_connections() == 0


# -- the exposition -------------------------------------------------------------------------------

def _wsgi(registry: CollectorRegistry, path: str, query: str, headers: dict[str, str]) -> tuple[str, dict, bytes]:
    """What prometheus_client's own WSGI app (the server before this one) answers."""
    environ: dict = {"PATH_INFO": path, "QUERY_STRING": query}
    environ.update({"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()})
    setup_testing_defaults(environ)
    got: dict = {}

    def start_response(status: str, hdrs: list) -> None:
        got["status"], got["headers"] = status, dict(hdrs)

    body = b"".join(make_wsgi_app(registry)(environ, start_response))
    return got["status"], got["headers"], body


class Fixed:
    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily("burstwatch_fixed", "A fixed counter.", value=42)
        g = GaugeMetricFamily("burstwatch_fixed_ratio", "A gauge with labels.", labels=["direction"])
        g.add_metric(["in"], 0.25)
        g.add_metric(["out"], float("inf"))
        yield g


@pytest.mark.parametrize("headers, query", [
    ({}, ""),
    ({"Accept": PROMETHEUS_ACCEPT}, ""),
    ({"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}, ""),
    ({"Accept-Encoding": "deflate, gzip;q=0.5"}, ""),
    ({}, "name[]=burstwatch_fixed"),
])
@pytest.mark.parametrize("cached", [False, True])
def test_exposition_is_what_prometheus_client_serves(headers: dict[str, str], query: str, cached: bool) -> None:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(Fixed())
    _, want_headers, want = _wsgi(registry, "/metrics", query, headers)
    exposition = Exposition(registry, Token() if cached else None)
    req = Request("GET", "/metrics", query, "HTTP/1.1", {k.lower(): v for k, v in headers.items()}, "peer")
    resp = exposition(req, True)
    assert resp is not None and resp.status == 200
    assert dict(resp.headers) == want_headers
    if "Content-Encoding" in want_headers:  # gzip embeds the time: compare what it holds
        assert gzip.decompress(resp.body) == gzip.decompress(want)
    else:
        assert resp.body == want


def test_one_render_per_snapshot(served: tuple) -> None:
    server, view, token = served
    first = [get(server.port)[2] for _ in range(5)]
    assert len(set(first)) == 1, "scrapes between two samples get the same bytes"
    assert view.collects == 1 and server.exposition.renders == 1
    token.bump()
    second = get(server.port)[2]
    assert second != first[0] and b"burstwatch_test_collects_total 2.0" in second
    # OpenMetrics and gzip are rendered once each per snapshot too, from the same collect where they can be
    om = [get(server.port, headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})[2] for _ in range(3)]
    assert len(set(om)) == 1 and gzip.decompress(om[0]).endswith(b"# EOF\n")
    assert server.exposition.renders == 3
    assert get(server.port)[2] == second


def test_concurrent_scrapes_of_a_new_snapshot_share_one_render(served: tuple) -> None:
    server, view, token = served
    token.bump()
    bodies: list[bytes] = []
    threads = [threading.Thread(target=lambda: bodies.append(get(server.port)[2])) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(bodies) == 30 and len(set(bodies)) == 1
    assert view.collects == 1


def test_without_a_generation_every_scrape_renders() -> None:
    view = Ticking()
    server = MetricsServer("127.0.0.1", 0, build_registry([view]))
    server.start()
    try:
        assert get(server.port)[2] != get(server.port)[2]
        assert view.collects == 2
    finally:
        server.stop()


def test_cached_scrapes_need_no_worker() -> None:
    """The event loop answers a scrape of an already rendered snapshot itself: a busy worker pool (a slow
    render, a bcrypt check) does not delay it."""
    release, entered = threading.Event(), threading.Event()

    def slow(req: Request, may_block: bool) -> Optional[Response]:
        if not may_block:
            return None
        entered.set()
        release.wait(10)
        return Response(200, b"slow")

    exposition = Exposition(build_registry([Ticking()]), Token())
    server = HttpServer("127.0.0.1", 0, {"/metrics": exposition, "/slow": slow}, limits=Limits(workers=1))
    server.start()
    try:
        assert get(server.port)[0] == 200                      # rendered by the worker, now cached
        stuck = threading.Thread(target=get, args=(server.port, "/slow"))
        stuck.start()
        assert entered.wait(10), "the slow request never reached the worker"    # the one worker is busy now
        t0 = time.monotonic()
        assert get(server.port)[0] == 200
        # A scrape that needed a worker would wait for `release` (10 s); the loop answers in milliseconds.
        # 1 s leaves a margin of 10x either way.
        assert time.monotonic() - t0 < 1.0
        release.set()
        stuck.join(10)
    finally:
        release.set()
        server.stop()


# -- connections ----------------------------------------------------------------------------------

def test_keep_alive_serves_several_requests_on_one_connection_then_idles_out(served: tuple) -> None:
    server, _, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for _ in range(3):
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read()
    assert server.httpd.counts["accepted"] == 1 and server.httpd.open_connections() == 1
    deadline = time.monotonic() + 5
    while server.httpd.open_connections() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.httpd.open_connections() == 0 and server.httpd.counts["idle-closed"] == 1
    conn.close()


def _closed_within(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closed `sock` (it sends nothing: the read returns b"")."""
    t0 = time.monotonic()
    sock.settimeout(limit)
    try:
        assert sock.recv(1024) == b""
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_header_timeout_closes_slow_and_silent_clients(served: tuple) -> None:
    server, _, _ = served                                      # header_timeout = 1.0
    silent = socket.create_connection(("127.0.0.1", server.port))
    partial = socket.create_connection(("127.0.0.1", server.port))
    partial.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    drip = socket.create_connection(("127.0.0.1", server.port))

    def dripping() -> None:  # one byte every 0.1 s: progress does not extend the deadline
        try:
            for b in b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nUser-Agent: slow\r\n":
                drip.send(bytes([b]))
                time.sleep(0.1)
        except OSError:
            pass

    t = threading.Thread(target=dripping)
    t.start()
    for s in (silent, partial, drip):
        assert _closed_within(s, 3.0) < 2.0
        s.close()
    t.join(10)
    assert server.httpd.counts["timeout-header"] == 3


def test_the_cap_closes_the_oldest_waiting_connection_and_a_scrape_gets_through() -> None:
    server = MetricsServer("127.0.0.1", 0, build_registry([Ticking()]),
                           config=MetricsConfig(max_connections=16, header_timeout=30.0), generation=Token())
    server.start()
    held = []
    try:
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            held.append(s)
        time.sleep(0.3)
        assert server.httpd.open_connections() <= 16
        t0 = time.monotonic()
        assert get(server.port)[0] == 200
        assert time.monotonic() - t0 < 2.0
        assert server.httpd.counts["evicted-cap"] >= 24 + 1
        # the oldest went first: the first 25 are closed, the last 15 are still open
        assert all(_closed_within(s, 1.0) < 1.0 for s in held[:25])
        deadline = time.monotonic() + 2.0  # the scrape's own connection closes just after its response
        while server.httpd.open_connections() > 15 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.httpd.open_connections() == 15
    finally:
        for s in held:
            s.close()
        server.stop()


def test_stop_closes_connections_and_frees_the_port() -> None:
    server = MetricsServer("127.0.0.1", 0, build_registry([]))
    port = server.port
    server.start()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /")
    time.sleep(0.1)
    server.stop()
    assert _closed_within(s, 2.0) < 2.0
    s.close()
    again = MetricsServer("127.0.0.1", port, build_registry([]))
    again.stop()


def test_constructible_as_before_and_binds_at_construction() -> None:
    """agent/daemon.py builds MetricsServer(host, port, registry); a taken port fails there, not later."""
    server = MetricsServer("127.0.0.1", 0, build_registry([]))
    try:
        with pytest.raises(OSError):
            MetricsServer("127.0.0.1", server.port, build_registry([]))
        server.start()
        assert get(server.port)[0] == 200
    finally:
        server.stop()


def test_ipv6_loopback() -> None:
    try:
        server = MetricsServer("::1", 0, build_registry([BuildInfoView()]))
    except OSError:
        pytest.skip("no IPv6 loopback on this host")
    server.start()
    try:
        with urllib.request.urlopen(f"http://[::1]:{server.port}/metrics", timeout=5) as r:
            assert b"burstwatch_build_info" in r.read()
    finally:
        server.stop()

