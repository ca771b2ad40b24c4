"""The per-instance Grafana dashboard against a real Prometheus: two `burstwatch run` daemons in two lab
namespaces (a probes b; a reads the test IMDSv2 server, so its eth0 has an ENI ID), Prometheus (Debian's, in
namespace a) scrapes both, and every query of the generated packaging/grafana/burstwatch-dashboard.json,
with $instance as Grafana fills it in (one instance; All), parses and returns series. A query may come back
empty only when it reads a family the daemon does not export at all in the lab, and the only such family is
the ENA driver's allowance counter (a veth has no ENA statistics)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, require_root_tools
from tests.support.daemon_config import daemon_config
from tests.support.imds_server import FakeEni, ImdsServer, metadata_tree
from tests.support.lab import Lab, run_in_ns
from tests.support.prom_lab import PROM, query, require_prometheus, start_prometheus

pytestmark = [pytest.mark.netns, pytest.mark.slow]

DASHBOARD = ROOT / "packaging" / "grafana" / "burstwatch-dashboard.json"
RATE_BIT = 200_000_000      # the shaper on each side: the lab "peak"
METRICS_PORT = 9786
A, B = f"10.97.0.1:{METRICS_PORT}", f"10.97.0.2:{METRICS_PORT}"
MAC_A = "0a:1b:2c:3d:4e:61"
ENI_A = FakeEni(MAC_A, interface_id="eni-0a1b2c3d4e5f60061")
BUDGET = 55.0               # seconds from the daemons' start to the last query
# Families a veth cannot have: ENA statistics come from the ena driver's ethtool -S (docs/metrics.md, "ENA").
NOT_ON_VETH = {"burstwatch_ena_allowance_exceeded_total"}


def _grafana_regex(values: list[str]) -> str:
    """What Grafana puts in place of a multi-value variable inside =~: each value regex-escaped, several
    joined as (a|b)."""
    escaped = [re.sub(r"([\\.^$*+?(){}\[\]|])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _substitute(expr: str, instance: str) -> str:
    out = re.sub(r"\$\{?instance\}?", lambda _: instance, expr)
    assert "$" not in out, f"unsubstituted variable in {expr!r}"
    return out


def _exported(text: str) -> set[str]:
    """The families with at least one sample in a /metrics body."""
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def _families(expr: str) -> set[str]:
    return set(re.findall(r"\b(burstwatch_[a-z_]+)", expr))


def test_every_instance_panel_returns_series(tmp_path: Path) -> None:
    require_root_tools("ip", "tc")
    require_prometheus()
    dashboard = json.loads(DASHBOARD.read_text())
    targets = [(f'{p["title"]} [{t["refId"]}]', t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    assert len(targets) >= 14
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    imds = ImdsServer(metadata_tree(enis=(ENI_A,)))
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, "10.97.0.1/24", "10.97.0.2/24", names=("eth0", "eth0"))
        lab.run(a, "ip", "link", "set", "eth0", "address", MAC_A)
        for ns in (a, b):
            lab.tbf(ns, "eth0", RATE_BIT, 1_000_000)
        run_in_ns(a, imds.start)
        try:
            started = time.monotonic()
            bandwidth = {"baseline_gbps": 0.1, "peak_gbps": 0.2, "burst_bucket_gbit": 50.0}
            cfg_a = daemon_config(
                tmp_path, "a", interfaces=["eth0"], state_dir=tmp_path / "a",
                metrics={"listen": f"10.97.0.1:{METRICS_PORT}"},
                imds={"endpoint": imds.url, "timeout": 0.5},
                instance={"type": "lab.small", "describe_api": False, "bandwidth": bandwidth},
                credits={"shaping_source": "tc"},
                probe={"peers": ["10.97.0.2"], "interval": 10.0, "duration": 1.0, "streams": 1,
                       "credit_floor": 0.0})
            cfg_b = daemon_config(
                tmp_path, "b", interfaces=["eth0"], state_dir=tmp_path / "b",
                metrics={"listen": f"10.97.0.2:{METRICS_PORT}"},
                instance={"type": "lab.small", "describe_api": False, "bandwidth": bandwidth},
                credits={"shaping_source": "tc"},
                responder={"listen": "0.0.0.0:5201", "allow": ["10.97.0.0/24"], "credit_floor": 0.0})
            for ns, name, cfg in ((a, "a", cfg_a), (b, "b", cfg_b)):
                lab.popen(ns, sys.executable, "-m", "agent", "run", "--config", str(cfg), cwd=str(ROOT),
                          stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "wb"))
            start_prometheus(lab, a, [A, B], tmp_path)
            lab.wait_http(a, f"http://{A}/metrics", timeout=20)

            # $instance as Grafana fills it in: one instance (the one with IMDS and probes), and All.
            selections = {"one": _grafana_regex([A]), "all": _grafana_regex([A, B])}
            queries = [(f"{title} ({sel})", _substitute(expr, value), _families(expr))
                       for title, expr in targets for sel, value in selections.items()]
            read = set().union(*(fams for _, _, fams in queries))
            exported: set[str] = set()
            empty = [title for title, _, _ in queries]
            # The probe's first round starts at a random offset in [0, interval): poll within the budget until
            # every family but the ENA-only ones is exported and every query reading exported ones has series.
            while time.monotonic() - started < BUDGET:
                exported = _exported(lab.http_get(a, f"http://{A}/metrics"))
                empty = [title for title, expr, fams in queries if fams <= exported and not query(lab, a, expr)]
                if not empty and read - exported <= NOT_ON_VETH:
                    break
                time.sleep(1.0)
            assert not empty, f"panels without series though the daemon exports their families: {empty}; " \
                              f"logs in {tmp_path}"
        finally:
            imds.stop()

        # The only families a query reads that the daemon does not export are the ENA-only ones; every other
        # query returned series above.
        assert read - exported == NOT_ON_VETH, read - exported
        results = {title: query(lab, a, expr) for title, expr, _ in queries}
        assert all(results[t] for t, _, fams in queries if fams <= exported)

        values = set(json.loads(lab.http_get(a, f"{PROM}/api/v1/label/instance/values?" + urllib.parse.urlencode(
            {"match[]": re.fullmatch(r"label_values\((.+), instance\)", variables["instance"]["query"])[1]})))["data"])
        assert values == {A, B}

        def one(prefix: str, sel: str = "one") -> list[dict[str, Any]]:
            [key] = [k for k in results if k.startswith(prefix) and k.endswith(f"({sel})")]
            return results[key]

        # One instance selected: only its series.
        assert {r["metric"]["instance"] for t, *_ in queries if t.endswith("(one)") for r in results[t]} == {A}
        assert {r["metric"]["instance"] for r in one("Burst credit left, with its band [A]", "all")} == {A, B}
        # The band on the dashboard: the low side <= the bucket in use <= the high side, per direction.
        ratios = {t: {r["metric"]["direction"]: float(r["value"][1])
                      for r in results[f"Burst credit left, with its band [{t}] (one)"]} for t in "ABC"}
        assert set(ratios["A"]) == {"in", "out"}, ratios
        assert all(ratios["B"][d] <= ratios["A"][d] <= ratios["C"][d] for d in ratios["A"]), ratios
        # The ENI join: a's eth0 carries the ENI ID IMDS gave, in the rate and in the table.
        joined = one("Rate per ENI")
        assert {(r["metric"]["interface"], r["metric"]["eni_id"], r["metric"]["direction"]) for r in joined} == \
            {("eth0", ENI_A.interface_id, d) for d in ("in", "out")}
        [row] = one("Interfaces and their ENIs")
        assert {k: row["metric"][k] for k in ("interface", "eni_id", "device_index", "network_card", "mac")} == \
            {"interface": "eth0", "eni_id": ENI_A.interface_id, "device_index": "0", "network_card": "0",
             "mac": MAC_A}
        # Baseline and peak in bit/s, as configured.
        assert {float(r["value"][1]) for r in results["Rate against baseline and peak [B] (one)"]} == {1e8}
        assert {float(r["value"][1]) for r in results["Rate against baseline and peak [C] (one)"]} == {2e8}
        probes = one("Probe throughput")
        assert probes and all(0 < float(r["value"][1]) < 1.05 * RATE_BIT for r in probes), probes
        assert time.monotonic() - started < 70
