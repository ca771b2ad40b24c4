"""What burstwatch publishes to CloudWatch: the metric catalogue and the dimension rules (pure)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from agent.models.cw_aggregate import MAX_DIMENSIONS, Dims

log = logging.getLogger(__name__)

# "Not draining" (+Inf) cannot be sent ("special values ... +Infinity ... are not supported",
# API_PutMetricData); a year stands for "never" and longer forecasts are clipped to it, so Minimum and
# alarms below it stay meaningful.
EXHAUSTION_CAP_SECONDS = 365 * 86400.0


@dataclass(frozen=True)
class MetricSpec:
    """One published metric: its CloudWatch name and unit, what it is per, the statistic to read."""

    name: str
    unit: str
    per: str            # "direction" | "instance" | "peer" (Peer and Direction)
    statistic: str
    doc: str


# The catalogue. DEFAULT_METRICS are published when enabled; the others need [cloudwatch] include.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("CreditRemainingRatio", "None", "direction", "Minimum",
               "estimated burst credit left, as a fraction of the bucket (0..1)"),
    MetricSpec("CreditExhaustionSeconds", "Seconds", "direction", "Minimum",
               "forecast seconds until the bucket is empty at the current rate; 31536000 (a year) when "
               "not draining"),
    # The alarm takes the sooner of the two (agent/cloudwatch/alarms.py): the instant forecast is +Inf in
    # every pause of a bursty drain, the trend is not (docs/credits.md, "Two forecasts").
    MetricSpec("CreditExhaustionTrendSeconds", "Seconds", "direction", "Minimum",
               "forecast seconds until the bucket is empty at the net spend rate over [credits] "
               "forecast_window (bursts and pauses together); 31536000 (a year) when not draining"),
    MetricSpec("ThroughputBytesPerSecond", "Bytes/Second", "direction", "Average",
               "measured instance throughput (all monitored interfaces)"),
    MetricSpec("ShapingEvents", "Count", "direction", "Sum",
               "increase of the shaping counter (ENA bw_in/bw_out_allowance_exceeded, or the tc qdisc's "
               "overlimits): packets queued or dropped by the shaper"),
    MetricSpec("FailedChecks", "Count", "instance", "Maximum",
               "checks (ENA, driver, MTU) whose verdict is fail"),
    MetricSpec("ProbeThroughputBitsPerSecond", "Bits/Second", "peer", "Average",
               "probe throughput per peer and direction, in the period the probe ran (0 when it failed)"),
    # Optional
    MetricSpec("CreditRemainingBytes", "Bytes", "direction", "Minimum", "estimated burst credit left"),
    MetricSpec("CreditBucketBytes", "Bytes", "direction", "Maximum", "bucket size in use"),
    MetricSpec("CreditRefillSeconds", "Seconds", "direction", "Minimum",
               "seconds until the bucket is full at the current rate; 31536000 when not refilling"),
    MetricSpec("Shaped", "None", "direction", "Maximum", "1 when the shaping counter rose, else 0"),
    MetricSpec("CreditExhausted", "None", "direction", "Maximum",
               "1 while the shaper holds the rate at the baseline (bucket empty), else 0"),
    MetricSpec("WarnedChecks", "Count", "instance", "Maximum", "checks whose verdict is warn"),
    MetricSpec("ProbeSuccess", "None", "peer", "Minimum", "1 when the peer's latest probe succeeded"),
)
# The trend forecast is in the default set because the default exhaustion alarm reads it (2 more custom
# metrics: the arithmetic is in docs/cloudwatch.md, "Cost").
DEFAULT_METRICS = ("CreditRemainingRatio", "CreditExhaustionSeconds", "CreditExhaustionTrendSeconds",
                   "ThroughputBytesPerSecond", "ShapingEvents", "FailedChecks", "ProbeThroughputBitsPerSecond")
SPECS = {m.name: m for m in METRICS}


def selected_metrics(include: Iterable[str]) -> tuple[list[str], list[str]]:
    """(metrics to publish, unknown names in `include`)."""
    names = list(DEFAULT_METRICS)
    unknown = []
    for n in include:
        if n not in SPECS:
            unknown.append(n)
        elif n not in names:
            names.append(n)
    return names, unknown


def probe_bits_per_second(r: Any) -> float:
    """The probe's throughput in bit/s; 0 for a failed probe (a failure is a value, not a gap).

    The rate is `bits_per_second`, or else `throughput_bytes_per_second` (None when unknown)."""
    if not r.success:
        return 0.0
    bps = getattr(r, "bits_per_second", None)
    if bps is None:
        nbytes = getattr(r, "throughput_bytes_per_second", None)
        bps = nbytes * 8.0 if nbytes is not None else 0.0
    return float(bps)


# -- dimensions -----------------------------------------------------------------------------------

def check_dimension(name: str, value: str) -> Optional[str]:
    """Why CloudWatch would reject this dimension (Dimension shape in the API), or None."""
    if not name.strip() or len(name) > 255 or name.startswith(":") or not name.isascii():
        return f"dimension name {name!r} must be 1-255 ASCII characters, not starting with ':'"
    if not value.strip() or len(value) > 1024 or not value.isascii():
        return f"dimension {name}={value!r}: the value must be 1-1024 ASCII characters"
    return None


def common_dimensions(instance_id: Optional[str], instance_type: Optional[str],
                      autoscaling_group: Optional[str], extra: dict[str, str]) -> Dims:
    """InstanceId, InstanceType, AutoScalingGroupName (when known), then the configured extra
    dimensions in name order; room is left for the per-metric Peer and Direction (30 in all)."""
    dims: list[tuple[str, str]] = []
    for name, value in (("InstanceId", instance_id), ("InstanceType", instance_type),
                        ("AutoScalingGroupName", autoscaling_group)):
        if value and name not in extra:
            dims.append((name, value))
    for name in sorted(extra):
        problem = check_dimension(name, extra[name])
        if problem:
            log.error("cloudwatch: ignoring extra %s", problem)
            continue
        dims.append((name, extra[name]))
    room = MAX_DIMENSIONS - 2
    if len(dims) > room:
        log.error("cloudwatch: %d dimensions, at most %d fit beside Peer and Direction; dropping %s",
                  len(dims), room, ", ".join(n for n, _ in dims[room:]))
        dims = dims[:room]
    return tuple(dims)
