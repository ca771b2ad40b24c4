#!/usr/bin/env python3
"""Regenerate the probe cost table in docs/probe-scheduling.md from the [probe] defaults and the catalogue,
through agent.models.probe_cost.hourly_cost (`--check` fails on drift)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from docregion import rewrite  # noqa: E402 (beside this script)

from agent.config import ProbeConfig, ResponderConfig  # noqa: E402
from agent.iperf3.params import TestParams  # noqa: E402
from agent.models.catalogue import TypeEntry, load_catalogue  # noqa: E402
from agent.models.probe_cost import (  # noqa: E402
    COST_LINE,
    DirectionCost,
    burstable,
    hourly_cost,
    median_burstable,
    worst_fraction,
)
from agent.models.serving_budget import (  # noqa: E402
    PER_SOURCE_OF_TOTAL,
    responder_budget,
)
from agent.models.units import BITS_PER_BYTE, gbit_to_bytes  # noqa: E402
from agent.responder.policy import expected_bytes  # noqa: E402

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


# -- the responder's default hourly budget per type (docs/probe-scheduling.md, "The responder's budget") --
BUDGET_BEGIN, BUDGET_END = "<!-- budget:begin (scripts/gen_probe_cost.py) -->", "<!-- budget:end -->"
BUDGET_TYPES = ("t3.medium", "m5.large", "r4.large", "m5.xlarge", "c5n.large", "c5n.18xlarge")
STOCK_TEST = TestParams()  # `iperf3 -c HOST`: 10 s, one TCP stream, unlimited


def _admits(budget: float, expected: float) -> str:
    n = int(budget // expected) if expected > 0 else 0
    return str(n) if n else "**0: refused**"


def budget_row(cfg: ResponderConfig, name: str, baseline_gbps: Optional[float], peak_gbps: Optional[float]) -> str:
    base = gbit_to_bytes(baseline_gbps) if baseline_gbps is not None else None
    peak = gbit_to_bytes(peak_gbps) if peak_gbps is not None else None
    b = responder_budget(cfg, base, peak)
    head = f"| {name} | {baseline_gbps:g}, {peak_gbps:g} | " if base else f"| {name} | unknown | "
    head += f"{b.basis} | {_gb(b.total)} | {_gb(b.per_source)} | "
    stock = expected_bytes(STOCK_TEST, peak, cfg)
    if base is None or stock is None:
        # Nothing bounds the test's bytes in advance: it is refused only once the hour's bytes reach the budget.
        return head + "unknown | until spent | unknown | until spent |"
    paced = dataclasses.replace(STOCK_TEST, bandwidth=int(BITS_PER_BYTE * base))
    at_base = expected_bytes(paced, peak, cfg) or 0.0
    return (head + f"{_gb(stock)} | {_admits(b.total, stock)}, {_admits(b.per_source, stock)} | {_gb(at_base)} | "
            f"{_admits(b.total, at_base)}, {_admits(b.per_source, at_base)} |")


def budget_table() -> str:
    cat = load_catalogue()
    cfg = ResponderConfig()
    median = median_burstable(cat.values())
    entries = sorted({cat[t] for t in BUDGET_TYPES} | {median},
                     key=lambda e: (e.baseline_gbps or 0.0, e.peak_gbps or 0.0, e.instance_type))
    lines = [
        f"`[responder]` defaults: `hourly_budget_bytes = \"{cfg.hourly_budget_bytes}\"`, "
        f"`hourly_budget_per_source_bytes = \"{cfg.hourly_budget_per_source_bytes}\"`, `hourly_budget_share = "
        f"{cfg.hourly_budget_share:g}`: per direction, {_pct(cfg.hourly_budget_share)} of baseline x 3600 s for all "
        f"sources, {PER_SOURCE_OF_TOTAL:.0%} of that for one source. A stock `iperf3 -c HOST` asks for "
        f"{STOCK_TEST.duration} s unpaced, which the responder expects to move {STOCK_TEST.duration} s x the peak "
        f"(at most `max_bytes`, {_gb(cfg.max_bytes)}); paced at the baseline (`-b`, split over the streams) it "
        "moves 10 s of baseline. *Admits* is how many such tests fit an hour, all sources and one source.",
        "",
        "| type | baseline, peak (Gbit/s) | basis | budget, all sources | one source | stock 10 s test expects | "
        "admits | 10 s at the baseline | admits |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        name = f"{e.instance_type} (median)" if e is median else e.instance_type
        lines.append(budget_row(cfg, name, e.baseline_gbps, e.peak_gbps))
    lines.append(budget_row(cfg, "size unknown (off EC2)", None, None))
    return "\n".join(lines)


def main() -> int:
    return (rewrite(DOC, BEGIN, END, table(), "scripts/gen_probe_cost.py", sys.argv)
            or rewrite(DOC, BUDGET_BEGIN, BUDGET_END, budget_table(), "scripts/gen_probe_cost.py", sys.argv))


if __name__ == "__main__":
    sys.exit(main())
