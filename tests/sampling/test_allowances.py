"""The allowances step: the ENA (or nft lab) counters into the conntrack and PPS models, state kept per type."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import pytest

from agent.config import AllowancesConfig
from agent.models.counters import InterfaceDelta
from agent.models.shaping import ShapingReading
from agent.readers.errors import NotSupported
from agent.readers.flows import Flow
from agent.readers.netdev import NetDevCounters
from agent.readers.nft import NftCounters
from agent.sampling.allowances import AllowancesStep
from agent.sampling.ethtool import InterfaceEthtool

CFG = AllowancesConfig(window=3.0, horizon=4.0, flows_interval=0.5)


class Flows:
    """This host's flows: `n` established TCP flows to 10.0.0.2:443."""

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.reads = 0

    def flows(self) -> list[Flow]:
        self.reads += 1
        return [Flow("tcp", "10.0.0.1", 40000 + i, "10.0.0.2", 443, "ESTABLISHED") for i in range(self.n)]


def delta(packets: int, dt: float = 0.2) -> dict[str, InterfaceDelta]:
    return {"eth0": InterfaceDelta(NetDevCounters(packets * 100, packets, 0, 0, 0, 0, 0, 0), dt)}


def ena(available: Optional[int] = None, pps: int = 0, conntrack: int = 0) -> dict[str, InterfaceEthtool]:
    raw = {"pps_allowance_exceeded": 0, "conntrack_allowance_exceeded": 0, "linklocal_allowance_exceeded": 0}
    if available is not None:
        raw["conntrack_allowance_available"] = available
    return {"eth0": InterfaceEthtool(raw=raw, totals={}, driver=None,
                                     increase={"pps_allowance_exceeded": pps,
                                               "conntrack_allowance_exceeded": conntrack})}


def step(tmp: Path, flows: Optional[Flows] = None, cfg: AllowancesConfig = CFG, **kw: Any) -> AllowancesStep:
    return AllowancesStep(cfg, str(tmp), "m5.large", lambda: 1e6, flows=flows or Flows(), **kw)


def test_conntrack_size_forecast_and_owners_from_the_ena_counters(tmp_path: Path) -> None:
    flows = Flows(0)
    s = step(tmp_path, flows)
    t = 0.0
    # the table fills from 1000 available by 50 per sample
    for i in range(12):
        flows.n = 50 * i
        r = s.run(t, delta(10), {"in": 0.0, "out": 0.0}, ena(1000 - 50 * i), None)
        t += 0.2
    assert r.conntrack is not None and r.conntrack.size == 1000 and r.conntrack.size_method == "max_available"
    assert r.conntrack.in_use_ratio == pytest.approx(0.55)
    assert r.conntrack.full_seconds == pytest.approx(1.8, rel=0.2)     # 450 left at 250/s
    assert r.flow_count is not None and r.owners and r.owners[0].port == 443
    # full: the counter rises with 10 left, 1040 flows counted now -> the size is learned as 1050
    flows.n = 1040
    r = s.run(t + 1.0, delta(10), None, ena(10, conntrack=5), None)
    assert r.conntrack is not None and r.conntrack.size == 1050 and r.conntrack.size_method == "exceeded"
    assert r.conntrack.exceeded_total == 5 and r.conntrack.full_seconds == 0.0
    # learned: saved at once, keyed by the instance type
    doc = json.loads((tmp_path / "allowances.json").read_text())
    assert doc["types"]["m5.large"]["conntrack"]["learned"] == 1050


def test_state_restored_for_the_same_type_only(tmp_path: Path) -> None:
    s = step(tmp_path)
    s.conntrack.restore({"max_available": 500, "learned": 900.0, "learned_count": 2})
    s.pps.restore({"candidates": [2000.0], "learned_count": 1})
    s.save()
    again = step(tmp_path)
    assert again.conntrack.size == 900.0 and again.pps.ceiling == 2000.0 and again.pps.source == "restored"
    other = AllowancesStep(CFG, str(tmp_path), "m5.xlarge", lambda: None, flows=Flows())
    assert other.conntrack.size is None and other.pps.ceiling is None


