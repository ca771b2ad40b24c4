"""The CloudWatch alarm rules burstwatch ships, and whether one holds on a period's statistics (pure).

One definition serves three readers: `burstwatch cloudwatch alarms` (agent/cloudwatch/alarms.py) turns them
into the alarms it prints, creates with PutMetricAlarm and writes as CloudFormation; the publisher asks
`breached()` of each closed period, to send it at once when an alarm's condition starts or ends and to
publish per-instance metrics only in the hours that need them; the cost model (cw_cost.py) counts their
alarm metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from agent.models import figures as F
from agent.models.units import DIRECTIONS

# What each alarm's period is cut into; also the horizon of "running out" (10 minutes leaves time to move
# traffic: docs/alerting.md).
HORIZON_SECONDS = 600.0
# The band's early side pages at this share of the horizon (BurstCreditsRunningOut's "earliest < 180" against
# its "< 600"; docs/alerting.md, "The trade"): the alarm weighs it by the inverse, so one threshold serves both.
EARLY_SHARE = 0.3
EARLY_WEIGHT = round(1.0 / EARLY_SHARE, 6)


def _cw(fig: F.Figure) -> str:
    """The CloudWatch name the figure is published under (the figure table's; one form per figure here)."""
    return fig.cloudwatch[0].name


@dataclass(frozen=True)
class AlarmSpec:
    """One alarm per direction on one burstwatch metric, or on a metric math expression over several.

    `statistic` reads an instance's own metric (its statistic set of every sample in the period);
    `group_statistic` reads a group's metric, to which every instance sends one value per period (its
    period reduced by the form's `rollup`, agent/models/figures/schema.py)."""

    slug: str
    metric: str
    statistic: str
    group_statistic: str
    comparison: str
    threshold: float
    treat_missing: str
    description: str
    # A metric math alarm: (query id, metric) pairs, each read with the statistic, and the expression over
    # the ids that the alarm watches ("MIN([...])", the only one used). Empty: the alarm watches `metric`.
    math: tuple[tuple[str, str], ...] = ()
    expression: str = ""
    # The threshold is the horizon: [cloudwatch] alarm_horizon replaces it (a lab runs at its own scale).
    horizon: bool = False
    # What each metric of `math` is multiplied by in the expression (empty: 1 each).
    weights: tuple[float, ...] = ()

    def limit(self, horizon: float = HORIZON_SECONDS) -> float:
        return horizon if self.horizon else self.threshold

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics the alarm reads (each is one billed alarm metric)."""
        return tuple(m for _, m in self.math) if self.math else (self.metric,)


ALARMS: tuple[AlarmSpec, ...] = (
    # The forecast is the earliest warning there is. As the Prometheus rule BurstCreditsRunningOut: the
    # band's early side (published only while the bucket drains, else a year) under 0.3 of the horizon,
    # weighted so that one threshold serves, or the sooner of the two point forecasts under it: the
    # instant one is right from the first seconds of a steady drain but a year (+Inf) in every pause of a
    # bursty one; the trend (the net rate over [credits] forecast_window) holds
    # through the pauses (docs/credits.md, "Two forecasts"). An instance's forecast is read as its Maximum
    # over the period: under the threshold for the whole minute, CloudWatch's form of the rule's `for: 1m`,
    # so a burst of a few seconds from a full bucket pages nobody. A group's is the Minimum over its
    # instances of that same per-instance Maximum (the rollup): its worst instance, in one metric.
    AlarmSpec("credit-exhaustion", _cw(F.CREDIT_EXHAUSTION_SECONDS), "Maximum", "Minimum",
              "LessThanThreshold", HORIZON_SECONDS, "missing",
              "burstwatch: {direction} burst credits run out within 10 minutes at the current rate or at "
              "the trend, or within 3 if the bucket is as small as its low estimate",
              math=(("instant", _cw(F.CREDIT_EXHAUSTION_SECONDS)),
                    ("trend", _cw(F.CREDIT_EXHAUSTION_TREND_SECONDS)),
                    ("early", _cw(F.CREDIT_EXHAUSTION_EARLIEST_SECONDS))),
              expression=f"MIN([instant, trend, early * {EARLY_WEIGHT}])", horizon=True,
              weights=(1.0, 1.0, EARLY_WEIGHT)),
    AlarmSpec("credit-low", _cw(F.CREDIT_REMAINING_RATIO), "Minimum", "Minimum",
              "LessThanThreshold", 0.2, "missing", "burstwatch: {direction} burst credits below 20 % of the bucket"),
    # Missing data here means no shaping counter moved (or no source): not a breach.
    AlarmSpec("shaping", _cw(F.SHAPING_PACKETS_TOTAL), "Sum", "Sum", "GreaterThanThreshold", 0.0,
              "notBreaching", "burstwatch: the shaper is queueing or dropping {direction} packets now"),
)

# Alarm metrics one set of alarms (one instance, or one group) is billed for: each metric an alarm reads,
# per direction (docs/cloudwatch.md, "Cost").
ALARM_METRICS_PER_SET = sum(len(a.metrics) for a in ALARMS) * len(DIRECTIONS)

# (metric, direction) -> {statistic name: value} of one closed period
PeriodStats = Mapping[tuple[str, str], Mapping[str, float]]


def breached(spec: AlarmSpec, stats: PeriodStats, direction: str,
             horizon: float = HORIZON_SECONDS) -> Optional[bool]:
    """Whether the alarm's condition holds on an instance's own period (read with `statistic`, as the
    per-instance alarm would); None when the period has none of its metrics."""
    weights = spec.weights or (1.0,) * len(spec.metrics)
    values = [stats[(m, direction)][spec.statistic] * w for m, w in zip(spec.metrics, weights)
              if (m, direction) in stats]
    if not values:
        return None
    value = min(values)                     # MIN([...]) for a math alarm, the value itself otherwise
    if spec.comparison == "LessThanThreshold":
        return value < spec.limit(horizon)
    return value > spec.limit(horizon)


def alarming(stats: PeriodStats, horizon: float = HORIZON_SECONDS) -> frozenset[tuple[str, str]]:
    """The (alarm slug, direction) pairs whose condition holds on this period of this instance."""
    return frozenset((a.slug, d) for a in ALARMS for d in DIRECTIONS if breached(a, stats, d, horizon))
