"""Two real `burstwatch run` daemons in two namespaces probe each other's responders on a schedule,
and a probe's figure agrees with what Debian's iperf3 measures on the same shaped path."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_root_tools
from tests.support.credit_lab import parse_metrics
from tests.support.daemon_config import daemon_config
from tests.support.lab import Lab
from tests.support.metrics_doc import undocumented

pytestmark = [pytest.mark.netns, pytest.mark.slow]

RATE_BIT = 200_000_000  # the shaper on each side


def _config(tmp: Path, name: str, peer_ip: str, allow: str) -> Path:
    return daemon_config(
        tmp, name, interfaces=["eth0"], state_dir=tmp / name, metrics={"listen": "127.0.0.1:9786"},
        instance={"type": "lab.pair", "bandwidth": {"baseline_gbps": 0.2, "peak_gbps": 0.2}},
        responder={"listen": "0.0.0.0:5201", "allow": [allow]},
        probe={"peers": [peer_ip], "interval": 10.0, "duration": 2.0, "streams": 2})


def test_two_daemons_probe_each_other(tmp_path: Path) -> None:
    require_root_tools("ip", "tc", "iperf3")
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, "10.96.0.1/24", "10.96.0.2/24", names=("eth0", "eth0"))
        for ns in (a, b):
            lab.tbf(ns, "eth0", RATE_BIT, 1_000_000)
        procs = {}
        for ns, name, peer in ((a, "a", "10.96.0.2"), (b, "b", "10.96.0.1")):
            cfg = _config(tmp_path, name, peer, "10.96.0.0/24")
            procs[name] = lab.popen(ns, sys.executable, "-m", "agent", "run", "--config", str(cfg), cwd=str(ROOT),
                                    stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "wb"))
        for ns in (a, b):
            lab.wait_http(ns, "http://127.0.0.1:9786/metrics")

        # The first round starts at a random offset in [0, interval); each probes out and in, one at a time.
        want = {(a, "10.96.0.2:5201"), (b, "10.96.0.1:5201")}
        seen: dict[tuple[str, str], dict[str, float]] = {}
        # Generous: each refuses tests while its own probe runs, so colliding rounds back off and retry.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(seen) < 4:
            for ns, peer in want:
                m = parse_metrics(lab.http_get(ns, "http://127.0.0.1:9786/metrics"))
                for d in ("out", "in"):
                    key = f'burstwatch_probe_success{{direction="{d}",peer="{peer}"}}'
                    if m.get(key) == 1.0:
                        seen[(ns, d)] = m
            time.sleep(1.0)
        assert len(seen) == 4, f"probes that succeeded: {sorted(seen)}; logs in {tmp_path}"

        rates = []
        for (ns, d), m in seen.items():
            peer = "10.96.0.2:5201" if ns == a else "10.96.0.1:5201"
            rate = m[f'burstwatch_probe_throughput_bytes_per_second{{direction="{d}",peer="{peer}"}}'] * 8
            rates.append(rate)
            assert 0.85 * RATE_BIT < rate < 1.02 * RATE_BIT, (ns, d, rate)
        responder_tests = parse_metrics(lab.http_get(b, "http://127.0.0.1:9786/metrics"))
        assert responder_tests['burstwatch_responder_tests_total{result="completed"}'] >= 2
        assert not undocumented(lab.http_get(a, "http://127.0.0.1:9786/metrics"))

        for p in procs.values():
            p.terminate()
            assert p.wait(10) == 0

        # The same shaped path measured by Debian's iperf3 alone (the daemons, which keep probing each
        # other and answer "busy" meanwhile, are stopped first).
        server = lab.popen(b, "iperf3", "-s", "-1", "-B", "10.96.0.2")
        for _ in range(50):   # until the one-off server listens
            out = lab.run(a, "iperf3", "-c", "10.96.0.2", "-t", "2", "-P", "2", "--json", check=False)
            doc = json.loads(out.stdout)
            if "unable to connect" not in str(doc.get("error", "")):
                break
            time.sleep(0.1)
        assert "error" not in doc, doc.get("error")
        iperf3_rate = doc["end"]["sum_received"]["bits_per_second"]
        assert abs(sum(rates) / len(rates) - iperf3_rate) / iperf3_rate < 0.05, (rates, iperf3_rate)
        server.wait(10)
