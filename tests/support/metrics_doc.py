"""Check an exposition against docs/metrics.md: every burstwatch_ family must be described there."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def undocumented(exposition: str) -> list[str]:
    docs = DOC.read_text()
    missing = []
    for name, kind in set(re.findall(r"^# TYPE (burstwatch_\w+) (\w+)", exposition, re.M)):
        documented = f"{name}_total" if kind == "counter" and not name.endswith("_total") else name
        if f"`{documented}`" not in docs:
            missing.append(documented)
    return sorted(missing)
