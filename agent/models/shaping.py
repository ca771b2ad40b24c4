"""The shaping signal as one typed reading: which source, how much it rose this sample, the total."""

from __future__ import annotations

from dataclasses import dataclass

# ENA's aggregate bandwidth-allowance counters (docs/ec2-network-facts.md, "ENA allowance counters"):
# packets queued or dropped because the instance went over its bandwidth allowance, cumulative. Only
# these two feed the credit model; pps, conntrack and linklocal are other limits.
BANDWIDTH_ALLOWANCE = {"in": "bw_in_allowance_exceeded", "out": "bw_out_allowance_exceeded"}
# Root qdiscs that shape by rate; their overlimits counter rises when a packet had to wait for tokens.
SHAPING_QDISCS = frozenset({"tbf", "htb", "hfsc", "cake", "cbq"})


@dataclass(frozen=True)
class ShapingReading:
    """One sample's shaping signal. `increase` is what the credit model and CloudWatch both read: a
    direction rose this sample when its increase is > 0. `total` is reset-safe (never decreases) and
    is what /metrics exports as burstwatch_shaping_packets_total. A direction the source lacks is absent
    from both. `increase` is empty on the first reading (it only sets the baseline)."""

    source: str                    # ethtool | tc
    increase: dict[str, int]
    total: dict[str, int]


def ethtool_shaping(stats: dict[str, int]) -> dict[str, int]:
    """{"in": bw_in_allowance_exceeded, "out": bw_out_allowance_exceeded} from one interface's ethtool
    statistics; a direction is absent when the driver lacks it (ENA < 2.2.10, other drivers)."""
    return {d: stats[name] for d, name in BANDWIDTH_ALLOWANCE.items() if name in stats}