def test_a_corrupt_state_file_is_set_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "allowances.json").write_text("{not json")
    s = step(tmp_path)
    assert s.conntrack.size is None
    assert list(tmp_path.glob("allowances.json.bad-*"))


def test_pps_ceiling_learned_unless_bandwidth_explains(tmp_path: Path) -> None:
    s = step(tmp_path)
    for i in range(5):
        r = s.run(i * 0.2, delta(400), {"in": 0.0, "out": 0.0}, ena(pps=300), None)
    assert r.pps is not None and r.pps.ceiling == pytest.approx(2000.0) and r.pps.source == "learned"
    assert r.near_ceiling
    shaped = step(tmp_path / "b")
    for i in range(5):
        r = shaped.run(i * 0.2, delta(400), None, ena(pps=300), ShapingReading("tc", {"out": 3}, {"out": 3}))
    assert r.pps is not None and r.pps.ceiling is None and r.pps.explained_by_bandwidth
    # the byte rate at the baseline explains it too
    near = step(tmp_path / "c")
    for i in range(5):
        r = near.run(i * 0.2, delta(400), {"in": 0.0, "out": 2e6}, ena(pps=300), None)
    assert r.pps is not None and r.pps.ceiling is None


def test_learn_false_keeps_counting_but_learns_nothing(tmp_path: Path) -> None:
    s = step(tmp_path, cfg=AllowancesConfig(learn=False))
    for i in range(5):
        r = s.run(i * 0.2, delta(400), None, ena(pps=300), None)
    assert r.pps is not None and r.pps.ceiling is None and r.pps.exceeded_total == 1500


