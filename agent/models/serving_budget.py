"""The responder's hourly serving budget, sized to this instance: a share of its hourly refill (pure)."""

# Serving a peer's test spends this host's burst credits like a probe of its own (docs/probes.md, "What a
# probe costs in credits"). The cost line gives probes, own and served together, at most 2 % of a
# direction's hourly refill (agent.models.probe_cost.COST_LINE); the responder's default share is half of
# it, so a responder serving its whole budget beside the default schedule's own probes (0.56 %) stays on
# the line (docs/probes.md, "Credit guard").

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from agent.models.probe_cost import HOUR

if TYPE_CHECKING:  # models stay import-light; this is only a type here
    from agent.config import ResponderConfig

AUTO = "auto"
# What the budget in force was derived from (the `basis` label of burstwatch_responder_hourly_budget_info):
#   refill   - a share of this size's hourly refill (baseline x 1 h): it has a burst bucket to protect;
#   link     - no bucket (baseline = peak): serving spends no credit, so the budget is only a fairness
#              limit, the same share of what the link moves in an hour;
#   median   - the size is unknown: the share of the catalogue's median burstable size's refill;
#   config   - `hourly_budget_bytes` was given in bytes.
BASES = ("refill", "link", "median", "config")
# One source may take at most this part of the total: never the whole budget, yet a peer probing this host
# alone on the default [probe] schedule fits (5 s at the baseline per round; with the rounds' +-20 %
# jitter up to 5 rounds fall in one sliding hour: 25 s of baseline, under 0.75 x 36 s = 27 s).
PER_SOURCE_OF_TOTAL = 0.75
# The catalogue's median burstable type (x1e.4xlarge, c5d.2xlarge's 2.5 Gbit/s baseline: docs/probe-scheduling.md, "What
# probes cost"), standing in when this size's baseline is unknown; tests/models/test_serving_budget.py
# fails when the catalogue's median moves.
MEDIAN_BASELINE_BYTES_PER_SECOND = 2.5e9 / 8


@dataclass(frozen=True)
class ServingBudget:
    """Bytes the responder may serve per direction in a sliding hour, all sources and each source."""

    total: int
    per_source: int
    basis: str                        # one of BASES
    share: Optional[float]            # of the hourly refill (or link hour); None when given in bytes
    per_source_share: Optional[float] = None
    per_source_auto: bool = False     # per_source is PER_SOURCE_OF_TOTAL of the total

    def describe(self, per_source: bool = False) -> str:
        """What the total (or the per-source) budget is, for a refusal's reason and the log."""
        share = self.per_source_share if per_source else self.share
        if share is None:
            if per_source and self.per_source_auto:
                return "3/4 of [responder] hourly_budget_bytes"
            return f"[responder] hourly_budget{'_per_source' if per_source else ''}_bytes"
        pct = f"{share * 100:g} %"
        if self.basis == "link":
            return f"{pct} of what this host's link moves in an hour, a fairness limit: it has no burst bucket"
        if self.basis == "median":
            return f"{pct} of the median burstable size's hourly refill: this size's baseline is unknown"
        return f"{pct} of this host's hourly refill"


def serving_budget(total: Union[int, str], per_source: Union[int, str], share: float,
                   baseline_bytes_per_second: Optional[float],
                   peak_bytes_per_second: Optional[float]) -> ServingBudget:
    """The budget in force: `total` and `per_source` as configured (bytes, or "auto"). An "auto" total is
    `share` x baseline x 3600 s (the median burstable size's baseline when this one's is unknown); an
    "auto" per-source budget is PER_SOURCE_OF_TOTAL of the total in force."""
    basis: str
    used_share: Optional[float] = None
    if isinstance(total, int):
        amount, basis = total, "config"
    else:
        baseline = baseline_bytes_per_second
        if baseline is None or baseline <= 0:
            baseline, basis = MEDIAN_BASELINE_BYTES_PER_SECOND, "median"
        elif peak_bytes_per_second is not None and peak_bytes_per_second <= baseline:
            basis = "link"
        else:
            basis = "refill"
        amount, used_share = int(share * baseline * HOUR), share
    if isinstance(per_source, int):
        return ServingBudget(amount, per_source, basis, used_share)
    source_share = PER_SOURCE_OF_TOTAL * used_share if used_share is not None else None
    return ServingBudget(amount, int(PER_SOURCE_OF_TOTAL * amount), basis, used_share, source_share, True)


def responder_budget(cfg: ResponderConfig, baseline_bytes_per_second: Optional[float],
                     peak_bytes_per_second: Optional[float]) -> ServingBudget:
    """serving_budget() of a `[responder]` section."""
    return serving_budget(cfg.hourly_budget_bytes, cfg.hourly_budget_per_source_bytes, cfg.hourly_budget_share,
                          baseline_bytes_per_second, peak_bytes_per_second)
