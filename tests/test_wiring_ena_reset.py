"""An ENA driver reset that zeroes the counters, through the daemon's exposition: the pipeline the daemon
builds (wiring.build) samples a /proc/net/dev and an `ethtool -S` it reads from fixture files, the reset
drops every counter to near zero on the same interface (same ifindex), and no exported counter goes down,
no rate spikes, and the credit estimate does not move. ("The counters are cumulative since the last driver
reset", docs/ec2-network-facts.md, "ENA allowance counters".)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from agent import config
from agent.exporters.prometheus import build_registry
from agent.readers.ethtool import FixtureEthtoolReader
from agent.wiring import Agent, Paths, build
from tests.support.credit_lab import parse_metrics
from tests.support.daemon_config import lab_config, toml_text

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ethtool" / "ena-2.12.3g-m6i.xlarge"
HEADER = ("Inter-|   Receive                                                |  Transmit\n"
          " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
          "carrier compressed\n")
# Lab timing: samples 0.1 s apart (EC2 default sample_interval 1 s), on the test's clock.
STEP = 0.1


class Host:
    """A /proc and /sys (eth0 only) and eth0's `ethtool -S`, all files the test rewrites between samples."""

    def __init__(self, root: Path) -> None:
        self.proc, self.sys, self.ethtool = root / "proc", root / "sys", root / "ethtool" / "eth0"
        (self.proc / "net").mkdir(parents=True)
        eth0 = self.sys / "class" / "net" / "eth0"
        eth0.mkdir(parents=True)
        (eth0 / "ifindex").write_text("2\n")               # a driver reset keeps the interface and its index
        (eth0 / "address").write_text("0a:1b:2c:3d:4e:01\n")
        shutil.copytree(FIXTURE, self.ethtool)
        self.stats = (self.ethtool / "S.txt").read_text()

    def set(self, rx: int, tx: int, bw_in: int, bw_out: int) -> None:
        (self.proc / "net" / "dev").write_text(
            HEADER + f"  eth0: {rx} {rx // 1000} 0 0 0 0 0 0 {tx} {tx // 1000} 0 0 0 0 0 0\n")
        text = self.stats.replace("bw_in_allowance_exceeded: 3241329", f"bw_in_allowance_exceeded: {bw_in}")
        text = text.replace("bw_out_allowance_exceeded: 530", f"bw_out_allowance_exceeded: {bw_out}")
        (self.ethtool / "S.txt").write_text(text)


class Clock:
    """The sampler's monotonic clock: each sample exactly STEP after the last, however slow the machine."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def sample(a: Agent, clock: Clock) -> dict[str, float]:
    assert a.sampler is not None
    clock.t += STEP
    a.sampler.sample()
    return parse_metrics(generate_latest(build_registry(a.views)).decode())


def test_driver_reset_zeroing_every_counter_adds_no_spike_and_no_decrease(tmp_path: Path) -> None:
    host = Host(tmp_path)
    cfg = config.parse(toml_text(lab_config(tmp_path, interfaces=["eth0"], metrics=None,
                                            instance={"type": "m5.large"})))
    a = build(cfg, None, Paths(procfs=str(host.proc), sysfs=str(host.sys)))
    assert a.ethtool is not None
    a.ethtool.reader = FixtureEthtoolReader({"eth0": host.ethtool})
    assert a.sampler is not None
    clock = Clock()
    a.sampler.clock = clock

    rx, tx = 10**12, 5 * 10**11                              # weeks of traffic before the reset
    seen = []
    for rx_i, tx_i, bw_in, bw_out in [
            (rx, tx, 3241329, 530),                          # baseline
            (rx + 10**6, tx + 10**5, 3241339, 530),          # 10 MB/s in, 10 shaped packets
            (4000, 2000, 3, 0),                              # the reset: all from zero, and a little since
            (4000 + 10**6, 2000 + 10**5, 5, 0),              # traffic goes on
            (4000 + 2 * 10**6, 2000 + 2 * 10**5, 5, 0)]:
        host.set(rx_i, tx_i, bw_in, bw_out)
        seen.append(sample(a, clock))

    def series(name: str) -> list[float]:
        return [m[name] for m in seen]

    bytes_in = series('burstwatch_interface_bytes_total{direction="in",interface="eth0"}')
    assert bytes_in == [0.0, 10**6, 10**6 + 4000, 2 * 10**6 + 4000, 3 * 10**6 + 4000]
    assert series('burstwatch_interface_resets_total{interface="eth0"}') == [0, 0, 1, 1, 1]
    # ENA's own cumulative count, accounted across the reset: up by what happened, never back to 3.
    allowance = series('burstwatch_ena_allowance_exceeded_total{allowance="bw_in",interface="eth0"}')
    assert allowance == [3241329, 3241339, 3241342, 3241344, 3241344]
    assert series('burstwatch_ena_stat_resets_total{interface="eth0"}')[-1] >= 1
    shaped = series('burstwatch_shaping_packets_total{direction="in",source="ethtool"}')
    assert shaped == [0, 10, 13, 15, 15]
    assert series('burstwatch_shaping_packets_total{direction="out",source="ethtool"}') == [0, 0, 0, 0, 0]
    # Rates: ~10 MB/s in before and after, nothing near 10**12 bytes at the reset, nothing negative.
    rates = [m['burstwatch_throughput_bytes_per_second{direction="in"}'] for m in seen[1:]]
    # On the test's clock the rate is exact: the bytes since the first sample over the time since (the rate
    # window is longer than the run), the reset adding only the 4000 bytes it really saw.
    assert rates == pytest.approx([10**6 / STEP, (10**6 + 4000) / (2 * STEP), (2 * 10**6 + 4000) / (3 * STEP),
                                   (3 * 10**6 + 4000) / (4 * STEP)]), rates
    # The credit estimate sees ordinary traffic throughout: the bucket stays (nearly) full.
    ratio = series('burstwatch_credit_remaining_ratio{direction="in"}')
    assert min(ratio) > 0.99 and ratio[-1] >= ratio[2] - 1e-6, ratio
