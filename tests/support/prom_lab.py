"""A real Prometheus inside a lab namespace, scraping lab daemons, and its instant-query API: what the
dashboard tests run every panel's query against (tests/e2e/test_fleet_dashboard.py, test_instance_dashboard.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.support.lab import Lab

PROMETHEUS = "/usr/bin/prometheus"
PROM = "http://127.0.0.1:9090"


def require_prometheus() -> None:
    if not Path(PROMETHEUS).exists() or shutil.which("promtool") is None:
        pytest.fail("prometheus missing: `make test-deps` installs Debian's prometheus package")


def start_prometheus(lab: Lab, ns: str, targets: list[str], tmp_path: Path) -> None:
    """Prometheus in `ns` on 127.0.0.1:9090, scraping `targets` every second; returns once it is ready."""
    prom_cfg = tmp_path / "prometheus.yml"
    prom_cfg.write_text(f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: burstwatch
    static_configs:
      - targets: {json.dumps(targets)}
""")
    lab.popen(ns, PROMETHEUS, f"--config.file={prom_cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
              "--web.listen-address=127.0.0.1:9090", "--log.level=warn",
              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    lab.wait_http(ns, f"{PROM}/-/ready", timeout=20)


def query(lab: Lab, ns: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's vector; a query Prometheus rejects fails with its parse error."""
    url = f"{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        doc = json.loads(lab.http_get(ns, url))
    except OSError as exc:   # urllib's HTTPError: a 400 carries Prometheus' parse error
        body = exc.read().decode() if hasattr(exc, "read") else ""
        raise AssertionError(f"{expr!r}: {exc} {body}") from exc
    assert doc["status"] == "success", (expr, doc)
    assert doc["data"]["resultType"] == "vector", (expr, doc["data"]["resultType"])
    return doc["data"]["result"]  # type: ignore[no-any-return]
