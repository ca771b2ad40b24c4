"""/metrics under load and abuse (issue 13, row 3), with the server in a child process so that its memory
is measured alone: 200 concurrent scrapes; 300 and 1100 slowloris connections (partial headers, held)."""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

from tests.conftest import ROOT
from tests.support.http_abuse import Slowloris, concurrent_scrapes, scrape

HEADER_TIMEOUT = 3.0

# A server as the daemon runs it: ~400 series, a new snapshot twice a second, default limits but a
# lab-small header timeout. It prints its port and runs until its stdin closes.
CHILD = """
import resource, sys, threading, time
# systemd's default soft limit for a service, as the daemon has it (or a smaller one)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from agent.config import MetricsConfig
from agent.exporters.prometheus import BuildInfoView, MetricsServer, build_registry

class Snap:
    def __init__(self, n): self.n = n

latest = Snap(0)

class View:
    def collect(self):
        for name in ("bytes", "packets", "errors", "drops"):
            c = CounterMetricFamily("burstwatch_interface_" + name, "x", labels=["interface", "direction"])
            for i in range(48):
                for d in ("in", "out"):
                    c.add_metric(["eth%d" % i, d], latest.n * 1000 + i)
            yield c
        yield GaugeMetricFamily("burstwatch_samples", "x", value=latest.n)

def sampler():
    global latest
    while True:
        time.sleep(0.5)
        latest = Snap(latest.n + 1)

threading.Thread(target=sampler, daemon=True).start()
cfg = MetricsConfig(header_timeout=float(sys.argv[1]), **eval(sys.argv[2]))
server = MetricsServer("127.0.0.1", 0, build_registry([BuildInfoView(), View()]), config=cfg,
                       generation=lambda: latest)
server.start()
print(server.port, flush=True)
sys.stdin.read()
server.stop()
"""


@dataclass
class Child:
    proc: subprocess.Popen
    port: int

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def fds(self) -> int:
        return self.ps.num_fds()


def start_child(nofile: int = 1024, **cfg: object) -> Child:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(HEADER_TIMEOUT), repr(cfg), str(nofile)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return Child(proc, int(proc.stdout.readline()))


@pytest.fixture
def child() -> Iterator[Child]:
    c = start_child()
    try:
        yield c
    finally:
        stop_child(c)


def stop_child(c: Child) -> None:
    assert c.proc.stdin is not None
    c.proc.stdin.close()
    try:
        c.proc.wait(10)
    except subprocess.TimeoutExpired:
        c.proc.kill()
        c.proc.wait(5)


def warm(c: Child) -> int:
    """RSS once the server has answered a few scrapes (its idle level)."""
    for _ in range(5):
        scrape(c.port)
        time.sleep(0.1)
    time.sleep(0.5)
    return c.rss()


def test_200_concurrent_scrapes_are_all_answered_within_5s(child: Child) -> None:
    idle = warm(child)
    results = concurrent_scrapes(child.port, 200)
    assert len(results) == 200 and all(status == 200 for status, _ in results)
    slowest = max(t for _, t in results)
    print(f"\n200 concurrent scrapes: 200 answered, median {statistics.median(t for _, t in results):.3f} s, "
          f"slowest {slowest:.3f} s; RSS {idle / 2**20:.1f} -> {child.rss() / 2**20:.1f} MiB")
    assert slowest < 5.0


@pytest.mark.parametrize("n", [300, 1100])
def test_slowloris_is_closed_within_the_header_timeout_while_scrapes_go_through(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 200), hard))
    c = start_child()
    loris = None
    try:
        idle, idle_fds = warm(c), c.fds()
        loris = Slowloris(c.port, n)
        loris.watch(HEADER_TIMEOUT + 10)
        held = c.fds()
        during = [scrape(c.port)[1] for _ in range(3)]
        closed = loris.closed()
        time.sleep(1.0)
        after = c.rss()
        for _ in range(3):
            assert scrape(c.port)[0] == 200
        print(f"\n{n} slowloris: scrapes meanwhile {max(during):.3f} s at most; server fds {idle_fds} -> {held} "
              f"(cap 256); all {len(closed)} closed, each within {max(closed):.2f} s; RSS {idle / 2**20:.1f} -> "
              f"{after / 2**20:.1f} MiB")
        assert max(during) < 2.0
        assert len(closed) == n, f"{n - len(closed)} connections still open after {HEADER_TIMEOUT + 10} s"
        assert max(closed) < HEADER_TIMEOUT + 2.0
        assert held <= idle_fds + 256 + 1  # + the one being accepted while the oldest is closed
        assert after < 1.5 * idle
    finally:
        if loris is not None:
            loris.close()
        stop_child(c)


def test_fd_exhaustion_backs_off_instead_of_spinning() -> None:
    """With descriptors run out (a tiny limit here), accept fails with EMFILE: the loop frees the oldest
    waiting connection and pauses instead of spinning, and scrapes still get through."""
    c = start_child(nofile=64, max_connections=4096)
    loris = None
    try:
        cpu0 = sum(c.ps.cpu_times()[:2])
        loris = Slowloris(c.port, 120)   # more than the child can hold: the rest wait in the backlog
        t0 = time.monotonic()
        time.sleep(2.0)
        cpu = sum(c.ps.cpu_times()[:2]) - cpu0
        assert c.fds() <= 64
        assert scrape(c.port)[0] == 200
        print(f"\nEMFILE: {cpu:.2f} CPU-s over {time.monotonic() - t0:.1f} s with 120 connections against 64 fds")
        assert cpu < 1.0, "the accept loop spins on EMFILE"
    finally:
        if loris is not None:
            loris.close()
        stop_child(c)

