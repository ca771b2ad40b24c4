#!/usr/bin/env python3
"""Regenerate the probe cost table in docs/probe-scheduling.md from the [probe] defaults and the catalogue,
through agent.models.probe_cost.hourly_cost (`--check` fails on drift)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from docregion import rewrite  # noqa: E402 (beside this script)

from agent.config import ProbeConfig  # noqa: E402
from agent.models.catalogue import TypeEntry, load_catalogue  # noqa: E402
from agent.models.probe_cost import (  # noqa: E402
    COST_LINE,
    DirectionCost,
    burstable,
    hourly_cost,
    median_burstable,
    worst_fraction,
)
from agent.models.units import gbit_to_bytes  # noqa: E402

DOC = ROOT / "docs" / "probe-scheduling.md"
BEGIN, END = "<!-- cost:begin (scripts/gen_probe_cost.py) -->", "<!-- cost:end -->"
# A few common burstable sizes, smallest baseline first; the median burstable type is added in its place.
TYPES = ("t3.micro", "t3.medium", "c6g.medium", "m5.large", "m6i.large", "m5.xlarge")


def _gb(nbytes: float) -> str:
    gb = nbytes / 1e9
    if gb >= 100:
        return f"{gb:.0f} GB"
    return f"{gb:.3g} GB" if gb >= 1 else f"{gb * 1000:.3g} MB"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.1f} %"


def _worst(costs: dict[str, DirectionCost]) -> DirectionCost:
    return max(costs.values(), key=lambda c: c.fraction or 0.0)


def _cells(cfg: ProbeConfig, e: TypeEntry) -> list[str]:
    assert e.baseline_gbps is not None and e.peak_gbps is not None
    c = _worst(hourly_cost(cfg, gbit_to_bytes(e.baseline_gbps), gbit_to_bytes(e.peak_gbps)))
    assert c.bytes_per_probe is not None and c.bytes_per_hour is not None and c.fraction is not None
    credit = c.credit_per_probe or 0.0
    return [_gb(c.bytes_per_probe), _gb(credit) if credit else "0", _gb(c.bytes_per_hour), _pct(c.fraction)]


def schedule(cfg: ProbeConfig) -> str:
    peers = "1 peer" if cfg.peers_per_round == 1 else f"{cfg.peers_per_round} peers"
    return (f"interval {cfg.interval:g} s, {peers} per round, {cfg.duration:g} s x "
            f"{cfg.streams} streams, directions {' + '.join(cfg.directions)}")


def table() -> str:
    cat = load_catalogue()
    new = ProbeConfig()
    old = dataclasses.replace(new, rate="peak")
    median = median_burstable(cat.values())
    n = len(burstable(cat.values()))
    entries = sorted({cat[t] for t in TYPES} | {median},
                     key=lambda e: (e.baseline_gbps or 0.0, e.peak_gbps or 0.0, e.instance_type))
    costs = hourly_cost(new, gbit_to_bytes(median.baseline_gbps or 0), gbit_to_bytes(median.peak_gbps or 0))
    worst = worst_fraction(costs)
    assert worst is not None
    c = _worst(costs)
    lines = [
        f"Default schedule: {schedule(new)}. Each direction's bucket sees {c.own_probes:g} own probes and "
        f"{c.served_probes:g} served ones an hour (a homogeneous fleet: every probe has one prober and one "
        "peer). Shares are of the hourly refill, baseline x 3600 s, per direction; *credit* is what one "
        "probe spends above the refill on an otherwise idle link.",
        "",
        f"| type | baseline, peak (Gbit/s) | refill per hour | rate = {old.rate}: probe | credit | per hour "
        f"| share | rate = {new.rate} (default): probe | credit | per hour | share |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        assert e.baseline_gbps is not None and e.peak_gbps is not None
        name = f"{e.instance_type} (median)" if e is median else e.instance_type
        lines.append(f"| {name} | {e.baseline_gbps:g}, {e.peak_gbps:g} | "
                     f"{_gb(gbit_to_bytes(e.baseline_gbps) * 3600)} | "
                     + " | ".join(_cells(old, e) + _cells(new, e)) + " |")
    lines += [
        "",
        f"The line: at most {_pct(COST_LINE)} of the hourly refill per direction, own probes and served ones "
        f"together, on the catalogue's median burstable type: {median.instance_type} ({median.baseline_gbps:g} "
        f"Gbit/s baseline, {median.peak_gbps:g} peak; the {(n - 1) // 2 + 1}th of {n} types with peak > "
        f"baseline in agent/data/catalogue.json, by baseline). The defaults take **{_pct(worst)}** "
        f"({'within' if worst <= COST_LINE else 'OVER'} the line).",
    ]
    return "\n".join(lines)


def main() -> int:
    return rewrite(DOC, BEGIN, END, table(), "scripts/gen_probe_cost.py", sys.argv)


if __name__ == "__main__":
    sys.exit(main())
