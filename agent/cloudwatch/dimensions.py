"""The dimensions of burstwatch's CloudWatch datums: the instance's, the configured extra ones, and the
rules CloudWatch sets on them (pure). What is published is the figure table's (agent/models/figures/)."""

from __future__ import annotations

import logging
from typing import Optional

from agent.models.cw_aggregate import MAX_DIMENSIONS, Dims

log = logging.getLogger(__name__)


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


def aggregation_sets(configured: Optional[list[list[str]]], instance_dims: Dims) -> list[Dims]:
    """The dimension sets (with this instance's values) of the metrics it shares with its group: each
    configured set, its names in the configured order, a set given twice in any order only once (the
    CloudWatch agent published such sets twice: aws/amazon-cloudwatch-agent#672); a set naming a dimension
    this instance does not have is left out, with one log line. The default (None) is the Auto Scaling
    group when the instance has one, else its type."""
    have = dict(instance_dims)
    if configured is None:
        for name in ("AutoScalingGroupName", "InstanceType"):
            if name in have:
                return [((name, have[name]),)]
        return []
    out: list[Dims] = []
    seen: set[tuple[str, ...]] = set()
    for names in configured:
        norm = tuple(sorted(names))
        if norm in seen:
            continue
        seen.add(norm)
        missing = [n for n in names if n not in have]
        if missing:
            log.warning("cloudwatch: aggregation set %s left out: this instance has no %s dimension",
                        names, ", ".join(missing))
            continue
        out.append(tuple((n, have[n]) for n in names))
    return out
