"""The bandwidth profile the credit model measures against: baseline, peak, bucket, and their sources."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Optional

if TYPE_CHECKING:  # models stay import-light; these are only types here
    from agent.config import BandwidthConfig
    from agent.models.catalogue import TypeEntry

from agent.models.units import bytes_to_gbit, gbit_to_bytes

GBIT = gbit_to_bytes(1.0)  # bytes in one Gbit (AWS quotes decimal Gbit/s)

# Where a figure came from, most trusted first; exported as a label so every figure can be traced.
# "learned" is set by the credit model (agent/sampling/credits.py), never here.
SOURCES = ("config", "learned", "fleet", "api", "catalogue", "default", "none")

# AWS publishes no bucket size; the buckets measured on r4 sizes hold about an hour of baseline
# (docs/ec2-network-facts.md, "Measured bucket sizes"): the estimate until the credit model learns better.
DEFAULT_BUCKET_SECONDS = 3600.0


class CardBandwidth(NamedTuple):
    """One network card's baseline and peak, bytes per second per direction."""

    network_card: int
    baseline_bytes_per_second: Optional[float]
    peak_bytes_per_second: Optional[float]


@dataclass(frozen=True)
class BandwidthProfile:
    """Per-direction entitlement of this instance (AWS: up to N in and N out at the same time)."""

    instance_type: Optional[str] = None
    baseline_bytes_per_second: Optional[float] = None
    peak_bytes_per_second: Optional[float] = None
    # None when the size has no bucket (baseline == peak: it never exhausts) or nothing is known.
    bucket_bytes: Optional[float] = None
    baseline_source: str = "none"
    peak_source: str = "none"
    bucket_source: str = "none"
    # Every card of a multi-card type (the figures above are card 0's), from the same source as the type.
    cards: tuple[CardBandwidth, ...] = ()
    cards_source: str = "none"
    # Why a figure is not what a reader would expect (an override ignored, a peak raised to the baseline).
    notes: tuple[str, ...] = ()

    @property
    def bursts(self) -> bool:
        """True when the size has a burst bucket to watch."""
        return (self.baseline_bytes_per_second is not None and self.peak_bytes_per_second is not None
                and self.peak_bytes_per_second > self.baseline_bytes_per_second
                and self.bucket_bytes is not None and self.bucket_bytes > 0)

    @property
    def never_exhausts(self) -> bool:
        """Baseline and peak are known and equal: there is nothing to run out of."""
        return (self.baseline_bytes_per_second is not None and self.peak_bytes_per_second is not None
                and self.peak_bytes_per_second <= self.baseline_bytes_per_second)


def _gbit(value: Optional[float]) -> Optional[float]:
    return gbit_to_bytes(value) if value is not None else None


def resolve_profile(instance_type: Optional[str], config_bandwidth: BandwidthConfig,
                    api_entry: Optional[TypeEntry], catalogue_entry: Optional[TypeEntry], *,
                    fleet_bucket_bytes: Optional[float] = None) -> BandwidthProfile:
    """Pick each figure from the most trusted source that has it (pure).

    baseline, peak: config > api (DescribeInstanceTypes) > catalogue (bundled) > none, each on its own;
    bucket: config > fleet (the median other instances of the type learned, docs/fleet.md) > default
    (DEFAULT_BUCKET_SECONDS of baseline); a size whose baseline equals its peak has no bucket (source
    "none": it never exhausts). The agent's own learned size outranks all but a trusted configured one: the
    credit model restores it over this profile's bucket (CreditsStep, agent/sampling/credits.py)."""
    notes: list[str] = []

    def pick(conf: Optional[float], attr: str) -> tuple[Optional[float], str]:
        if conf is not None:
            return gbit_to_bytes(conf), "config"
        for source, entry in (("api", api_entry), ("catalogue", catalogue_entry)):
            value = getattr(entry, attr) if entry is not None else None
            if value is not None:
                return gbit_to_bytes(value), source
        return None, "none"

    baseline, baseline_source = pick(config_bandwidth.baseline_gbps, "baseline_gbps")
    peak, peak_source = pick(config_bandwidth.peak_gbps, "peak_gbps")
    if baseline is not None and peak is not None and peak < baseline:
        # Only when sources mix (config's cross-check rejects peak < baseline within the file itself).
        notes.append(f"peak {bytes_to_gbit(peak):g} Gbit/s ({peak_source}) is below baseline "
                     f"{bytes_to_gbit(baseline):g} Gbit/s ({baseline_source}); using the baseline as the peak")
        peak, peak_source = baseline, baseline_source

    bucket: Optional[float] = None
    bucket_source = "none"
    conf_bucket = config_bandwidth.burst_bucket_gbit
    if baseline is not None and peak is not None and peak <= baseline:
        if conf_bucket is not None:
            notes.append("instance.bandwidth.burst_bucket_gbit ignored: baseline equals peak, nothing bursts")
    elif conf_bucket is not None:
        bucket, bucket_source = gbit_to_bytes(conf_bucket), "config"
    elif fleet_bucket_bytes is not None and fleet_bucket_bytes > 0 and baseline is not None and peak is not None:
        bucket, bucket_source = float(fleet_bucket_bytes), "fleet"
    elif baseline is not None and peak is not None:
        bucket, bucket_source = baseline * DEFAULT_BUCKET_SECONDS, "default"

    entry = api_entry if api_entry is not None and api_entry.cards else catalogue_entry
    cards: tuple[CardBandwidth, ...] = ()
    cards_source = "none"
    if entry is not None and entry.cards:
        cards = tuple(CardBandwidth(c.index, _gbit(c.baseline_gbps), _gbit(c.peak_gbps)) for c in entry.cards)
        cards_source = "api" if entry is api_entry else "catalogue"
    return BandwidthProfile(instance_type, baseline, peak, bucket, baseline_source, peak_source,
                            bucket_source, cards, cards_source, tuple(notes))
