"""The ENA view: metric names, types, labels and values from fixture readings, linted by promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.exporters.ena import EnaView, in_tree_label
from agent.readers.ethtool import FixtureEthtoolReader
from agent.sampling.ethtool import EthtoolStep

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ethtool"


def _registry(dirs: dict[str, str], include: tuple[str, ...] = ()) -> CollectorRegistry:
    c = EthtoolStep(lambda: list(dirs), FixtureEthtoolReader({k: FIXTURES / v for k, v in dirs.items()}),
                         include=include)
    reading = c.run()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(EnaView(lambda: reading))
    return reg


def test_allowance_counters_conntrack_and_driver_info() -> None:
    reg = _registry({"eth0": "ena-2.12.3g-m6i.xlarge", "eth1": "ena-intree-6.1-m5.large",
                     "eth2": "ena-1.5.0g-r4.large"})
    get = reg.get_sample_value
    for kind, value in (("bw_in", 3241329), ("bw_out", 530), ("pps", 784), ("conntrack", 0), ("linklocal", 0)):
        assert get("burstwatch_ena_allowance_exceeded_total", {"interface": "eth0", "allowance": kind}) == value
    assert get("burstwatch_ena_allowance_exceeded_total", {"interface": "eth1", "allowance": "linklocal"}) == 12
    # the old driver has no allowance counters: no series rather than a misleading 0
    assert get("burstwatch_ena_allowance_exceeded_total", {"interface": "eth2", "allowance": "bw_in"}) is None
    assert get("burstwatch_ena_conntrack_allowance_available", {"interface": "eth0"}) == 615471
    assert get("burstwatch_ena_conntrack_allowance_available", {"interface": "eth1"}) is None
    assert get("burstwatch_driver_info", {"interface": "eth0", "driver": "ena", "version": "2.12.3g",
                                          "in_tree": "false"}) == 1
    assert get("burstwatch_driver_info", {"interface": "eth1", "driver": "ena", "version": "6.1.0-18-cloud-amd64",
                                          "in_tree": "true"}) == 1
    assert get("burstwatch_ena_srd_enabled", {"interface": "eth0"}) == 0
    text = generate_latest(reg).decode()
    assert "burstwatch_ethtool_stat{" not in text          # no extra stats unless included
    assert "queue_0" not in text


def test_ena_express_and_included_stats() -> None:
    reg = _registry({"eth0": "ena-2.12.3g-c6in.32xlarge-express"}, include=("queue_0_tx_queue_stop",))
    get = reg.get_sample_value
    assert get("burstwatch_ena_srd_mode", {"interface": "eth0"}) == 3
    assert get("burstwatch_ena_srd_enabled", {"interface": "eth0"}) == 1
    assert get("burstwatch_ena_srd_resource_utilization_ratio", {"interface": "eth0"}) == pytest.approx(0.07)
    assert get("burstwatch_ena_srd_tx_packets_total", {"interface": "eth0"}) == 812354441
    assert get("burstwatch_ena_srd_eligible_tx_packets_total", {"interface": "eth0"}) == 845120077
    assert get("burstwatch_ena_srd_rx_packets_total", {"interface": "eth0"}) == 799123302
    assert get("burstwatch_ethtool_stat", {"interface": "eth0", "stat": "queue_0_tx_queue_stop"}) is not None


@pytest.mark.parametrize("driver, version, label", [
    ("ena", "2.12.3g", "false"), ("ena", "6.1.0-18-cloud-amd64", "true"), ("ena", "2.1.0K", "true"),
    ("ena", "weird", "unknown"), ("veth", "1.0", "unknown"),
])
def test_in_tree_label(driver: str, version: str, label: str) -> None:
    assert in_tree_label(driver, version) == label


def test_promtool_accepts_the_exposition() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: `make test-deps` installs Debian's prometheus package")
    reg = _registry({"eth0": "ena-2.12.3g-c6in.32xlarge-express", "eth1": "ena-intree-6.1-m5.large"},
                    include=("queue_0_tx_queue_stop",))
    res = subprocess.run([promtool, "check", "metrics"], input=generate_latest(reg), capture_output=True,
                         timeout=30)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()


def test_nothing_before_the_first_reading() -> None:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(EnaView(lambda: None))
    assert generate_latest(reg) == b""
