"""An OpenMetrics file from `burstwatch replay --openmetrics` backfilled with the real promtool and queried
through a real Prometheus on loopback (no scraping: it only serves the backfilled blocks)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

import pytest

from tests.conftest import free_port


def require_prometheus() -> None:
    """Fail loudly (not skip): `make test-deps` installs Debian's prometheus package, CI has it."""
    missing = [t for t in ("promtool", "prometheus") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing {missing}: `make test-deps` installs Debian's prometheus package")


def backfill(openmetrics: Path, data: Path) -> str:
    """`promtool tsdb create-blocks-from openmetrics FILE DIR`; its output (the blocks' table)."""
    done = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    return done.stdout


class Prometheus:
    """A Prometheus over a backfilled data directory, on 127.0.0.1 only; close() stops it."""

    def __init__(self, data: Path) -> None:
        conf = data.parent / f"{data.name}-prometheus.yml"
        conf.write_text("global: {scrape_interval: 15s, evaluation_interval: 15s}\nscrape_configs: []\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A century of retention: the replayed series are as old as the trace, and a default 15-d retention
        # would drop them as soon as the blocks are loaded.
        self.proc = subprocess.Popen(["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={data}",
                                      "--storage.tsdb.retention.time=100y",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError("prometheus did not become ready")
            time.sleep(0.2)

    def query_range(self, expr: str, start: float, end: float, step: float = 15.0) -> list[dict]:
        """The matrix of `expr` from start to end at `step` (Prometheus caps a query at 11,000 points: the
        range is queried in pieces)."""
        out: dict[str, dict] = {}
        chunk = step * 10_000
        t = start
        while t <= end:
            q = urllib.parse.urlencode({"query": expr, "start": t, "end": min(end, t + chunk), "step": step})
            with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{q}", timeout=120) as r:
                doc = json.load(r)
            assert doc["status"] == "success", doc
            for series in doc["data"]["result"]:
                key = json.dumps(series["metric"], sort_keys=True)
                out.setdefault(key, {"metric": series["metric"], "values": []})["values"] += series["values"]
            t += chunk + step
        return list(out.values())

    def query(self, expr: str, at: float) -> list[dict]:
        q = urllib.parse.urlencode({"query": expr, "time": at})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=60) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return list(doc["data"]["result"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def alert_fires(values: list[list], for_seconds: float, step: float = 15.0) -> list[float]:
    """When an alert over `values` (a query_range series of the alert's expression: present = active) goes
    firing, as the rule manager evaluating every `step` applies `for:`: active at consecutive evaluations
    for at least `for_seconds`."""
    fires, since, prev = [], None, None
    firing = False
    for ts, v in values:
        t = float(ts)
        if prev is None or t - prev > step + 1e-6 or math.isnan(float(v)):
            since, firing = None, False
        if since is None:
            since = t
        if not firing and t - since >= for_seconds - 1e-6:
            firing = True
            fires.append(t)
        prev = t
    return fires


def value_at(series: list[dict], label: str, want: str) -> Optional[list[list]]:
    """The values of the series whose `label` is `want`, merged in time order. An alert's labels are its
    series' without the metric name, and an `or` of two families alternates names from step to step, so the
    series that differ only in __name__ are one alert."""
    points = sorted({float(t): v for s in series if s["metric"].get(label) == want for t, v in s["values"]}.items())
    return [[t, v] for t, v in points] if points else None


RULES = Path(__file__).resolve().parents[2] / "packaging" / "prometheus" / "burstwatch.rules.yml"


def shipped_alert(name: str) -> tuple[str, float]:
    """(expr, `for:` in seconds) of one alert in the shipped rules file, read from the file itself."""
    import yaml

    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                spec = str(rule.get("for", "0s"))
                return str(rule["expr"]), float(spec[:-1]) * units[spec[-1]]
    raise KeyError(name)
