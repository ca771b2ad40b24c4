"""The sampling loop's one step: read counters, feed the models, publish an immutable snapshot."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from agent.models.counters import CounterTracker
from agent.readers.netdev import NetDevCounters
from agent.sampling import CollectorStatus, run_collector
from agent.sampling.netdev import NetdevCollector

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
    collectors: dict[str, CollectorStatus]
    # Filled by the models that the sampler feeds (credits, shaping); None until they have a figure.
    credits: Any = None
    shaping: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


# A hook the daemon adds to each step: (monotonic time, per-interface deltas, tracker) -> values merged
# into the snapshot (e.g. {"credits": ...}). Kept as plain callables so the sampler stays small.
StepHook = Callable[[float, dict, CounterTracker], dict]


class Sampler:
    def __init__(self, interfaces: Callable[[], list[str]], rate_window: float,
                 procfs: str = "/proc", sysfs: str = "/sys",
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.netdev = NetdevCollector(interfaces, procfs, sysfs)
        self.tracker = CounterTracker(rate_window)
        self.status: dict[str, CollectorStatus] = {}
        self.hooks: list[StepHook] = []
        self.clock, self.wall = clock, wall
        self.samples_total = 0
        self.latest: Optional[Snapshot] = None

    def step(self) -> Snapshot:
        start = time.perf_counter()
        now = self.clock()
        readings = run_collector(self.netdev, self.status)
        deltas = self.tracker.update(now, readings or {})
        merged: dict[str, Any] = {}
        for hook in self.hooks:
            try:
                merged.update(hook(now, deltas, self.tracker))
            except Exception:
                log.exception("sample hook %r failed", hook)
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
            collectors={k: CollectorStatus(v.success, v.duration, v.supported) for k, v in self.status.items()},
            credits=merged.pop("credits", None),
            shaping=merged.pop("shaping", None),
            extra=merged,
        )
        self.latest = snap  # one reference swap: scrapes read whole snapshots, never half-updated ones
        return snap
