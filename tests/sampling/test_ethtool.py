"""The ethtool collector: what it keeps, reset-safe totals, failures as statuses, and the sampler hook."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.models.ena import ena_features
from agent.models.shaping import ethtool_shaping
from agent.readers.ethtool import FixtureEthtoolReader, IoctlEthtoolReader, parse_ethtool_S
from agent.sampling import NotSupported, StepStatus, run_step
from agent.sampling.ethtool import (
    DEFAULT_STATS,
    EthtoolStep,
)
from agent.sampling.netdev import NetdevStep
from agent.sampling.pipeline import Sampler
from tests.conftest import require_root_tools
from tests.support.lab import Lab, run_in_ns

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ethtool"
CURRENT = FIXTURES / "ena-2.12.3g-m6i.xlarge"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _copy(tmp_path: Path, name: str = "ena-2.12.3g-m6i.xlarge") -> Path:
    d = tmp_path / name
    shutil.copytree(FIXTURES / name, d)
    return d


def _set_stat(d: Path, stat: str, value: int) -> None:
    lines = (d / "S.txt").read_text().splitlines()
    out = [f"     {stat}: {value}" if ln.strip().startswith(stat + ":") else ln for ln in lines]
    (d / "S.txt").write_text("\n".join(out) + "\n")


@pytest.mark.parametrize("name, expected", [
    ("ena-2.12.3g-m6i.xlarge", {"in": 3241329, "out": 530}),    # the real 2025 sample
    ("ena-intree-6.1-m5.large", {"in": 0, "out": 0}),
    ("ena-1.5.0g-r4.large", {}),                                 # no allowance counters before 2.2.10
    ("vif-xen-m4.large", {}),
])
def test_shaping_counters(name: str, expected: dict[str, int]) -> None:
    stats = parse_ethtool_S((FIXTURES / name / "S.txt").read_text())
    assert ethtool_shaping(stats) == expected


def test_features_from_names() -> None:
    f = ena_features(parse_ethtool_S((FIXTURES / "ena-2.12.3g-c6in.32xlarge-express" / "S.txt").read_text()))
    assert f.all_allowance and f.conntrack_available and f.ena_express_stats and f.ena_express_enabled
    old = ena_features(parse_ethtool_S((FIXTURES / "ena-1.5.0g-r4.large" / "S.txt").read_text()))
    assert old.allowance == () and not old.ena_express_stats and not old.ena_express_enabled


def test_keeps_only_ena_stats_and_the_include_list(tmp_path: Path) -> None:
    c = EthtoolStep(lambda: ["eth0"], FixtureEthtoolReader({"eth0": CURRENT}))
    r = c.run()["eth0"]
    assert set(r.raw) == DEFAULT_STATS                      # 16 of 172: no per-queue series by default
    assert r.totals["bw_in_allowance_exceeded"] == 3241329  # first sight: the driver's own cumulative value
    assert "conntrack_allowance_available" not in r.totals  # a gauge, never accumulated
    assert r.driver is not None and r.driver.version == "2.12.3g"
    c2 = EthtoolStep(lambda: ["eth0"], FixtureEthtoolReader({"eth0": CURRENT}),
                          include=["queue_0_tx_queue_stop", "no_such_stat"])
    raw = c2.run()["eth0"].raw
    assert "queue_0_tx_queue_stop" in raw and "no_such_stat" not in raw and "queue_1_tx_queue_stop" not in raw


def test_counters_survive_a_driver_reset(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    clock = Clock()
    c = EthtoolStep(lambda: ["eth0"], FixtureEthtoolReader({"eth0": d}), clock=clock)
    assert c.run()["eth0"].totals["bw_out_allowance_exceeded"] == 530
    clock.t += 1
    _set_stat(d, "bw_out_allowance_exceeded", 800)
    assert c.run()["eth0"].totals["bw_out_allowance_exceeded"] == 800
    clock.t += 1
    _set_stat(d, "bw_out_allowance_exceeded", 40)          # driver reset: restarted from zero
    r = c.run()["eth0"]
    assert r.totals["bw_out_allowance_exceeded"] == 840 and r.resets == 1
    assert r.raw["bw_out_allowance_exceeded"] == 40
    clock.t += 1
    _set_stat(d, "bw_out_allowance_exceeded", 50)
    assert c.run()["eth0"].totals["bw_out_allowance_exceeded"] == 850


def test_unsupported_gone_and_broken_interfaces(tmp_path: Path) -> None:
    status: dict[str, StepStatus] = {}
    nostats = tmp_path / "nostats"
    nostats.mkdir()
    (nostats / "i.txt").write_text((CURRENT / "i.txt").read_text())
    c = EthtoolStep(lambda: ["lo"], FixtureEthtoolReader({"lo": nostats}))
    with pytest.raises(NotSupported):
        c.run()
    assert run_step(c, status) is None and status["ethtool"].supported is False
    # a monitored interface that is gone is left out; the others are still read
    c = EthtoolStep(lambda: ["eth0", "eth9"], FixtureEthtoolReader({"eth0": CURRENT}))
    assert set(c.run()) == {"eth0"}
    # an unexpected reader error is a collector failure (success 0), never a crash
    broken = tmp_path / "broken"
    (broken / "S.txt").mkdir(parents=True)                 # reading it raises IsADirectoryError
    c = EthtoolStep(lambda: ["eth0"], FixtureEthtoolReader({"eth0": broken}))
    assert run_step(c, status) is None
    assert status["ethtool"].success is False and status["ethtool"].supported is True


def test_sampler_runs_the_ethtool_step(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parent.parent / "fixtures" / "proc_net_dev.txt", proc / "net" / "dev")
    c = EthtoolStep(lambda: ["eth0"], FixtureEthtoolReader({"eth0": CURRENT}))
    sampler = Sampler(NetdevStep(lambda: ["eth0"], str(proc), str(tmp_path)), 1.0, ethtool=c)
    snap = sampler.sample()
    assert snap.ethtool is not None and snap.ethtool["eth0"].raw["pps_allowance_exceeded"] == 784
    assert snap.steps["ethtool"].success is True


@pytest.mark.netns
def test_step_over_the_real_ioctl_reader() -> None:
    require_root_tools("ip", "ping")
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        ia, _ = lab.link(a, b, "10.97.0.1/24", "10.97.0.2/24")
        reader = run_in_ns(a, IoctlEthtoolReader)
        c = EthtoolStep(lambda: [ia, "lo", "gone0"], reader, include=["peer_ifindex", "rx_queue_0_drops"])
        out = run_in_ns(a, c.run)
        assert set(out) == {ia}                              # lo has no statistics, gone0 does not exist
        assert set(out[ia].raw) == {"peer_ifindex", "rx_queue_0_drops"}
        assert out[ia].driver is not None and out[ia].driver.driver == "veth"
        reader.close()
