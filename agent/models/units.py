"""Directions and units: the one definition every layer uses."""

from __future__ import annotations

# Separate buckets in and out (docs/ec2-network-facts.md, "Bandwidth"): every per-direction figure
# is keyed by these, in this order.
DIRECTIONS = ("in", "out")

BITS_PER_BYTE = 8


def gbit_to_bytes(gbit: float) -> float:
    """Gigabits (10**9 bits, as AWS quotes bandwidth) to bytes."""
    return gbit * 1e9 / BITS_PER_BYTE


def bytes_to_gbit(nbytes: float) -> float:
    """Bytes to gigabits (10**9 bits): the unit logs and `burstwatch status` print buckets in."""
    return nbytes * BITS_PER_BYTE / 1e9
