"""The real `burstwatch run` in a network namespace: rates against known traffic, SIGHUP, SIGTERM, sd_notify."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import ROOT, require_root_tools
from tests.support.credit_lab import parse_metrics
from tests.support.daemon_config import daemon_config
from tests.support.lab import Lab, run_in_ns

pytestmark = pytest.mark.netns

PAYLOAD = 1400
L2_OVERHEAD = 8 + 20 + 14  # UDP + IPv4 + Ethernet headers: what the interface counts beyond the payload


class Notifications:
    """A real NOTIFY_SOCKET: a datagram socket the test binds, as systemd does."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []

    def drain(self) -> list[str]:
        while True:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                break
            self.messages.append((time.monotonic(), data.decode()))
        return [m for _, m in self.messages]

    def wait_for(self, state: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(state in m for m in self.drain()):
                return
        raise TimeoutError(f"no {state} on NOTIFY_SOCKET within {timeout}s; got {self.drain()}")


@pytest.fixture()
def agent_lab(tmp_path: Path) -> Iterator[tuple[Lab, str, str, Path, Notifications, subprocess.Popen]]:
    require_root_tools("ip")
    lab = Lab()
    notify_path = tempfile.mktemp(prefix="bw-notify-", dir="/tmp")
    notes = Notifications(notify_path)
    try:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, "10.78.0.1/24", "10.78.0.2/24", names=("eth0", "eth0"))
        cfg = daemon_config(tmp_path, sample_interval=0.5, rate_window=1.0, interfaces=["eth0"],
                            metrics={"listen": "127.0.0.1:9786"})
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="1500000", PYTHONPATH=str(ROOT))
        proc = lab.popen(a, sys.executable, "-m", "agent", "run", "--config", str(cfg), env=env,
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb"))
        yield lab, a, b, cfg, notes, proc
    finally:
        lab.close()
        notes.sock.close()
        os.unlink(notify_path)


def metrics(lab: Lab, ns: str) -> dict[str, float]:
    return parse_metrics(lab.http_get(ns, "http://127.0.0.1:9786/metrics"))


def test_rates_reload_notify_and_stop(agent_lab: tuple) -> None:
    lab, a, b, cfg, notes, proc = agent_lab
    notes.wait_for("READY=1")
    lab.wait_http(a, "http://127.0.0.1:9786/metrics")

    # Known traffic: UDP datagrams from b to a listener in a, paced at 10 MB/s of payload for 3 s.
    sink = run_in_ns(a, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sink.bind(("10.78.0.1", 9999))
    sender = run_in_ns(b, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    payload = b"x" * PAYLOAD
    per_tick, tick = 70, 0.01               # 70 datagrams per 10 ms = 7000/s = 9.8 MB/s of payload
    before = metrics(lab, a)
    sent, mid = 0, None
    start = time.monotonic()
    while (now := time.monotonic()) < start + 3.0:
        for _ in range(per_tick):
            sender.sendto(payload, ("10.78.0.1", 9999))
        sent += per_tick
        if mid is None and now > start + 2.2:
            mid = metrics(lab, a)             # one rate window fully inside the paced period
        time.sleep(max(0.0, start + (sent // per_tick) * tick - time.monotonic()))
    elapsed = time.monotonic() - start
    time.sleep(1.2)                           # one more sample after the last datagram
    after = metrics(lab, a)
    sender.close()
    sink.close()

    key_in = 'burstwatch_interface_bytes_total{direction="in",interface="eth0"}'
    wire_bytes = sent * (PAYLOAD + L2_OVERHEAD)
    counted = after[key_in] - before[key_in]
    assert counted == pytest.approx(wire_bytes, rel=0.01)
    expected_rate = wire_bytes / elapsed
    assert mid is not None
    assert mid['burstwatch_throughput_bytes_per_second{direction="in"}'] == pytest.approx(expected_rate, rel=0.05)
    assert mid['burstwatch_interface_throughput_bytes_per_second{direction="in",interface="eth0"}'] == \
        pytest.approx(expected_rate, rel=0.05)
    assert after['burstwatch_collector_success{collector="netdev"}'] == 1.0

    # The watchdog is fed from the sampling loop (WatchdogSec/3 = 0.5 s here).
    notes.drain()
    assert sum("WATCHDOG=1" in m for _, m in notes.messages) >= 3

    # SIGHUP with a valid change, then with an invalid file: the old config keeps running.
    assert "sample_interval = 0.5" in cfg.read_text()
    cfg.write_text(cfg.read_text().replace("sample_interval = 0.5", "sample_interval = 0.25"))
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5.0
    while (m := metrics(lab, a)).get('burstwatch_config_reloads_total{result="success"}') != 1.0:
        assert time.monotonic() < deadline, "the reload was not counted within 5 s"
        time.sleep(0.1)
    assert m["burstwatch_config_last_reload_successful"] == 1.0
    assert m["burstwatch_config_restart_pending"] == 0.0
    # The new interval really runs: 4 samples a second instead of 2, measured over 2 s of samples (the
    # sample timestamps' own clock), with a bound between the two rates.
    time.sleep(2.0)
    m_after = metrics(lab, a)
    rate = (m_after["burstwatch_samples_total"] - m["burstwatch_samples_total"]) / \
        (m_after["burstwatch_last_sample_timestamp_seconds"] - m["burstwatch_last_sample_timestamp_seconds"])
    assert 3.0 < rate < 4.5, f"{rate:.2f} samples/s after sample_interval = 0.25 (0.5 before: 2/s)"
    m = m_after
    cfg.write_text("sample_interval = 'fast'\n")
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5.0
    while (m2 := metrics(lab, a)).get('burstwatch_config_reloads_total{result="failure"}') != 1.0:
        assert time.monotonic() < deadline, "the failed reload was not counted within 5 s"
        time.sleep(0.1)
    assert m2["burstwatch_config_last_reload_successful"] == 0.0
    assert m2['burstwatch_config_reloads_total{result="failure"}'] == 1.0
    deadline = time.monotonic() + 5.0
    while metrics(lab, a)["burstwatch_samples_total"] <= m["burstwatch_samples_total"]:   # still sampling
        assert time.monotonic() < deadline, "sampling stopped after a failed reload"
        time.sleep(0.1)

    # SIGTERM: STOPPING=1 and a clean exit well within 2 s.
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(5) == 0
    assert time.monotonic() - t0 < 2.0
    notes.wait_for("STOPPING=1", timeout=2)
    assert any(m.startswith("STATUS=sampling eth0") for _, m in notes.messages)


def test_every_exposed_metric_is_documented_and_promtool_lints_the_exposition(agent_lab: tuple) -> None:
    import shutil

    from tests.support.metrics_doc import undocumented

    lab, a, _b, _cfg, notes, _proc = agent_lab
    notes.wait_for("READY=1")
    text = lab.wait_http(a, "http://127.0.0.1:9786/metrics")
    missing = undocumented(text)
    assert not missing, f"docs/metrics.md does not describe: {missing}"
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make test-deps` installs it"
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_daemon_runs_the_checks_in_a_child_and_exports_verdicts(agent_lab: tuple) -> None:
    lab, a, _b, _cfg, notes, proc = agent_lab
    notes.wait_for("READY=1")
    deadline = time.monotonic() + 60
    m: dict[str, float] = {}
    while time.monotonic() < deadline:
        m = metrics(lab, a)
        if m.get("burstwatch_check_runs_total", 0) >= 1:
            break
        time.sleep(0.5)
    assert m.get("burstwatch_check_runs_total", 0) >= 1, "no check round finished within 60 s"
    # veth is not ENA: the driver check fails and says so, as it would for a non-ENA instance
    assert m['burstwatch_check_status{check="driver",interface="eth0",status="fail"}'] == 1.0
    assert m['burstwatch_check_status{check="imds",interface="",status="skip"}'] == 1.0   # imds.enabled = false
    assert m['burstwatch_driver_info{driver="veth",in_tree="unknown",interface="eth0",version="1.0"}'] == 1.0
