"""What burstwatch's CloudWatch publishing costs a fleet, from the config's defaults (pure arithmetic).

`cloudwatch_cost(instances, groups, cfg, ...)` counts, per month and per second: custom metrics (per group and
per instance), PutMetricData calls, alarm metrics, the ec2:DescribeTags calls of the group lookup, and their
dollars at the us-east-1 list prices. docs/cloudwatch.md ("Cost", scripts/gen_cloudwatch_cost.py) and
docs/fleet.md's arithmetic (scripts/gen_fleet_arithmetic.py) print what it returns; tests/cloudwatch/
test_groups.py holds its targets."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from agent.config import CloudWatchConfig
from agent.models.cw_aggregate import MAX_DATUMS_PER_REQUEST
from agent.models.cw_alarms import ALARM_METRICS_PER_SET
from agent.models.figures import CLOUDWATCH_METRICS, selected_metrics
from agent.models.units import DIRECTIONS

MONTH_HOURS = 730.0                   # AWS bills by a 730-hour month
MONTH_SECONDS = MONTH_HOURS * 3600.0

# us-east-1 list prices (https://aws.amazon.com/cloudwatch/pricing/; docs/cloudwatch.md, "Cost"): custom
# metrics per metric-month in tiers, prorated by the hour in which a metric receives data ("All custom
# metrics are prorated by the hour. They're metered only when they're sent to CloudWatch",
# cloudwatch_billing.html); requests per 1,000; standard-resolution alarms per alarm metric and month.
METRIC_TIERS: tuple[tuple[float, float], ...] = ((10_000, 0.30), (240_000, 0.10), (750_000, 0.05),
                                                 (math.inf, 0.02))
REQUEST_PRICE = 0.01 / 1000
ALARM_METRIC_PRICE = 0.10
# The account's free tier a month: 10 metrics, 1,000,000 API requests, 10 alarm metrics.
FREE_METRICS, FREE_REQUESTS, FREE_ALARM_METRICS = 10, 1_000_000, 10

# Default quotas per account and Region. PutMetricData: "500 transactions per second (TPS)", raisable
# (Service Quotas, CloudWatch; re:Post knowledge-center/cloudwatch-api-call-usage). ec2:DescribeTags is a
# non-mutating action: a token bucket of 100 that refills at 20 a second (EC2 API reference, "Request
# throttling", table "Request token bucket sizes and refill rates").
PUT_METRIC_DATA_TPS = 500.0
DESCRIBE_TAGS_REFILL_PER_SECOND = 20.0

# The assumptions a fleet's bill depends on beyond the config, stated once:
# - the share of its hours in which an instance meets one of the alarms' conditions (credits running out
#   within 10 minutes, below 20 %, or shaped) at least once: per-instance metrics are billed for those hours
#   under per_instance = when_draining, and those periods are flushed at once (conservatively, the whole hour);
DEFAULT_HOT_FRACTION = 0.05
# - how long an instance lives: each new instance looks its group up once (cached in state_dir across
#   restarts), with ec2:DescribeTags unless instance metadata tags are enabled.
DEFAULT_LIFETIME_HOURS = 24.0


@dataclass(frozen=True)
class CloudWatchCost:
    """The fleet's CloudWatch bill and request rates. Counts are per month unless named per second."""

    instances: int
    groups: int
    group_metrics: float              # metrics without InstanceId, all month (groups x sets x metrics)
    instance_metrics: float           # metric-months with InstanceId, over the fleet
    metrics: float                    # metric-months in all
    calls: float                      # PutMetricData calls, the fleet
    calls_per_second: float
    alarm_metrics: float
    describe_tags_per_second: float
    dollars_metrics: float
    dollars_requests: float
    dollars_alarms: float

    @property
    def dollars(self) -> float:
        return self.dollars_metrics + self.dollars_requests + self.dollars_alarms

    @property
    def per_instance_month(self) -> float:
        """Dollars per instance and month, all in (metrics, requests, alarms)."""
        return self.dollars / self.instances

    @property
    def quota_share(self) -> float:
        """PutMetricData calls per second as a share of the default 500 TPS."""
        return self.calls_per_second / PUT_METRIC_DATA_TPS

    @property
    def describe_tags_share(self) -> float:
        """DescribeTags calls per second as a share of the bucket's refill rate (20/s)."""
        return self.describe_tags_per_second / DESCRIBE_TAGS_REFILL_PER_SECOND


