"""Serve /metrics: custom prometheus_client collectors that render the latest snapshot, never doing I/O."""

from __future__ import annotations

import logging
import platform
import socket
import socketserver
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from agent import __version__
from agent.sampling.pipeline import Snapshot

log = logging.getLogger(__name__)

NS = "burstwatch"


class BuildInfoView:
    def collect(self) -> Iterable[Metric]:
        m = InfoMetricFamily(f"{NS}_build", "burstwatch version and the Python running it.")
        m.add_metric([], {"version": __version__, "python": platform.python_version()})
        yield m


class SamplerView:
    """Interface counters and rates, instance throughput, collector health and sampling cost."""

    def __init__(self, latest: Callable[[], Optional[Snapshot]]) -> None:
        self._latest = latest

    def collect(self) -> Iterable[Metric]:
        snap = self._latest()
        if snap is None:
            return
        fam = {
            "bytes": CounterMetricFamily(f"{NS}_interface_bytes", "Bytes that crossed the interface, by "
                                         "direction; accounted across counter resets and wraps.",
                                         labels=["interface", "direction"]),
            "packets": CounterMetricFamily(f"{NS}_interface_packets", "Packets that crossed the interface.",
                                           labels=["interface", "direction"]),
            "errors": CounterMetricFamily(f"{NS}_interface_errors", "Receive/transmit errors.",
                                          labels=["interface", "direction"]),
            "dropped": CounterMetricFamily(f"{NS}_interface_drops", "Packets dropped by the kernel or driver.",
                                           labels=["interface", "direction"]),
        }
        # totals follow COUNTER_NAMES: rx bytes, packets, errors, dropped, then tx the same
        for name, tot in sorted(snap.totals.items()):
            for i, key in enumerate(("bytes", "packets", "errors", "dropped")):
                fam[key].add_metric([name, "in"], tot[i])
                fam[key].add_metric([name, "out"], tot[4 + i])
        yield from fam.values()

        resets = CounterMetricFamily(f"{NS}_interface_resets", "Counter decreases handled as a "
                                     "reset, 32-bit wrap or interface re-creation.", labels=["interface"])
        for name in sorted(snap.totals):
            resets.add_metric([name], snap.resets.get(name, 0))
        yield resets

        up = GaugeMetricFamily(f"{NS}_interface_present", "1 when a monitored interface exists now.",
                               labels=["interface"])
        for name in snap.interfaces:
            up.add_metric([name], 1)
        yield up

        ifrate = GaugeMetricFamily(f"{NS}_interface_throughput_bytes_per_second",
                                   "Per-interface rate over the rate window.", labels=["interface", "direction"])
        for name, rates in sorted(snap.interface_rates.items()):
            for d in ("in", "out"):
                ifrate.add_metric([name, d], rates[d])
        yield ifrate

        rate = GaugeMetricFamily(f"{NS}_throughput_bytes_per_second", "Instance rate (all monitored "
                                 "interfaces) over the rate window: the rate the credit estimate uses.",
                                 labels=["direction"])
        if snap.instance_rates is not None:
            for d in ("in", "out"):
                rate.add_metric([d], snap.instance_rates[d])
        yield rate

        ok = GaugeMetricFamily(f"{NS}_collector_success", "1 when the collector's last run succeeded.",
                               labels=["collector"])
        dur = GaugeMetricFamily(f"{NS}_collector_duration_seconds", "Duration of the collector's last run.",
                                labels=["collector"])
        for name, st in sorted(snap.collectors.items()):
            ok.add_metric([name], 1.0 if st.success else 0.0)
            dur.add_metric([name], st.duration)
        yield ok
        yield dur
        yield GaugeMetricFamily(f"{NS}_sample_duration_seconds", "Duration of the last sampling step.",
                                value=snap.sample_duration)
        yield CounterMetricFamily(f"{NS}_samples", "Sampling steps taken.", value=snap.samples_total)
        yield GaugeMetricFamily(f"{NS}_last_sample_timestamp_seconds", "Unix time of the last sample.",
                                value=snap.wall_time)


class ReloadState:
    """Outcome of SIGHUP reloads, written by the daemon, read by scrapes."""

    def __init__(self) -> None:
        self.successful = 1.0
        self.success_time = 0.0
        self.reloads = {"success": 0, "failure": 0}

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(f"{NS}_config_last_reload_successful",
                                "1 when the last config (re)load succeeded; 0 keeps the old config running.",
                                value=self.successful)
        yield GaugeMetricFamily(f"{NS}_config_last_reload_success_timestamp_seconds",
                                "Unix time of the last successful config load.", value=self.success_time)
        c = CounterMetricFamily(f"{NS}_config_reloads", "Config reloads by result.", labels=["result"])
        for k, v in self.reloads.items():
            c.add_metric([k], v)
        yield c


def build_registry(views: Iterable[Any]) -> CollectorRegistry:
    """A registry holding the given views plus the process's own CPU and memory (process_*)."""
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    for v in views:
        reg.register(v)
    return reg


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(host), a reverse DNS lookup that stalls start-up for
        # the resolver's timeout (10 s measured without DNS); the name only feeds SERVER_NAME.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _Server6(_Server):
    address_family = socket.AF_INET6


LANDING = b"""<html><head><title>burstwatch</title></head><body><h1>burstwatch</h1>
<p><a href="/metrics">Metrics</a></p></body></html>"""


class MetricsServer:
    """The /metrics HTTP endpoint on its own thread."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict, start_response: Callable) -> Any:
            if environ.get("PATH_INFO", "/") in ("/", ""):
                start_response("200 OK", [("Content-Type", "text/html")])
                return [LANDING]
            return metrics_app(environ, start_response)

        cls = _Server6 if ":" in host else _Server
        self.httpd = make_server(host, port, app, cls, handler_class=_Handler)
        self.port = self.httpd.server_port
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