def test_without_the_level_the_counter_is_kept_and_said_once(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    s = step(tmp_path)
    with caplog.at_level(logging.INFO, logger="agent.sampling.allowances"):
        for i in range(3):
            r = s.run(i * 0.2, delta(1), None, ena(conntrack=2), None)
    assert r.conntrack is not None and not r.conntrack.supported and r.conntrack.exceeded_total == 6
    assert len([m for m in caplog.messages if "conntrack_allowance_available not reported" in m]) == 1


def test_not_supported_without_any_allowance_statistics(tmp_path: Path) -> None:
    with pytest.raises(NotSupported):
        step(tmp_path).run(0.0, delta(1), None, {}, None)


def test_flows_are_read_every_interval_and_at_once_when_the_table_overflows(tmp_path: Path) -> None:
    flows = Flows(3)
    s = step(tmp_path, flows)
    for i in range(5):                        # 0.2-s samples, flows every 0.5 s
        s.run(i * 0.2, delta(1), None, ena(100), None)
    assert flows.reads == 2
    s.run(1.0, delta(1), None, ena(0, conntrack=1), None)   # overflow: read now
    assert flows.reads == 3


class Nft:
    def __init__(self) -> None:
        self.c = NftCounters(0, 0, 150)
        self.entries = 0

    def counters(self) -> NftCounters:
        return self.c

    def conntrack_entries(self) -> int:
        return self.entries


def test_nft_source_stands_in_for_the_ena_counters(tmp_path: Path) -> None:
    nft = Nft()
    s = step(tmp_path, cfg=AllowancesConfig(source="nft"), nft=nft)
    r = s.run(0.0, delta(1), None, None, None)                # the first reading sets the baseline
    assert r.conntrack is not None and r.conntrack.available == 150 and r.conntrack.exceeded_total == 0
    nft.c, nft.entries = NftCounters(40, 3, 150), 149
    r = s.run(0.2, delta(1), None, None, None)
    assert r.conntrack is not None and r.conntrack.available == 1 and r.conntrack.exceeded_total == 3
    assert r.pps is not None and r.pps.exceeded_total == 40
    nft.c = NftCounters(None, None, None)
    with pytest.raises(NotSupported):
        s.run(0.4, delta(1), None, None, None)


def test_fleet_figures_are_adopted_only_where_nothing_was_learned_and_never_republished(tmp_path: Path) -> None:
    s = step(tmp_path)
    s.adopt(90_000.0, 150_000.0)
    assert (s.conntrack.size, s.pps.ceiling, s.pps.source) == (90_000.0, 150_000.0, "fleet")
    assert s.learned() == {"pps_ceiling_packets_per_second": None, "conntrack_size_entries": None}
    published: list[int] = []
    s.on_learned = lambda: published.append(1)
    for i in range(5):                                  # its own episode: learned, and published once
        s.run(i * 0.2, delta(400), None, ena(pps=300), None)
    assert published == [1] and s.pps.source == "learned"
    # its own measurement replaces the fleet's figure, and only that is published
    assert s.latest is not None and s.latest.pps is not None and s.latest.pps.ceiling == pytest.approx(2000.0)
    assert s.learned()["pps_ceiling_packets_per_second"] == pytest.approx(2000.0)
    own = step(tmp_path / "own")
    own.conntrack.restore({"learned": 1000.0, "learned_count": 1})
    own.adopt(90_000.0, None)
    assert own.conntrack.size == 1000.0 and own.learned()["conntrack_size_entries"] == 1000.0


def test_a_restored_figure_wins_over_the_fleets_and_a_withdrawn_fleet_figure_stays(tmp_path: Path) -> None:
    """The fleet's figures are a prior for a new instance only (docs/fleet.md, "The consensus rule")."""
    s = step(tmp_path)
    for i in range(5):                                  # an episode: learned 2000 packets/s, saved
        s.run(i * 0.2, delta(400), None, ena(pps=300), None)
    s.save()
    restored = step(tmp_path)
    assert restored.pps.source == "restored"
    restored.adopt(90_000.0, 150_000.0)
    assert restored.pps.ceiling == pytest.approx(2000.0) and restored.pps.source == "restored"
    assert restored.conntrack.size == 90_000.0           # no size learned here: the fleet's is the prior
    fresh = step(tmp_path / "fresh")
    fresh.adopt(None, 150_000.0)
    fresh.adopt(None, None)                             # the fleet's consensus withdrawn: the prior stays
    assert (fresh.pps.ceiling, fresh.pps.source, fresh.conntrack.size) == (150_000.0, "fleet", None)


def test_a_two_eni_host_counts_the_instance_table_once_and_skips_the_stale_copy(tmp_path: Path) -> None:
    """The driver reports conntrack_allowance_available on each ENI; AWS sizes it per instance. eth1's copy is
    stale (amzn/amzn-drivers #291): the step follows eth0's, never the sum, and sums the exceeded counters."""
    def two(available0: int, available1: int, exceeded0: int = 0, exceeded1: int = 0) -> dict[str, InterfaceEthtool]:
        return {**{"eth0": ena(available0, conntrack=exceeded0)["eth0"]},
                "eth1": ena(available1, conntrack=exceeded1)["eth0"]}

    s = step(tmp_path)
    r = None
    for i in range(10):
        r = s.run(i * 0.2, delta(10), None, two(2000 - 100 * i, 1900), None)
    assert r is not None and r.conntrack is not None
    assert r.conntrack.available == 1100 and r.conntrack.size == 2000       # not 3000 / 3900
    assert r.conntrack.in_use_ratio == pytest.approx(0.45)
    assert s.conntrack.level.source == "eth0"
    r = s.run(2.0, delta(10), None, two(1000, 1900, exceeded0=2, exceeded1=3), None)
    assert r.conntrack is not None and r.conntrack.exceeded_total == 5 and r.conntrack.available == 1000
