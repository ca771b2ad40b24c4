"""The daemon's own responder answers a stock `iperf3 -c`, its metrics are all documented, and its hourly budget
follows the profile across a reload."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, refused, wait_port
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


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    lines = [ln.rpartition(" ") for ln in text.splitlines() if ln and not ln.startswith("#")]
    return {name: float(value) for name, _, value in lines}


def test_daemon_budget_follows_a_reloaded_profile(tmp_path: Path) -> None:
    """The daemon's responder sizes its budget to the profile of the moment: an m5.large's figures give 1 %
    of its refill (3.375 GB); reloaded as a size without a bucket, the budget becomes a fairness limit, 1 %
    of what its link moves in an hour (docs/probes.md, "Credit guard")."""
    import signal
    import time

    mport, rport = free_port(), free_port()
    responder = {"listen": f"127.0.0.1:{rport}", "allow": ["127.0.0.0/8"]}
    bursting = {"bandwidth": {"baseline_gbps": 0.75, "peak_gbps": 10.0}}
    cfg = daemon_config(tmp_path, metrics={"listen": f"127.0.0.1:{mport}"}, responder=responder,
                        instance=bursting)
    proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port("127.0.0.1", mport)
        m = _scrape(mport)
        assert m["burstwatch_responder_hourly_budget_bytes"] == 3.375e9
        assert m['burstwatch_responder_hourly_budget_info{basis="refill"}'] == 1
        daemon_config(tmp_path, metrics={"listen": f"127.0.0.1:{mport}"}, responder=responder,
                      instance={"bandwidth": {"baseline_gbps": 10.0, "peak_gbps": 10.0}})
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while 'burstwatch_responder_hourly_budget_info{basis="link"}' not in (m := _scrape(mport)):
            assert time.monotonic() < deadline, "the budget did not follow the reloaded profile"
            time.sleep(0.1)
        assert m["burstwatch_responder_hourly_budget_bytes"] == 45e9
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def _iperf3(iperf3: str, port: int) -> dict:
    """A stock client's test of 1 MB (so three of them stay far inside the responder's hourly budget)."""
    out = subprocess.run([iperf3, "-c", "127.0.0.1", "-p", str(port), "-n", "1M", "--json"],
                         capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)


def test_responder_enabled_applies_on_reload_both_ways(tmp_path: Path) -> None:
    """[responder] enabled = false by SIGHUP closes the listener within 5 s (stock iperf3 cannot connect), and
    true opens it again; a changed responder.listen waits for a restart and is reported so: named in the log,
    burstwatch_config_restart_pending 1, never a plain "config reloaded"."""
    import signal
    import time

    from tests.conftest import wait_until

    iperf3 = shutil.which("iperf3")
    if iperf3 is None:
        pytest.fail("iperf3 missing: `make test-deps` installs it")
    mport, rport = free_port(), free_port()
    metrics = {"listen": f"127.0.0.1:{mport}"}

    def write(**responder: object) -> None:
        daemon_config(tmp_path, metrics=metrics,
                      responder={"listen": f"127.0.0.1:{rport}", "allow": ["127.0.0.0/8"], **responder})

    write()
    log = tmp_path / "daemon.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(tmp_path / "burstwatch.toml")],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_port("127.0.0.1", mport)
        wait_port("127.0.0.1", rport)
        assert "error" not in _iperf3(iperf3, rport)

        write(enabled=False)
        proc.send_signal(signal.SIGHUP)
        t0 = time.monotonic()
        wait_until(lambda: refused(rport), 5.0, "the responder's listener closed after enabled = false")
        closed_after = time.monotonic() - t0
        doc = _iperf3(iperf3, rport)
        assert "unable to connect" in doc.get("error", ""), doc
        # /metrics is rendered once per sample (docs/architecture.md): the reload shows from the next one.
        wait_until(lambda: _scrape(mport)['burstwatch_config_reloads_total{result="success"}'] == 1, 5.0,
                   "the reload counted")
        m = _scrape(mport)
        assert m["burstwatch_responder_listening"] == 0 and m["burstwatch_config_restart_pending"] == 0
        print(f"listener closed {closed_after:.2f} s after SIGHUP")

        write(enabled=True)
        proc.send_signal(signal.SIGHUP)
        wait_port("127.0.0.1", rport, timeout=5.0)
        assert "error" not in _iperf3(iperf3, rport)
        wait_until(lambda: _scrape(mport)["burstwatch_responder_listening"] == 1, 5.0, "listening 1 again")

        other = free_port()
        daemon_config(tmp_path, metrics=metrics,
                      responder={"listen": f"127.0.0.1:{other}", "allow": ["127.0.0.0/8"]})
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: _scrape(mport)["burstwatch_config_restart_pending"] == 1, 5.0,
                   "burstwatch_config_restart_pending 1 after a changed responder.listen")
        assert not refused(rport) and refused(other)              # still on the running address
        wait_until(lambda: "wait for a restart: responder.listen" in log.read_text(), 5.0,
                   "the reload's log line naming responder.listen")
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
