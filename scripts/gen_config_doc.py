#!/usr/bin/env python3
"""Regenerate the key table in docs/configuration.md from agent/config.py (`--check` fails on drift)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from docregion import rewrite  # noqa: E402 (beside this script)

from agent.config import describe_keys, reload_keys  # noqa: E402

DOC = ROOT / "docs" / "configuration.md"
BEGIN, END = "<!-- keys:begin (scripts/gen_config_doc.py) -->", "<!-- keys:end -->"


def _fmt(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (list, dict)) and not value:
        return "`[]`" if isinstance(value, list) else "`{}`"
    return f"`{value}`"


def table() -> str:
    """One row per key; "on SIGHUP" is the reload's decision for it (agent/config_loader.py, "reloads")."""
    waits = reload_keys()
    rows = ["| key | type | default | on SIGHUP | meaning |", "|---|---|---|---|---|"]
    for key, typ, default, doc in describe_keys():
        when = "needs a restart" if waits[key] else "applies on reload"
        rows.append(f"| `{key}` | {typ} | {_fmt(default)} | {when} | {doc} |")
    return "\n".join(rows)


def main() -> int:
    return rewrite(DOC, BEGIN, END, table(), "scripts/gen_config_doc.py", sys.argv)


if __name__ == "__main__":
    sys.exit(main())
