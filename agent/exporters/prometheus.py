"""Prometheus views of the latest snapshot (never doing I/O) and /metrics, rendered once per snapshot."""

from __future__ import annotations

import gzip
import logging
import platform
import threading
from typing import Any, Callable, Iterable, Optional, Sequence
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.process_collector import ProcessCollector

from agent import __version__
from agent.config import MetricsConfig
from agent.exporters import View, declared, family
from agent.exporters.http import HttpServer
from agent.exporters.http_request import Handler, Limits, Request
from agent.exporters.http_response import Response
from agent.exporters.webconfig import basic_auth, tls_context
from agent.models import figures as F
from agent.models.units import DIRECTIONS
from agent.sampling.pipeline import Snapshot

log = logging.getLogger(__name__)


class BuildInfoView(View):
    FAMILIES = declared(F.BUILD_INFO)

    def collect(self) -> Iterable[Metric]:
        m = family(F.BUILD_INFO)
        m.add_metric([], {"version": __version__, "python": platform.python_version()})
        yield m


class SamplerView(View):
    """Interface counters and rates, instance throughput, collector health and sampling cost."""

    FAMILIES = declared(F.INTERFACE_BYTES_TOTAL, F.INTERFACE_PACKETS_TOTAL, F.INTERFACE_ERRORS_TOTAL,
                        F.INTERFACE_DROPS_TOTAL, F.INTERFACE_RESETS_TOTAL, F.INTERFACE_PRESENT,
                        F.INTERFACE_THROUGHPUT_BYTES_PER_SECOND, F.THROUGHPUT_BYTES_PER_SECOND, F.COLLECTOR_SUCCESS,
                        F.COLLECTOR_DURATION_SECONDS, F.SAMPLE_DURATION_SECONDS, F.SAMPLES_TOTAL,
                        F.LAST_SAMPLE_TIMESTAMP_SECONDS)

    def __init__(self, latest: Callable[[], Optional[Snapshot]]) -> None:
        self._latest = latest

    def collect(self) -> Iterable[Metric]:
        snap = self._latest()
        if snap is None:
            return
        # totals follow COUNTER_NAMES: rx bytes, packets, errors, dropped, then tx the same
        fam = [family(f) for f in (F.INTERFACE_BYTES_TOTAL, F.INTERFACE_PACKETS_TOTAL, F.INTERFACE_ERRORS_TOTAL,
                                   F.INTERFACE_DROPS_TOTAL)]
        for name, tot in sorted(snap.totals.items()):
            for i, f in enumerate(fam):
                f.add_metric([name, "in"], tot[i])
                f.add_metric([name, "out"], tot[4 + i])
        yield from fam

        resets = family(F.INTERFACE_RESETS_TOTAL)
        for name in sorted(snap.totals):
            resets.add_metric([name], snap.resets.get(name, 0))
        yield resets

        up = family(F.INTERFACE_PRESENT)
        for name in snap.interfaces:
            up.add_metric([name], 1)
        yield up

        ifrate = family(F.INTERFACE_THROUGHPUT_BYTES_PER_SECOND)
        for name, rates in sorted(snap.interface_rates.items()):
            for d in ("in", "out"):
                ifrate.add_metric([name, d], rates[d])
        yield ifrate

        rate = family(F.THROUGHPUT_BYTES_PER_SECOND)
        read = F.THROUGHPUT_BYTES_PER_SECOND.read
        assert read is not None
        for d in DIRECTIONS:
            value = read(snap, d)
            if value is not None:
                rate.add_metric([d], value)
        yield rate

        ok = family(F.COLLECTOR_SUCCESS)
        dur = family(F.COLLECTOR_DURATION_SECONDS)
        for name, st in sorted(snap.steps.items()):
            ok.add_metric([name], 1.0 if st.success else 0.0)
            dur.add_metric([name], st.duration)
        yield ok
        yield dur
        yield family(F.SAMPLE_DURATION_SECONDS, snap.sample_duration)
        yield family(F.SAMPLES_TOTAL, snap.samples_total)
        yield family(F.LAST_SAMPLE_TIMESTAMP_SECONDS, snap.wall_time)


class ReloadState(View):
    """Outcome of SIGHUP reloads, written by the daemon, read by scrapes."""

    FAMILIES = declared(F.CONFIG_LAST_RELOAD_SUCCESSFUL, F.CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS,
                        F.CONFIG_RELOADS_TOTAL, F.CONFIG_RESTART_PENDING)

    def __init__(self) -> None:
        self.successful = 1.0
        self.success_time = 0.0
        self.reloads = {"success": 0, "failure": 0}
        self.restart_pending: list[str] = []        # keys whose new value waits for a restart

    def collect(self) -> Iterable[Metric]:
        yield family(F.CONFIG_LAST_RELOAD_SUCCESSFUL, self.successful)
        yield family(F.CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS, self.success_time)
        c = family(F.CONFIG_RELOADS_TOTAL)
        for k, v in self.reloads.items():
            c.add_metric([k], v)
        yield c
        yield family(F.CONFIG_RESTART_PENDING, 1.0 if self.restart_pending else 0.0)


def build_registry(views: Iterable[Any]) -> CollectorRegistry:
    """A registry holding the given views plus the process's own CPU and memory (process_*)."""
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    for v in views:
        reg.register(v)
    return reg


