"""Read a running daemon's /metrics (for `burstwatch status`) and parse it into samples."""

from __future__ import annotations

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


def parse_metrics(text: str) -> list[Sample]:
    return [Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]
