"""The sampling pipeline: explicit steps per sample (netdev, ethtool, shaping, credits, allowances) into a snapshot."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

from agent.models.conntrack import ConntrackReading
from agent.models.counters import CounterTracker
from agent.models.credit_model import CreditReading
from agent.models.pps import PpsReading
from agent.models.shaping import ShapingReading
from agent.readers.netdev import NetDevCounters
from agent.sampling import StepStatus, run_step
from agent.sampling.allowances import AllowanceReading, AllowancesStep
from agent.sampling.credits import CreditsStep
from agent.sampling.ethtool import EthtoolStep, InterfaceEthtool
from agent.sampling.netdev import NetdevStep
from agent.sampling.shaping import ShapingStep

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape or a publisher needs, computed once per sample; readers never block on it."""

    wall_time: float
    interfaces: tuple[str, ...]
    raw: dict[str, NetDevCounters]
    totals: dict[str, list[int]]
    interface_rates: dict[str, dict[str, float]]
    instance_rates: Optional[dict[str, float]]
    resets: dict[str, int]
    sample_duration: float
    samples_total: int
    steps: dict[str, StepStatus]
    # Each later step's reading; None when the step is not configured, not supported here or failed.
    ethtool: Optional[dict[str, InterfaceEthtool]] = None
    shaping: Optional[ShapingReading] = None
    credits: Optional[dict[str, CreditReading]] = None
    # Step 5's models (docs/allowances.md): the conntrack table and the PPS ceiling, and the whole reading
    # (sources, the table's owners) for status.
    conntrack: Optional[ConntrackReading] = None
    pps: Optional[PpsReading] = None
    allowances: Optional[AllowanceReading] = None


class Sampler:
    """Runs the steps in their one order, each fed the readings of the steps before it. A step's failure
    is recorded in its step status and leaves its reading None; it never fails the sample."""

    def __init__(self, netdev: NetdevStep, rate_window: float,
                 ethtool: Optional[EthtoolStep] = None, shaping: Optional[ShapingStep] = None,
                 credits: Optional[CreditsStep] = None, allowances: Optional[AllowancesStep] = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.netdev = netdev
        self.ethtool = ethtool
        self.shaping = shaping
        self.credits = credits
        self.allowances = allowances
        self.tracker = CounterTracker(rate_window)
        self.status: dict[str, StepStatus] = {}
        self.clock, self.wall = clock, wall
        self.samples_total = 0
        self.latest: Optional[Snapshot] = None

    def sample(self) -> Snapshot:
        start = time.perf_counter()
        now = self.clock()
        # 1. netdev: bytes and packets per interface -> safe deltas and windowed rates.
        readings = run_step(self.netdev, self.status)
        deltas = self.tracker.update(now, readings or {})
        dt = max((d.dt for d in deltas.values()), default=0.0)
        # 2. ethtool: the ENA statistics, with reset-safe totals and this sample's increases.
        ethtool = run_step(self.ethtool, self.status) if self.ethtool is not None else None
        # 3. shaping: a pure function of step 2's reading (or the tc qdiscs).
        shaping = None
        if self.shaping is not None:
            shaping = run_step(self.shaping, self.status, ethtool, dt)
            if shaping is None:
                shaping = self.shaping.stale()
        # 4. credits: the bucket model, fed this sample's bytes and shaping increase.
        credits = None
        if self.credits is not None:
            credits = run_step(self.credits, self.status, now, deltas, self.tracker, shaping)
        # 5. allowances: PPS, conntrack and link-local counters (step 2, or the nft lab) into their models.
        allowances = None
        if self.allowances is not None:
            allowances = run_step(self.allowances, self.status, now, deltas, self.tracker.instance_rates(),
                                  ethtool, shaping)
        self.samples_total += 1
        snap = Snapshot(
            wall_time=self.wall(),
            interfaces=tuple(sorted((readings or {}).keys())),
            raw=self.tracker.raw(),
            totals=self.tracker.totals(),
            interface_rates=self.tracker.interface_rates(),
            instance_rates=self.tracker.instance_rates(),
            resets=dict(self.tracker.resets_total),
            sample_duration=time.perf_counter() - start,
            samples_total=self.samples_total,
            steps={k: StepStatus(v.success, v.duration, v.supported) for k, v in self.status.items()},
            ethtool=ethtool,
            shaping=shaping,
            credits=credits,
            conntrack=allowances.conntrack if allowances is not None else None,
            pps=allowances.pps if allowances is not None else None,
            allowances=allowances,
        )
        self.latest = snap  # one reference swap: scrapes read whole snapshots, never half-updated ones
        return snap