def metric_dollars(metric_months: float, free: bool = True) -> float:
    """The tiered price of this many metric-months (after the free 10 when `free`)."""
    left = max(0.0, metric_months - (FREE_METRICS if free else 0))
    total = 0.0
    for size, price in METRIC_TIERS:
        take = min(left, size)
        total += take * price
        left -= take
        if left <= 0:
            break
    return total


def metrics_per_set(cfg: CloudWatchConfig, peers: int = 0, group: bool = True) -> int:
    """Metrics one instance (`group` False) or one aggregation set's value (`group` True) receives: a
    per-direction form is one per direction, a per-instance form one, a peer form one per peer and direction
    (a group's drops Peer: one per direction); `peers` is how many peers an instance probes."""
    names, _ = selected_metrics(cfg.include)
    n = 0
    for name in names:
        per = CLOUDWATCH_METRICS[name].per
        if per == "direction":
            n += len(DIRECTIONS)
        elif per == "instance":
            n += 1
        elif peers:
            n += len(DIRECTIONS) * (1 if group else peers)
    return n


def aggregation_sets(cfg: CloudWatchConfig, groups: int) -> int:
    """Distinct aggregation metrics' dimension values over the fleet: each named set takes `groups` values
    (the Auto Scaling groups, or as many instance types), the empty set one; the default is one set."""
    sets = cfg.aggregation_dimensions
    if sets is None:
        return groups
    return sum(groups if s else 1 for s in {tuple(sorted(x)) for x in sets})


def cloudwatch_cost(instances: int, groups: int = 1, cfg: Optional[CloudWatchConfig] = None, *,
                    hot_fraction: float = DEFAULT_HOT_FRACTION, peers: int = 0,
                    lifetime_hours: float = DEFAULT_LIFETIME_HOURS, imds_tags: bool = False,
                    free_tier: bool = True) -> CloudWatchCost:
    """The CloudWatch bill of `instances` instances in `groups` groups, each running `cfg` (default: the
    [cloudwatch] defaults, publishing on).

    `hot_fraction`: share of an instance's hours in which an alarm's condition holds at least once (its
    per-instance metrics are billed for those hours under when_draining, and its periods flushed at once for
    them); `peers`: peers each instance probes (0: no probes); `lifetime_hours`: how long an instance lives
    (one DescribeTags call each, unless `imds_tags`); `free_tier`: take the account's free tier off."""
    cfg = cfg or CloudWatchConfig(enabled=True)
    share = {"always": 1.0, "never": 0.0}.get(cfg.per_instance, hot_fraction)
    period = float(cfg.period)
    steady = cfg.steady_flush_interval
    hot_interval = min(steady, max(period, 10.0))
    group_set = metrics_per_set(cfg, peers, group=True)
    inst_set = metrics_per_set(cfg, peers, group=False)
    sets = aggregation_sets(cfg, groups)
    sets_per_instance = sets / groups if groups else 0
    group_metrics = sets * group_set
    instance_metrics = instances * inst_set * share
    # Calls: steady flushes carry the periods since the last one; each call takes up to 1,000 datums.
    datums_per_period = group_set * sets_per_instance
    steady_calls = math.ceil(steady / period * (datums_per_period + inst_set * share) / MAX_DATUMS_PER_REQUEST)
    hot_calls = math.ceil(hot_interval / period * (datums_per_period + inst_set) / MAX_DATUMS_PER_REQUEST)
    per_instance_calls = MONTH_SECONDS * ((1 - hot_fraction) * steady_calls / steady
                                          + hot_fraction * hot_calls / hot_interval)
    calls = instances * per_instance_calls
    alarm_sets = sets + (instances if cfg.per_instance == "always" else 0)
    alarm_metrics = alarm_sets * ALARM_METRICS_PER_SET
    metrics = group_metrics + instance_metrics
    return CloudWatchCost(
        instances=instances, groups=groups, group_metrics=group_metrics, instance_metrics=instance_metrics,
        metrics=metrics, calls=calls, calls_per_second=calls / MONTH_SECONDS, alarm_metrics=alarm_metrics,
        describe_tags_per_second=0.0 if imds_tags else instances / (lifetime_hours * 3600.0),
        dollars_metrics=metric_dollars(metrics, free_tier),
        dollars_requests=max(0.0, calls - (FREE_REQUESTS if free_tier else 0)) * REQUEST_PRICE,
        dollars_alarms=max(0.0, alarm_metrics - (FREE_ALARM_METRICS if free_tier else 0)) * ALARM_METRIC_PRICE)
