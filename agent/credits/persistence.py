"""Credit state on disk: the deficit saved atomically and restored within one boot; learned sizes kept per type."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from agent.models.counters import CounterTracker
from agent.models.credit_model import CreditEstimator
from agent.readers.netdev import NetDevCounters
from agent.writers.statefile import JsonStore, boottime, read_boot_id

log = logging.getLogger(__name__)

STATE_FORMAT = "burstwatch-credits/1"
# credits.json stays within one 4-KiB block with the trend's history in it: it is rewritten and fsynced on
# every 1 % of movement, every ~3 s at r4.large's peak (docs/credits.md, "Persistence").
STATE_BUDGET_BYTES = 4096
LEARNED_FORMAT = "burstwatch-learned-buckets/1"


class CreditStore:
    """credits.json (this boot's deficit and the counters it was saved at) and learned-buckets.json (the
    bucket sizes learned per instance type, kept across boots)."""

    def __init__(self, state_dir: str, procfs: str = "/proc", clock: Callable[[], float] = boottime) -> None:
        self.state = JsonStore(Path(state_dir) / "credits.json", STATE_FORMAT)
        self.learned_store = JsonStore(Path(state_dir) / "learned-buckets.json", LEARNED_FORMAT)
        self.boot_id = read_boot_id(procfs)
        self.clock = clock
        self.last_save = -1e18

    # -- learned sizes ---------------------------------------------------------------------------
    def learned_for(self, instance_type: Optional[str]) -> Optional[dict[str, Any]]:
        doc = self.learned_store.load()
        if not doc or not instance_type:
            return None
        entry = doc.get("types", {}).get(instance_type)
        return entry if isinstance(entry, dict) else None

    def save_learned(self, instance_type: Optional[str], learned: dict[str, Any]) -> None:
        if not instance_type:
            return
        doc = self.learned_store.load() or {}
        types = doc.get("types", {})
        types[instance_type] = learned
        self.learned_store.save({"types": types})     # a failure is counted and logged by the store

    # -- this boot's state -----------------------------------------------------------------------
    def restore(self, estimator: CreditEstimator, instance_type: Optional[str], bucket_too: bool,
                raw: dict[str, NetDevCounters], tracker: CounterTracker, peak: Optional[float] = None,
                at: Optional[float] = None) -> str:
        """Load the saved state into `estimator` and fold in the gap since it was saved up to `at` (the clock
        when `raw` was read; default now): bytes from the kernel's counters, their timing unknown, so
        estimator.account_gap errs towards fewer credits, the bytes taken at `peak` bytes/s. Returns how the
        state started: fresh | new_boot | restored."""

        def accept(doc: dict[str, Any]) -> Optional[str]:
            if doc.get("instance_type") != instance_type:
                return f"saved for instance type {doc.get('instance_type')!r}, running as {instance_type!r}"
            return None

        doc = self.state.load(accept)
        if doc is None:
            return "fresh"
        if doc.get("boot_id") != self.boot_id:
            # A new boot: credits are full at launch (docs/ec2-network-facts.md, "Burst credits"); only
            # learned sizes carry over.
            log.info("credit state is from another boot: starting with full buckets")
            return "new_boot"
        estimator.restore(doc.get("directions", {}), bucket_too=bucket_too)
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
        estimator.account_gap(gap, moved, peak)
        log.info("credit state restored after %.1f s since its last save (bytes meanwhile in=%s out=%s)", gap,
                 moved["in"], moved["out"])
        return "restored"

    def save(self, estimator: CreditEstimator, instance_type: Optional[str],
             counters: dict[str, tuple[Optional[int], int, int]], at: Optional[float] = None) -> None:
        """Save the deficit with the counters it was computed at (name -> (ifindex, rx_bytes, tx_bytes)) and
        the clock when they were read (`at`; default now)."""
        self.last_save = self.clock() if at is None else at
        doc_counters = {n: {"ifindex": i, "rx_bytes": rx, "tx_bytes": tx} for n, (i, rx, tx) in counters.items()}
        self.state.save({"boot_id": self.boot_id, "boottime": self.last_save, "wall": time.time(),
                         "instance_type": instance_type,
                         "directions": estimator.to_state(), "counters": doc_counters})
