"""The fleet Grafana dashboard against a real Prometheus: two `burstwatch run` daemons in two lab namespaces
probe each other, Prometheus (Debian's, in namespace a) scrapes both, and every panel's query of the
generated packaging/grafana/burstwatch-fleet-dashboard.json parses and returns series."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.conftest import ROOT, require_root_tools
from tests.support.daemon_config import daemon_config
from tests.support.lab import Lab
from tests.support.prom_lab import PROM, query, require_prometheus, start_prometheus

pytestmark = [pytest.mark.netns, pytest.mark.slow]

DASHBOARD = ROOT / "packaging" / "grafana" / "burstwatch-fleet-dashboard.json"
RATE_BIT = 200_000_000  # the shaper on each side: the lab "peak"
BASELINE_BIT = 100_000_000  # baseline_gbps below
METRICS_PORT = 9786
# What Grafana sends for a variable set to "All" (the dashboard's allValue).
ALL = ".*"
BUDGET = 55.0  # seconds from the daemons' start to the last query


def _config(tmp: Path, name: str, address: str, peer_ip: str, instance_type: str, bucket: Optional[float]) -> Path:
    """`bucket` None: no burst_bucket_gbit, the daemon's own bucket source."""
    return daemon_config(
        tmp, name, interfaces=["eth0"], state_dir=tmp / name, metrics={"listen": f"{address}:{METRICS_PORT}"},
        instance={"type": instance_type, "describe_api": False,
                  "bandwidth": {"baseline_gbps": 0.1, "peak_gbps": 0.2, "burst_bucket_gbit": bucket}},
        responder={"listen": "0.0.0.0:5201", "allow": ["10.96.0.0/24"], "credit_floor": 0.0},
        probe={"peers": [peer_ip], "interval": 10.0, "duration": 1.0, "streams": 1, "credit_floor": 0.0})


def _substitute(expr: str) -> str:
    """Grafana's interpolation of the dashboard's variables, with every one set to All."""
    out = re.sub(r"\$\{?(job|instance)\}?", ALL, expr)
    assert "$" not in out, f"unsubstituted variable in {expr!r}"
    return out


def _targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f'{p["title"]} [{t["refId"]}]', _substitute(t["expr"])) for p in dashboard["panels"] for t in p["targets"]]


def _variable_values(lab: Lab, ns: str, query: str) -> set[str]:
    """label_values(<selector>, <label>) as Grafana asks Prometheus for it."""
    m = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
    assert m, query
    url = f"{PROM}/api/v1/label/{m[2]}/values?" + urllib.parse.urlencode({"match[]": _substitute(m[1])})
    return set(json.loads(lab.http_get(ns, url))["data"])


def test_every_fleet_panel_returns_series(tmp_path: Path) -> None:
    require_root_tools("ip", "tc")
    require_prometheus()
    dashboard = json.loads(DASHBOARD.read_text())
    targets = _targets(dashboard)
    assert len(targets) >= 10
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, "10.96.0.1/24", "10.96.0.2/24", names=("eth0", "eth0"))
        for ns in (a, b):
            lab.tbf(ns, "eth0", RATE_BIT, 1_000_000)
        started = time.monotonic()
        # Two types and two bucket sources, so the per-type table has rows told apart by `source`.
        for ns, name, addr, peer, itype, bucket in (
                (a, "a", "10.96.0.1", "10.96.0.2", "lab.small", 50.0),
                (b, "b", "10.96.0.2", "10.96.0.1", "lab.large", None)):
            cfg = _config(tmp_path, name, addr, peer, itype, bucket)
            lab.popen(ns, sys.executable, "-m", "agent", "run", "--config", str(cfg), cwd=str(ROOT),
                      stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "wb"))
        start_prometheus(lab, a, [f"10.96.0.{i}:{METRICS_PORT}" for i in (1, 2)], tmp_path)

        # Probe rounds start at a random offset in [0, interval) and collide now and then (each side
        # answers "busy" while its own probe runs): poll until every panel has series, within the budget.
        empty = [title for title, _ in targets]
        while empty and time.monotonic() - started < BUDGET:
            time.sleep(1.0)
            empty = [title for title, expr in targets if not query(lab, a, expr)]
        assert not empty, f"panels without series after {BUDGET}s: {empty}; logs in {tmp_path}"

        results = {title: query(lab, a, expr) for title, expr in targets}
        instances = {f"10.96.0.{i}:{METRICS_PORT}" for i in (1, 2)}
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert _variable_values(lab, a, variables["job"]["query"]) == {"burstwatch"}
        assert _variable_values(lab, a, variables["instance"]["query"]) == instances

        def one(title: str) -> list[dict[str, Any]]:
            [key] = [k for k in results if k.startswith(title)]
            return results[key]

        assert float(one("Instances reporting")[0]["value"][1]) == 2
        # Nothing is exhausted in the lab: the stat says 0, not "no data".
        assert float(one("Shaped at the baseline now")[0]["value"][1]) == 0
        # Soonest first: one row per instance and direction, ascending.
        soonest = one("Soonest exhaustion first")
        assert {(r["metric"]["instance"], r["metric"]["direction"]) for r in soonest} == \
            {(i, d) for i in instances for d in ("in", "out")}
        values = [float(r["value"][1]) for r in soonest]
        assert values == sorted(values)
        per_type = {(r["metric"]["instance_type"], r["metric"]["source"], r["metric"]["direction"]):
                    float(r["value"][1]) for r in one("Bucket per instance type (median, Gbit) [A]")}
        assert per_type[("lab.small", "config", "out")] == pytest.approx(50.0)
        assert {(t, s) for t, s, _ in per_type} == {("lab.small", "config"), ("lab.large", "default")}
        assert {float(r["value"][1]) for r in one("Bucket per instance type (median, Gbit) [B]")} == {1.0}
        checks = one("Failed checks by check")
        assert all(float(r["value"][1]) in (0.0, 1.0, 2.0) for r in checks) and \
            len({r["metric"]["check"] for r in checks}) == len(checks)
        # The matrix: each source instance measured its peer; the rates are the lab's shaper.
        for title in ("Probe throughput, source → peer", "Probe throughput, peer → source"):
            cells = {(r["metric"]["instance"], r["metric"]["peer"]): float(r["value"][1]) for r in one(title)}
            assert cells, title
            assert set(cells) <= {("10.96.0.1:9786", "10.96.0.2:5201"), ("10.96.0.2:9786", "10.96.0.1:5201")}
            # In bit/s: between well under the lab's baseline (probes may be paced at it, [probe] rate) and
            # the shaper; a bytes/bits slip (x8) lands outside.
            assert all(0.3 * BASELINE_BIT < v < 1.05 * RATE_BIT for v in cells.values()), (title, cells)
        assert time.monotonic() - started < 60
