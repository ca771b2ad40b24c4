"""Sampling step for the PPS and conntrack allowances: the ENA counters (or the nft lab's) into their models.

Runs after ethtool and shaping (docs/architecture.md, "The sampling loop"). It takes this sample's increases
of pps_allowance_exceeded, conntrack_allowance_exceeded and linklocal_allowance_exceeded, summed over the
monitored ENIs, and each ENI's level conntrack_allowance_available (one stands for the instance), from the
ethtool step's reading (or, with
`[allowances] source = "nft"`, from the lab's nftables limiters: agent/readers/nft.py), the packets of the
netdev step, and whether bandwidth shaping explains the sample; it feeds ConntrackModel and PpsCeilingModel
(docs/allowances.md) and keeps their learned figures in state_dir/allowances.json, keyed by instance type.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, Union

from agent.config import AllowancesConfig
from agent.models.conntrack import ConntrackModel, ConntrackReading, running_out
from agent.models.counters import MAX_PACKETS_PER_SECOND, CounterSet, InterfaceDelta
from agent.models.ena import ALLOWANCE_STATS, CONNTRACK_AVAILABLE
from agent.models.flows import FlowOwner, flow_count, top_owners
from agent.models.pps import PpsCeilingModel, PpsReading, bandwidth_explains, near_ceiling
from agent.models.shaping import ShapingReading
from agent.readers.errors import NotSupported
from agent.readers.flows import Flow, ProcFlowSource
from agent.sampling import keep
from agent.sampling.ethtool import InterfaceEthtool
from agent.writers.allowance_store import AllowanceStore

log = logging.getLogger(__name__)

# Owners exported as burstwatch_conntrack_owner_flows{protocol,direction,port}: a bounded family (at most
# this many series), the busiest first.
TOP_OWNERS = 10
# A moment when conntrack_allowance_exceeded rises reads the flows at once (the size is learned from the
# count at a full moment, docs/allowances.md), but at most this often: while the table stays full every
# sample has drops.
EXCEEDED_FLOWS_MIN_INTERVAL = 1.0


class FlowSource(Protocol):
    def flows(self) -> list[Flow]: ...


@dataclass(frozen=True)
class AllowanceReading:
    """The step's reading: both models' readings and what else status and check show."""

    source: str                                 # ena | nft
    conntrack: Optional[ConntrackReading]       # None when neither counter nor level exists here
    pps: Optional[PpsReading]                   # None without a pps_allowance_exceeded counter
    running_out: bool                           # the ConntrackRunningOut condition, at [allowances] horizon
    near_ceiling: bool                          # the PpsNearCeiling condition, at near_ceiling_ratio
    flow_count: Optional[int]                   # this host's flows at the last read of them
    owners: tuple[FlowOwner, ...]               # the busiest (protocol, direction, port) groups


@dataclass(frozen=True)
class _Inputs:
    pps_exceeded: Optional[int]         # this sample's increase; None: no such counter here
    conntrack_exceeded: Optional[int]
    available: Union[None, int, Mapping[str, int]]   # the level (per ENI from ENA); None: not reported


class AllowancesStep:
    """The PPS and conntrack models for the running instance type (a ModelStep)."""

    name = "allowances"
    section = "allowances"

    def __init__(self, cfg: AllowancesConfig, state_dir: str, instance_type: Optional[str],
                 baseline: Callable[[], Optional[float]], procfs: str = "/proc",
                 flows: Optional[FlowSource] = None, nft: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.instance_type = instance_type
        self._baseline = baseline
        self._flows = flows if flows is not None else ProcFlowSource(procfs)
        self._nft = nft
        if cfg.source == "nft" and nft is None:
            from agent.readers.nft import NftReader

            self._nft = NftReader(cfg.nft_table, procfs)
        self._nft_counters: CounterSet[str] = CounterSet(MAX_PACKETS_PER_SECOND, "nft limiter")
        self.clock = clock
        self.conntrack = ConntrackModel(cfg.window)
        self.pps = PpsCeilingModel()
        self.pps.learn = cfg.learn
        self.store = AllowanceStore(state_dir)
        self._restore()
        self._saved = self._state()
        self._last_save = clock()
        self._flows_at = -1e18
        self._exceeded_flows_at = -1e18
        self._flow_count: Optional[int] = None
        self._owners: tuple[FlowOwner, ...] = ()
        self._said_unsupported = False
        self.latest: Optional[AllowanceReading] = None
        # Called (no arguments, on the sampling thread) when a size or ceiling was learned: the fleet
        # publisher reads learned() and queues it beside the learned buckets (docs/fleet.md); it must only queue.
        self.on_learned: Optional[Callable[[], None]] = None
        self._fleet_pps: Optional[float] = None     # a ceiling adopted from the fleet, until one of our own

    # -- state -----------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"conntrack": self.conntrack.to_state(), "pps": self.pps.to_state()}

    def _restore(self) -> None:
        saved = self.store.load(self.instance_type)
        if isinstance(saved.get("conntrack"), dict):
            self.conntrack.restore(saved["conntrack"])
        if isinstance(saved.get("pps"), dict):
            self.pps.restore(saved["pps"])
        if saved:
            log.info("allowance state restored for %s: conntrack size %s, PPS ceiling %s", self.instance_type,
                     self.conntrack.size, self.pps.ceiling)

    def save(self) -> None:
        """Save when anything changed since the last save (at shutdown and from run())."""
        state = self._state()
        if state != self._saved:
            self.store.save(self.instance_type, state)
            self._saved = state
        self._last_save = self.clock()

    def reconfigure(self, cfg: AllowancesConfig) -> None:
        """[allowances] on reload: window, horizon, shares, the flows' interval, learn and save_interval apply at
        once; source and nft_table are marked restart-only in the config."""
        self.cfg = cfg
        self.conntrack.set_window(cfg.window)
        self.pps.learn = cfg.learn

    def learned(self) -> dict[str, Optional[float]]:
        """This agent's own learned figures for the fleet (never ones it adopted from the fleet)."""
        own_pps = self.pps.source in ("learned", "restored") and self.pps.learned_count > 0
        return {"pps_ceiling_packets_per_second": self.pps.ceiling if own_pps else None,
                "conntrack_size_entries": self.conntrack.learned if self.conntrack.learned_count > 0 else None}

    def adopt(self, conntrack_size: Optional[float], pps_ceiling: Optional[float]) -> None:
        """The fleet's figures for this type, taken only where this agent has learned nothing itself."""
        if conntrack_size and self.conntrack.learned is None:
            self.conntrack.restore({"learned": conntrack_size, "learned_count": self.conntrack.learned_count})
        if pps_ceiling and self.pps.ceiling is None:
            self.pps.restore({"candidates": [pps_ceiling], "learned_count": self.pps.learned_count})
            self.pps.source = "fleet"
            self._fleet_pps = self.pps.ceiling

    # -- inputs ----------------------------------------------------------------------------------
    def _from_ethtool(self, ethtool: Optional[Mapping[str, InterfaceEthtool]]) -> _Inputs:
        sums: dict[str, Optional[int]] = {"pps": None, "conntrack": None}
        levels: dict[str, int] = {}        # one ENI's stands for the instance: models/conntrack.py InstanceLevel
        for name, r in (ethtool or {}).items():
            for kind, total in list(sums.items()):
                stat = ALLOWANCE_STATS[kind]
                if stat in r.raw:
                    sums[kind] = (total or 0) + r.increase.get(stat, 0)
            if CONNTRACK_AVAILABLE in r.raw:
                levels[name] = r.raw[CONNTRACK_AVAILABLE]
        return _Inputs(sums["pps"], sums["conntrack"], levels or None)

    def _from_nft(self, dt: float) -> _Inputs:
        c = self._nft.counters()
        raw = {k: v for k, v in (("pps", c.pps_dropped), ("conntrack", c.conntrack_dropped)) if v is not None}
        if not raw:
            raise NotSupported(f"no `limit rate over` or `ct count over` rule with a counter in {self.cfg.nft_table}")
        inc = self._nft_counters.update(raw, dt)
        available = None
        if c.conntrack_limit is not None:
            available = max(0, c.conntrack_limit - self._nft.conntrack_entries())
        return _Inputs(inc.get("pps"), inc.get("conntrack"), available)

    def _read_flows(self, now: float, exceeded: bool) -> Optional[int]:
        """This host's flow count when read this sample (else None: a stale count must not teach a size)."""
        due = now - self._flows_at >= self.cfg.flows_interval
        urgent = exceeded and now - self._exceeded_flows_at >= EXCEEDED_FLOWS_MIN_INTERVAL
        if not (due or urgent):
            return None
        try:
            flows = self._flows.flows()
        except (OSError, ValueError) as exc:
            log.debug("reading this host's flows failed: %s", exc)
            return None
        self._flows_at = now
        if urgent:
            self._exceeded_flows_at = now
        self._flow_count = flow_count(flows)
        self._owners = tuple(top_owners(flows, TOP_OWNERS))
        return self._flow_count

    def _say_unsupported(self, inputs: _Inputs) -> None:
        if self._said_unsupported or inputs.available is not None:
            return
        self._said_unsupported = True
        if inputs.conntrack_exceeded is not None:
            # ENA < 2.8.1, or a device without the capability (docs/allowances.md, "Connection tracking")
            log.info("conntrack_allowance_available not reported by the driver here: no conntrack size or "
                     "forecast; conntrack_allowance_exceeded is still counted")
        else:
            log.debug("no conntrack allowance statistics here (not ENA, or ENA < 2.2.10)")

    # -- per sample ------------------------------------------------------------------------------
    def run(self, now: float, deltas: Mapping[str, InterfaceDelta], rates: Optional[Mapping[str, float]],
            ethtool: Optional[Mapping[str, InterfaceEthtool]], shaping: Optional[ShapingReading]) -> AllowanceReading:
        dt = max((d.dt for d in deltas.values()), default=0.0)
        inputs = self._from_nft(dt) if self.cfg.source == "nft" else self._from_ethtool(ethtool)
        if inputs.pps_exceeded is None and inputs.conntrack_exceeded is None and inputs.available is None:
            raise NotSupported("no ENA allowance statistics on the monitored interfaces")
        self._say_unsupported(inputs)
        in_use = self._read_flows(now, bool(inputs.conntrack_exceeded))
        conntrack = None
        if inputs.conntrack_exceeded is not None or inputs.available is not None:
            conntrack = self.conntrack.observe(now, inputs.available, inputs.conntrack_exceeded or 0,
                                               in_use=in_use if self.cfg.learn else None)
        pps = None
        if inputs.pps_exceeded is not None:
            packets = sum(d.counters.rx_packets + d.counters.tx_packets for d in deltas.values())
            baseline = self._baseline()
            over = max(rates.values()) / baseline if rates and baseline else None
            shaped = shaping is not None and any(v > 0 for v in shaping.increase.values())
            pps = self.pps.observe(dt, packets, inputs.pps_exceeded, bandwidth_explains(shaped, over))
            if self._fleet_pps is not None and self.pps.source == "learned":
                # Our own episode replaces the fleet's figure (the ceiling is the largest recent candidate,
                # and a fleet value kept among them would outweigh this instance's own measurement).
                self.pps.candidates.remove(self._fleet_pps)
                self._fleet_pps = None
                pps = dataclasses.replace(pps, ceiling=self.pps.ceiling,
                                          headroom_ratio=pps.pps / self.pps.ceiling if self.pps.ceiling else None)
        learned = (self.conntrack.learned_count, self.pps.learned_count) != (
            self._saved["conntrack"].get("learned_count"), self._saved["pps"].get("learned_count"))
        # A learned size or ceiling is saved at once; a state that changed without learning (the largest level
        # seen creeping up) at most every save_interval.
        keep(self, learned, self.clock() - self._last_save >= self.cfg.save_interval)
        reading = AllowanceReading(
            self.cfg.source, conntrack, pps,
            conntrack is not None and running_out(conntrack, self.cfg.horizon, self.cfg.running_out_share),
            pps is not None and near_ceiling(pps, self.cfg.near_ceiling_ratio), self._flow_count, self._owners)
        self.latest = reading
        return reading
