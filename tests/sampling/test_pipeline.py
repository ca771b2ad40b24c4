"""The sampling pipeline: steps run in one explicit order and later steps read this sample's earlier readings."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from agent.models.counters import CounterTracker, InterfaceDelta
from agent.models.credit_model import CreditReading
from agent.models.shaping import ShapingReading
from agent.readers.errors import NotSupported
from agent.sampling.ethtool import EthtoolStep
from agent.sampling.netdev import NetdevStep
from agent.sampling.pipeline import Sampler
from agent.sampling.shaping import ShapingStep

HEADER = ("Inter-|   Receive                                                |  Transmit\n"
          " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo "
          "colls carrier compressed\n")


class Proc:
    """A /proc/net/dev the test rewrites between samples."""

    def __init__(self, root: Path) -> None:
        (root / "net").mkdir(parents=True)
        self.path = root / "net" / "dev"
        self.rx: dict[str, int] = {}

    def write(self) -> None:
        lines = [f"{n:>6}: {rx} 1 0 0 0 0 0 0 {rx} 1 0 0 0 0 0 0" for n, rx in self.rx.items()]
        self.path.write_text(HEADER + "\n".join(lines) + "\n")


class Stats:
    """An ethtool reader whose counters the test sets."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, int]] = {}

    def stats(self, ifname: str) -> dict[str, int]:
        if ifname not in self.values:
            raise NotSupported(f"interface={ifname}: no statistics")
        return dict(self.values[ifname])

    def driver(self, _ifname: str) -> None:
        return None


class RecordingCredits:
    name = "credits"

    def __init__(self) -> None:
        self.seen: list[Optional[ShapingReading]] = []
        self.fail = False

    def run(self, now: float, deltas: dict[str, InterfaceDelta], tracker: CounterTracker,
            shaping: Optional[ShapingReading]) -> Optional[dict[str, CreditReading]]:
        self.seen.append(shaping)
        if self.fail:
            raise RuntimeError("the model tripped")
        return None


def _sampler(tmp_path: Path, ifs: list[str]) -> tuple[Sampler, Proc, Stats, RecordingCredits]:
    proc, stats, credits = Proc(tmp_path / "proc"), Stats(), RecordingCredits()
    clock = iter(float(i) for i in range(1000))
    sampler = Sampler(NetdevStep(lambda: ifs, str(tmp_path / "proc"), str(tmp_path)), 1.0,
                      ethtool=EthtoolStep(lambda: ifs, stats, clock=lambda: 0.0),  # type: ignore[arg-type]
                      shaping=ShapingStep("auto", lambda: ifs), credits=credits,  # type: ignore[arg-type]
                      clock=lambda: next(clock))
    return sampler, proc, stats, credits


def _set(stats: Stats, ifname: str, bw_in: int, bw_out: int) -> None:
    stats.values[ifname] = {"bw_in_allowance_exceeded": bw_in, "bw_out_allowance_exceeded": bw_out}


def test_shaping_increase_is_computed_once_and_read_by_credits(tmp_path: Path) -> None:
    ifs = ["eth0"]
    sampler, proc, stats, credits = _sampler(tmp_path, ifs)
    proc.rx = {"eth0": 1000}
    proc.write()
    _set(stats, "eth0", 500, 70)
    first = sampler.sample()
    assert first.shaping is not None and first.shaping.increase == {}          # the first reading is a baseline
    assert first.shaping.total == {"in": 0, "out": 0}
    _set(stats, "eth0", 530, 70)
    second = sampler.sample()
    assert second.shaping is not None and second.shaping.increase == {"in": 30, "out": 0}
    assert second.shaping.total == {"in": 30, "out": 0}
    assert credits.seen[-1] is second.shaping                                  # the same object, not a re-derivation
    assert second.ethtool is not None and second.ethtool["eth0"].increase["bw_in_allowance_exceeded"] == 30


def test_an_interface_that_joins_or_leaves_adds_no_spike(tmp_path: Path) -> None:
    ifs = ["eth0"]
    sampler, proc, stats, _ = _sampler(tmp_path, ifs)
    proc.rx = {"eth0": 1000, "eth1": 5}
    proc.write()
    _set(stats, "eth0", 100, 0)
    sampler.sample()
    sampler.sample()
    # eth1 is attached with a large lifetime count: it only sets its baseline.
    ifs.append("eth1")
    _set(stats, "eth1", 9_000_000, 9_000_000)
    snap = sampler.sample()
    assert snap.shaping is not None and snap.shaping.increase == {"in": 0, "out": 0}
    _set(stats, "eth1", 9_000_010, 9_000_000)
    snap = sampler.sample()
    assert snap.shaping is not None and snap.shaping.increase == {"in": 10, "out": 0}
    # eth1 is detached: its counters leave the sum without a negative or reset-sized increase.
    ifs.remove("eth1")
    del stats.values["eth1"]
    snap = sampler.sample()
    assert snap.shaping is not None and snap.shaping.increase == {"in": 0, "out": 0}
    assert snap.shaping.total == {"in": 10, "out": 0}


def test_a_driver_reset_is_not_an_increase_of_its_whole_value(tmp_path: Path) -> None:
    ifs = ["eth0"]
    sampler, proc, stats, _ = _sampler(tmp_path, ifs)
    proc.rx = {"eth0": 1000}
    proc.write()
    _set(stats, "eth0", 4_000_000_000_000, 0)
    sampler.sample()
    sampler.sample()
    _set(stats, "eth0", 3, 0)                      # the ENA device reset: counters restart from zero
    snap = sampler.sample()
    assert snap.shaping is not None and snap.shaping.increase["in"] == 3
    assert snap.ethtool is not None and snap.ethtool["eth0"].resets == 1


def test_a_failed_shaping_read_keeps_the_total_and_rebaselines(tmp_path: Path) -> None:
    ifs = ["eth0"]
    sampler, proc, stats, credits = _sampler(tmp_path, ifs)
    proc.rx = {"eth0": 1000}
    proc.write()
    _set(stats, "eth0", 10, 0)
    sampler.sample()
    _set(stats, "eth0", 15, 0)
    sampler.sample()
    stats.values["eth0"] = {}                      # the allowance counters vanish (driver swapped)
    snap = sampler.sample()
    assert snap.steps["shaping"].success is False
    assert snap.shaping is not None and snap.shaping.total == {"in": 5, "out": 0} and snap.shaping.increase == {}
    _set(stats, "eth0", 20, 0)
    snap = sampler.sample()
    assert snap.shaping is not None and snap.shaping.increase == {}            # a new baseline, not +20


def test_the_credits_step_reports_its_collector_success_and_never_fails_the_sample(tmp_path: Path) -> None:
    """Credits runs under run_step as every step does: burstwatch_collector_success{collector="credits"}."""
    sampler, proc, _stats, credits = _sampler(tmp_path, ["eth0"])
    proc.rx["eth0"] = 100
    proc.write()
    snap = sampler.sample()
    assert snap.steps["credits"].success and snap.steps["credits"].supported
    credits.fail = True
    snap = sampler.sample()
    assert not snap.steps["credits"].success and snap.credits is None
    assert snap.steps["netdev"].success                    # the sample itself went on
