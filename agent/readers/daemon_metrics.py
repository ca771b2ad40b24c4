"""Read a running daemon's /metrics (for `burstwatch status`), over its local socket or HTTP, and parse it."""

from __future__ import annotations

import http.client
import socket
import urllib.request
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def metrics_url(listen: str) -> str:
    """The URL to reach a daemon listening on `listen` from this host (wildcards become loopback)."""
    host, _, port = listen.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}.get(host, host)
    return f"http://{host}:{port}/metrics"


def read_metrics(url: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode("utf-8")


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix stream socket (the daemon's metrics.socket)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def read_metrics_socket(path: str, timeout: float = 3.0) -> str:
    """/metrics from the daemon's local socket. OSError when it cannot be reached (no such file, refused,
    EACCES for a user outside the service's group) or does not answer 200."""
    conn = _UnixConnection(path, timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read()
    except http.client.HTTPException as exc:    # not an HTTP server at that path
        raise OSError(f"{path}: {type(exc).__name__}: {exc}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise OSError(f"{path} answered HTTP {resp.status}")
    return body.decode("utf-8")


def parse_metrics(text: str) -> list[Sample]:
    return [Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]
