"""The bandwidth profile the credit model measures against: baseline, peak, bucket, and their sources."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

GBIT = 1e9 / 8  # bytes in one Gbit (AWS quotes decimal Gbit/s)

# Where a figure came from, most trusted first; exported as a label so every figure can be traced.
SOURCES = ("config", "learned", "api", "catalogue", "default", "none")


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

    @property
    def bursts(self) -> bool:
        """True when the size has a burst bucket to watch."""
        return (self.baseline_bytes_per_second is not None and self.peak_bytes_per_second is not None
                and self.peak_bytes_per_second > self.baseline_bytes_per_second
                and self.bucket_bytes is not None and self.bucket_bytes > 0)
