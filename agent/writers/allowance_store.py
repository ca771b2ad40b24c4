"""Allowance state on disk: state_dir/allowances.json, the learned conntrack size and PPS ceiling per type."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from agent.writers.statefile import JsonStore

STATE_FORMAT = "burstwatch-allowances/1"


class AllowanceStore:
    """state_dir/allowances.json: {"types": {instance type: {"conntrack": ..., "pps": ...}}}. A corrupt file is
    set aside (writers/statefile.py), as credits.json is."""

    def __init__(self, state_dir: str) -> None:
        self.store = JsonStore(Path(state_dir) / "allowances.json", STATE_FORMAT)

    def load(self, instance_type: Optional[str]) -> dict[str, Any]:
        doc = self.store.load() if instance_type else None
        entry = (doc or {}).get("types", {}).get(instance_type) if doc else None
        return entry if isinstance(entry, dict) else {}

    def save(self, instance_type: Optional[str], state: dict[str, Any]) -> None:
        if not instance_type:
            return
        doc = self.store.load() or {}
        types: dict[str, Any] = doc["types"] if isinstance(doc.get("types"), dict) else {}
        types[instance_type] = state
        self.store.save({"types": types})