LANDING = b"""<html><head><title>burstwatch</title></head><body><h1>burstwatch</h1>
<p><a href="/metrics">Metrics</a></p></body></html>"""


def landing(req: Request, may_block: bool) -> Response:
    return Response(200, LANDING, (("Content-Type", "text/html; charset=utf-8"),))


def readiness(not_listening: Callable[[], Sequence[str]]) -> Callable[[Request, bool], Response]:
    """/-/ready, the Kubernetes readiness probe's path: 200 while every listener the config asks for listens,
    503 naming those that do not. A responder whose port is taken or privileged logs an error and the daemon
    runs on (its listening gauge reads 0): without this, such a pod would still be Ready. /metrics itself
    needs no entry: this answer comes through it, and a daemon whose /metrics cannot bind exits."""
    def ready(req: Request, may_block: bool) -> Response:
        missing = list(not_listening())
        if missing:
            return Response(503, f"not ready: not listening: {', '.join(missing)}\n".encode(), _TEXT)
        return Response(200, b"ready\n", _TEXT)
    return ready


_TEXT = (("Content-Type", "text/plain; charset=utf-8"),)


_NOTHING = object()


class Exposition:
    """The /metrics handler: the registry rendered at most once per generation of the data.

    `generation` returns a token that changes whenever the views may render differently: the daemon passes
    the sampler's latest Snapshot, which is replaced (never mutated) once per sample. Scrapes between two
    samples get the same bytes, rendered by the first of them; later ones cost no render and no I/O and
    are answered from the event loop. Other services' views (probes, reloads, checks) are as of that
    render, at most one sample interval old. Without `generation` every scrape renders, as before.
    The bytes are prometheus_client's own encoders' (text or OpenMetrics by Accept, gzip by
    Accept-Encoding, `name[]` filters), so the exposition is unchanged."""

    def __init__(self, registry: CollectorRegistry, generation: Optional[Callable[[], object]] = None) -> None:
        self.registry = registry
        self.generation = generation
        self._lock = threading.Lock()
        # (token, {(content type, gzip): body}); replaced whole, so a reader never sees a half-filled one
        self._cache: tuple[object, dict[tuple[str, bool], bytes]] = (_NOTHING, {})
        self.renders = 0

    def __call__(self, req: Request, may_block: bool) -> Optional[Response]:
        encoder, content_type = choose_encoder(req.headers.get("accept", ""))
        gz = gzip_accepted(req.headers.get("accept-encoding", ""))
        headers: tuple[tuple[str, str], ...] = (("Content-Type", content_type),)
        if gz:
            headers += (("Content-Encoding", "gzip"),)
        params = parse_qs(req.query) if req.query else {}
        if "name[]" in params or self.generation is None:
            if not may_block:
                return None
            body = encoder(self.registry.restricted_registry(params["name[]"]) if "name[]" in params  # type: ignore[arg-type]
                           else self.registry)
            self.renders += 1
            return Response(200, gzip.compress(body) if gz else body, headers)
        token, bodies = self._cache
        cached = bodies.get((content_type, gz)) if token is self.generation() else None
        if cached is not None:
            return Response(200, cached, headers)
        if not may_block:
            return None
        return Response(200, self._render(encoder, content_type, gz), headers)

    def _render(self, encoder: Callable[[CollectorRegistry], bytes], content_type: str, gz: bool) -> bytes:
        assert self.generation is not None
        with self._lock:  # concurrent scrapes of a new generation wait for one render
            token = self.generation()
            cached_token, bodies = self._cache
            if cached_token is not token:
                bodies = {}
            body = bodies.get((content_type, gz))
            if body is None:
                plain = bodies.get((content_type, False))
                if plain is None:
                    plain = encoder(self.registry)
                    self.renders += 1
                body = gzip.compress(plain) if gz else plain
                self._cache = (token, {**bodies, (content_type, False): plain, (content_type, gz): body})
            return body


class MetricsServer:
    """/metrics and a landing page at /, over HTTP or HTTPS with basic auth as [metrics] says; on its own
    threads (agent/exporters/http.py)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, *,
                 config: Optional[MetricsConfig] = None, generation: Optional[Callable[[], object]] = None,
                 not_listening: Callable[[], Sequence[str]] = tuple) -> None:
        cfg = config if config is not None else MetricsConfig()
        self.exposition = Exposition(registry, generation)
        routes: dict[str, Handler] = {"/metrics": self.exposition, "/": landing, "/-/ready": readiness(not_listening)}
        self.httpd = HttpServer(host, port, routes, limits=_limits(cfg),
                                tls=tls_context(cfg), auth=basic_auth(cfg))
        self.port = self.httpd.port

    def start(self) -> None:
        self.httpd.start()

    def stop(self) -> None:
        self.httpd.stop()

    def reconfigure(self, config: MetricsConfig) -> None:
        """Apply a reloaded [metrics] (listen aside): certificates, users and limits are read again and take
        effect for new connections. Raises ConfigError, naming the key, and keeps the old ones."""
        self.httpd.reconfigure(_limits(config), tls_context(config), basic_auth(config))


def _limits(cfg: MetricsConfig) -> Limits:
    return Limits(header_timeout=cfg.header_timeout, max_connections=cfg.max_connections)
