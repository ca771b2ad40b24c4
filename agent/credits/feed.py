"""Glue for the credit estimate: feed it each sample, give it the shaping signal, persist it across restarts."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from agent.models.counters import CounterTracker, InterfaceDelta
from agent.models.credit_model import CreditEstimator, CreditReading
from agent.models.profile import BandwidthProfile
from agent.readers.statefile import JsonStore, boottime, read_boot_id
from agent.sampling import CollectorStatus, run_collector

log = logging.getLogger(__name__)

STATE_FORMAT = "burstwatch-credits/1"
LEARNED_FORMAT = "burstwatch-learned-buckets/1"


class CreditTracker:
    """Owns the estimator for the running profile; called by the sampler once per sample."""

    def __init__(self, profile: BandwidthProfile, state_dir: str, save_interval: float = 5.0,
                 learn: bool = True, shaping: Any = None, trust_configured_bucket: bool = True,
                 status: Optional[dict[str, CollectorStatus]] = None,
                 procfs: str = "/proc", clock: Callable[[], float] = boottime) -> None:
        self.profile = profile
        self.learn = learn
        self.trust_configured_bucket = trust_configured_bucket
        self.shaping = shaping
        self.status = status if status is not None else {}
        self.procfs = procfs
        self.clock = clock
        self.save_interval = save_interval
        self.state = JsonStore(Path(state_dir) / "credits.json", STATE_FORMAT)
        self.learned_store = JsonStore(Path(state_dir) / "learned-buckets.json", LEARNED_FORMAT)
        self.boot_id = read_boot_id(procfs)
        self._last_shaping: Optional[dict[str, int]] = None
        self._shaping_total: Optional[dict[str, int]] = None
        self._last_save = -1e18
        self._restored = False
        self._last_raw: dict[str, tuple[Optional[int], int, int]] = {}
        self.restore_note = "fresh"
        self.estimator = self._new_estimator(profile)
        self.latest: Optional[dict[str, CreditReading]] = None

    # -- profile and learned sizes --------------------------------------------------------------
    def _learnable(self, profile: BandwidthProfile) -> bool:
        """A configured bucket is fixed unless credits.trust_configured_bucket = false."""
        return self.learn and (profile.bucket_source != "config" or not self.trust_configured_bucket)

    def _new_estimator(self, profile: BandwidthProfile) -> CreditEstimator:
        learnable = self._learnable(profile)
        if not profile.bursts:
            return CreditEstimator(profile.baseline_bytes_per_second, None, profile.bucket_source, learn=learnable)
        est = CreditEstimator(profile.baseline_bytes_per_second, profile.bucket_bytes, profile.bucket_source,
                              learn=learnable)
        learned = self._learned_for(profile.instance_type)
        if learned and learnable:
            est.restore({d: {**v, "bucket_source": "learned", "deficit": 0.0} for d, v in learned.items()})
        return est

    def _learned_for(self, instance_type: Optional[str]) -> Optional[dict[str, Any]]:
        doc = self.learned_store.load()
        if not doc or not instance_type:
            return None
        entry = doc.get("types", {}).get(instance_type)
        return entry if isinstance(entry, dict) else None

    def set_profile(self, profile: BandwidthProfile) -> None:
        """A new profile (reload): keep each direction's deficit, re-clamped to the new bucket."""
        old = self.estimator.to_state()
        self.profile = profile
        self.estimator = self._new_estimator(profile)
        self.estimator.restore(old, bucket_too=False)

    # -- per sample ------------------------------------------------------------------------------
    def _shaping_delta(self) -> Optional[dict[str, int]]:
        if self.shaping is None:
            return None
        cur = run_collector(self.shaping, self.status)
        if cur is None:
            self._last_shaping = None
            return None
        prev, self._last_shaping = self._last_shaping, cur
        total = self._shaping_total or {}
        if prev is None:
            self._shaping_total = {d: total.get(d, 0) for d in cur}
            return None  # first reading only sets the baseline
        delta = {}
        for d, v in cur.items():
            # A driver reset restarts the counters from zero: count the new value, never a negative.
            inc = v - prev[d] if d in prev and v >= prev[d] else v
            delta[d] = inc
            total[d] = total.get(d, 0) + inc
        self._shaping_total = total
        return delta

    def hook(self, now: float, deltas: dict[str, InterfaceDelta], tracker: CounterTracker) -> dict[str, Any]:
        raw = tracker.raw()
        if not self._restored:
            self._restored = True
            self._restore(raw, tracker)
        shaping_delta = self._shaping_delta()
        nbytes = {"in": 0.0, "out": 0.0}
        dt = 0.0
        for delta in deltas.values():
            nbytes["in"] += delta.counters.rx_bytes
            nbytes["out"] += delta.counters.tx_bytes
            dt = max(dt, delta.dt)
        rates = tracker.instance_rates() or {"in": 0.0, "out": 0.0}
        learned_before = sum(b.learned_count for b in self.estimator.buckets.values())
        readings = self.estimator.update(dt, nbytes, rates, shaping_delta)
        self._last_raw = {n: (tracker.ifindex(n), c.rx_bytes, c.tx_bytes) for n, c in raw.items()}
        learned_after = sum(b.learned_count for b in self.estimator.buckets.values())
        if learned_after != learned_before:
            for d, b in self.estimator.buckets.items():
                log.info("direction=%s bucket learned: %.0f bytes (%.1f Gbit) by %s, %d time(s)", d,
                         b.bucket, b.bucket * 8 / 1e9, b.learn_method, b.learned_count)
            self.save_learned()
        if self.clock() - self._last_save >= self.save_interval:
            self.save()
        self.latest = readings
        return {"credits": readings if self.estimator.active or self.profile.baseline_bytes_per_second else None,
                "shaping": dict(self._shaping_total) if self._shaping_total is not None else None}

    # -- persistence -----------------------------------------------------------------------------
    def _accept(self, doc: dict[str, Any]) -> Optional[str]:
        if doc.get("instance_type") != self.profile.instance_type:
            return (f"saved for instance type {doc.get('instance_type')!r}, "
                    f"running as {self.profile.instance_type!r}")
        return None

    def _restore(self, raw: dict[str, Any], tracker: CounterTracker) -> None:
        if not self.estimator.active:
            return
        doc = self.state.load(self._accept)
        if doc is None:
            self.restore_note = "fresh"
            return
        if doc.get("boot_id") != self.boot_id:
            # A new boot: credits are full at launch (ec2-network-facts.md); only learned sizes carry over.
            self.restore_note = "new_boot"
            log.info("credit state is from another boot: starting with full buckets")
            return
        self.estimator.restore(doc.get("directions", {}), bucket_too=self._learnable(self.profile))
        gap = max(0.0, self.clock() - float(doc.get("boottime", self.clock())))
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
        self.estimator.account_gap(gap, moved)
        self.restore_note = "restored"
        log.info("credit state restored after %.1f s down (bytes meanwhile in=%s out=%s)", gap,
                 moved["in"], moved["out"])

    def save(self) -> None:
        if not self.estimator.active:
            return
        self._last_save = self.clock()
        counters = {n: {"ifindex": i, "rx_bytes": rx, "tx_bytes": tx} for n, (i, rx, tx) in self._last_raw.items()}
        try:
            self.state.save({"boot_id": self.boot_id, "boottime": self._last_save, "wall": time.time(),
                             "instance_type": self.profile.instance_type,
                             "directions": self.estimator.to_state(), "counters": counters})
        except OSError as exc:
            log.error("cannot save credit state to %s: %s", self.state.path, exc)

    def save_learned(self) -> None:
        if not self.profile.instance_type:
            return
        doc = self.learned_store.load() or {}
        types = doc.get("types", {})
        types[self.profile.instance_type] = self.estimator.learned_buckets()
        try:
            self.learned_store.save({"types": types})
        except OSError as exc:
            log.error("cannot save learned bucket sizes to %s: %s", self.learned_store.path, exc)

