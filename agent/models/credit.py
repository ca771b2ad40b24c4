"""The burst-credit token bucket per direction: estimate, forecast, learn (pure; no I/O)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

INF = math.inf


@dataclass(frozen=True)
class CreditReading:
    """One direction's credit figures after a sample; what exporters render (never recompute)."""

    direction: str                          # "in" | "out"
    rate_bytes_per_second: float            # measured rate the estimate uses
    remaining_bytes: Optional[float]        # None: no bucket (never exhausts) or profile unknown
    bucket_bytes: Optional[float]
    ratio: Optional[float]                  # remaining / bucket, 0..1
    exhaustion_seconds: float               # +Inf when not draining (or no bucket)
    refill_seconds: float                   # seconds to full at the current rate; +Inf when not refilling
    shaped: bool = False                    # shaping signal rose during the last interval
