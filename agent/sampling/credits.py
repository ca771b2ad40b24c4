"""Sampling step for the burst credits: this sample's bytes and shaping increase into the bucket model.

Runs after shaping (docs/architecture.md, "The sampling loop"); its state is kept in state_dir/credits.json
within one boot and the sizes it learns in learned-buckets.json per type (agent/writers/credit_store.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from agent.config import CreditsConfig
from agent.models.counters import CounterTracker, InterfaceDelta
from agent.models.credit_model import (
    SAVE_MOVEMENT_FRACTION,
    CreditEstimator,
    CreditReading,
    estimator_for,
    learnable,
)
from agent.models.profile import BandwidthProfile
from agent.models.shaping import ShapingReading
from agent.models.units import bytes_to_gbit
from agent.readers.netdev import NetDevCounters
from agent.sampling import keep
from agent.writers.credit_store import CreditStore
from agent.writers.statefile import boottime

log = logging.getLogger(__name__)


class CreditsStep:
    """Owns the estimator for the running profile; the sampler runs it once per sample (a ModelStep)."""

    name = "credits"
    section = "credits"

    def __init__(self, profile: BandwidthProfile, state_dir: str, cfg: Optional[CreditsConfig] = None,
                 procfs: str = "/proc", clock: Callable[[], float] = boottime,
                 sample_clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` spans restarts (CLOCK_BOOTTIME); `sample_clock` is the one run()'s `now` comes from (the
        sampler's), so the state is stamped when the sample's counters were read, not when the step ends."""
        cfg = cfg or CreditsConfig()
        self.profile = profile
        self.cfg = cfg
        self.store = CreditStore(state_dir, procfs, clock)
        self.clock = clock
        self.sample_clock = sample_clock
        self._sample_at = clock()                       # `clock` when the latest sample's counters were read
        self._restored = False
        self._last_raw: dict[str, tuple[Optional[int], int, int]] = {}
        self.restore_note = "fresh"
        # The fleet's smallest and largest size for the type (bytes), set before a fleet profile is applied.
        self.fleet_spread: Optional[tuple[float, float]] = None
        self.estimator = self._new_estimator(profile)
        self.latest: Optional[dict[str, CreditReading]] = None
        self._saved: Optional[dict[str, Any]] = None    # the estimator's state at the last save
        self._fresh: list[str] = []                     # the directions that learned a size this sample
        # Called when a direction learned a size, on the sampling thread: the fleet publisher reads
        # learned() and only queues (docs/fleet.md).
        self.on_learned: Optional[Callable[[], None]] = None

    # -- profile and learned sizes --------------------------------------------------------------
    def _learnable(self, profile: BandwidthProfile) -> bool:
        return learnable(profile, self.cfg)

    def _new_estimator(self, profile: BandwidthProfile) -> CreditEstimator:
        learned = self.store.learned_for(profile.instance_type) if profile.bursts else None
        return estimator_for(profile, self.cfg, self.fleet_spread, learned)

    def set_profile(self, profile: BandwidthProfile) -> None:
        """A new profile (reload): keep each direction's deficit, re-clamped to the new bucket."""
        old = self.estimator.to_state()
        self.profile = profile
        self.estimator = self._new_estimator(profile)
        self.estimator.restore(old, bucket_too=False)

    def reconfigure(self, cfg: CreditsConfig) -> None:
        """[credits] on reload: save_interval, forecast_window, learn and trust_configured_bucket apply at once;
        the shaping source's keys are marked restart-only in the config (the reload keeps their running values)."""
        self.cfg = cfg
        self.estimator.learn = self._learnable(self.profile)
        self.estimator.set_forecast_window(cfg.forecast_window)

    def learned(self) -> dict[str, dict[str, Any]]:
        """The sizes learned this sample, by direction (learned_buckets() entries), for the fleet."""
        learned = self.estimator.learned_buckets()
        return {d: learned[d] for d in self._fresh if d in learned}

    # -- restoring this boot's state ---------------------------------------------------------------
    def restore(self, raw: dict[str, NetDevCounters], tracker: CounterTracker, at: Optional[float] = None) -> str:
        """Load the saved state into the estimator and fold in the gap since it was saved up to `at` (the clock
        when `raw` was read; default now): bytes from the kernel's counters, their timing unknown, so
        estimator.account_gap errs towards fewer credits, the bytes taken at the peak. Returns how the state
        started: fresh | new_boot | restored."""
        doc = self.store.load(self.profile.instance_type)
        if doc is None:
            return "fresh"
        if doc.get("boot_id") != self.store.boot_id:
            # A new boot: credits are full at launch (docs/ec2-network-facts.md, "Burst credits"); only
            # learned sizes carry over.
            log.info("credit state is from another boot: starting with full buckets")
            return "new_boot"
        self.estimator.restore(doc.get("directions", {}), bucket_too=self._learnable(self.profile))
        now = self.clock() if at is None else at
        gap = max(0.0, now - float(doc.get("boottime", now)))
        moved: dict[str, Optional[float]] = {"in": 0.0, "out": 0.0}
        saved = doc.get("counters", {})
        for name, cur in raw.items():
            s = saved.get(name)
            if not isinstance(s, dict) or s.get("ifindex") != tracker.ifindex(name) or cur.rx_bytes < s["rx_bytes"] \
                    or cur.tx_bytes < s["tx_bytes"]:
                moved = {"in": None, "out": None}  # re-created or reset while we were down: unknowable
                break
            moved["in"] = (moved["in"] or 0.0) + cur.rx_bytes - s["rx_bytes"]
            moved["out"] = (moved["out"] or 0.0) + cur.tx_bytes - s["tx_bytes"]
        self.estimator.account_gap(gap, moved, self.profile.peak_bytes_per_second)
        log.info("credit state restored after %.1f s since its last save (bytes meanwhile in=%s out=%s)", gap,
                 moved["in"], moved["out"])
        return "restored"

    # -- per sample ------------------------------------------------------------------------------
    def run(self, now: float, deltas: dict[str, InterfaceDelta], tracker: CounterTracker,
            shaping: Optional[ShapingReading]) -> Optional[dict[str, CreditReading]]:
        raw = tracker.raw()
        # The counters were read at `now`, a while before this stage runs (longest in the first sample after
        # a start), and a restart's gap must not count that as refill time (docs/credits.md, "Persistence").
        lag = self.sample_clock() - now
        self._sample_at = self.clock() - (lag if 0.0 <= lag <= 60.0 else 0.0)   # else `now` is another clock
        if not self._restored:
            self._restored = True
            if self.estimator.active:
                self.restore_note = self.restore(raw, tracker, self._sample_at)
        nbytes = {"in": 0.0, "out": 0.0}
        dt = 0.0
        for delta in deltas.values():
            nbytes["in"] += delta.counters.rx_bytes
            nbytes["out"] += delta.counters.tx_bytes
            dt = max(dt, delta.dt)
        rates = tracker.instance_rates() or {"in": 0.0, "out": 0.0}
        # No shaping source, or its first reading: the model sees "unknown" (None), not "not shaped".
        increase = shaping.increase if shaping is not None and shaping.increase else None
        learned_before = {d: b.learner.learned_count for d, b in self.estimator.buckets.items()}
        seen_before = sum(b.sizes.seen for b in self.estimator.buckets.values())
        readings = self.estimator.update(dt, nbytes, rates, increase)
        self._last_raw = {n: (tracker.ifindex(n), c.rx_bytes, c.tx_bytes) for n, c in raw.items()}
        self._fresh = [d for d, b in self.estimator.buckets.items()
                       if b.learner.learned_count != learned_before.get(d, 0)]
        for d in self._fresh:
            b = self.estimator.buckets[d]
            log.info("direction=%s bucket learned: %.0f bytes (%.1f Gbit) by %s, %d time(s)", d,
                     b.bucket, bytes_to_gbit(b.bucket), b.learner.learn_method, b.learner.learned_count)
        if not self._fresh and sum(b.sizes.seen for b in self.estimator.buckets.values()) != seen_before:
            self.save_learned()     # an exhaustion that agreed: one more size for the band (docs/credits.md)
        # Saved on movement (1 % of the bucket since the last save: what a crash can cost), at most once per
        # sample, and every save_interval while the estimate stays still (docs/credits.md, "Persistence").
        keep(self, bool(self._fresh), self._saved is None
             or self.estimator.movement(self._saved) >= SAVE_MOVEMENT_FRACTION
             or self.clock() - self.store.last_save >= self.cfg.save_interval)
        self.latest = readings
        return readings if self.estimator.active or self.profile.baseline_bytes_per_second else None

    # -- persistence -----------------------------------------------------------------------------
    def save(self) -> None:
        """This boot's state, and the learned sizes when a direction learned one this sample."""
        if self._fresh:
            self.save_learned()
        if self.estimator.active:
            # A failed write (logged once by the store) counts as an attempt too: the next movement or
            # heartbeat tries again, not every sample.
            self.store.save(self.estimator.to_state(), self.profile.instance_type, self._last_raw, self._sample_at)
            self._saved = self.estimator.to_state()

    def save_learned(self) -> None:
        self.store.save_learned(self.profile.instance_type, self.estimator.learned_buckets())
