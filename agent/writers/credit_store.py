"""Credit state on disk: credits.json (this boot's deficit) and learned-buckets.json (learned sizes per type)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

from agent.writers.statefile import JsonStore, boottime, read_boot_id

STATE_FORMAT = "burstwatch-credits/1"
# credits.json stays within one 4-KiB block with the trend's history in it: it is rewritten and fsynced on
# every 1 % of movement, every ~3 s at r4.large's peak (docs/credits.md, "Persistence").
STATE_BUDGET_BYTES = 4096
LEARNED_FORMAT = "burstwatch-learned-buckets/1"


class CreditStore:
    """credits.json (this boot's deficit and the counters it was saved at) and learned-buckets.json (the
    bucket sizes learned per instance type, kept across boots). Files only: what a saved state means for
    the bucket is the credits step's (agent/sampling/credits.py)."""

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
    def load(self, instance_type: Optional[str]) -> Optional[dict[str, Any]]:
        """The saved document when it was saved for `instance_type` (None: none, corrupt or another type's;
        a corrupt file is set aside by the JsonStore)."""

        def accept(doc: dict[str, Any]) -> Optional[str]:
            if doc.get("instance_type") != instance_type:
                return f"saved for instance type {doc.get('instance_type')!r}, running as {instance_type!r}"
            return None

        return self.state.load(accept)

    def save(self, directions: dict[str, Any], instance_type: Optional[str],
             counters: dict[str, tuple[Optional[int], int, int]], at: Optional[float] = None) -> None:
        """Save the estimator's state (`directions`) with the counters it was computed at (name -> (ifindex,
        rx_bytes, tx_bytes)) and the clock when they were read (`at`; default now)."""
        self.last_save = self.clock() if at is None else at
        doc_counters = {n: {"ifindex": i, "rx_bytes": rx, "tx_bytes": tx} for n, (i, rx, tx) in counters.items()}
        self.state.save({"boot_id": self.boot_id, "boottime": self.last_save, "wall": time.time(),
                         "instance_type": instance_type,
                         "directions": directions, "counters": doc_counters})
