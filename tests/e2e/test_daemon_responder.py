"""The daemon's own responder answers a stock `iperf3 -c`, and its metrics are all documented."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, wait_port
from tests.support.daemon_config import daemon_config
from tests.support.metrics_doc import undocumented

pytestmark = pytest.mark.slow  # the real daemon on loopback


def test_daemon_responder_serves_iperf3(tmp_path: Path) -> None:
    iperf3 = shutil.which("iperf3")
    if iperf3 is None:
        pytest.fail("iperf3 missing: `make test-deps` installs it")
    mport, rport = free_port(), free_port()
    cfg = daemon_config(tmp_path, metrics={"listen": f"127.0.0.1:{mport}"},
                        responder={"listen": f"127.0.0.1:{rport}", "allow": ["127.0.0.0/8"]})
    proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port("127.0.0.1", mport)
        wait_port("127.0.0.1", rport)
        out = subprocess.run([iperf3, "-c", "127.0.0.1", "-p", str(rport), "-t", "1", "-P", "2", "-R", "--json"],
                             capture_output=True, text=True, timeout=30)
        doc = json.loads(out.stdout)
        assert "error" not in doc, doc.get("error")
        assert doc["end"]["sum_received"]["bytes"] > 0
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        assert 'burstwatch_responder_tests_total{result="completed"} 1.0' in text
        assert not undocumented(text), undocumented(text)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
