"""Traces for `burstwatch replay` as a true token bucket would shape them: 1-s samples at EC2's scale.

The true bucket (refilled at the baseline up to its size; sends at most the peak while it holds tokens, the
baseline once empty) is computed exactly between demand changes, like tests/support/credit_ec2.py's shaper,
and is free to differ from what the agent believes (`bucket` here vs the catalogue's default). Each sample
writes the bytes the bucket let through and, as ENA's bw_out_allowance_exceeded would, the packets it held
back: at the baseline once empty, at the peak when the demand is above it. The generator records the true
empty moments, which the replay's forecasts are measured against.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from tests.support.credit_ec2 import GBIT, Pieces, on_off, steady

MTU = 9001              # a VPC's jumbo frame: the shaped count is the held-back bytes in such packets
T0 = 1_700_000_000.0    # traces start here (Unix seconds)

__all__ = ["GBIT", "Phase", "Pieces", "Trace", "TrueBucket", "microbursts", "on_off", "steady", "write_trace"]


def microbursts(rate: float, burst: float, period: float) -> Pieces:
    """`burst` seconds at `rate` every `period` seconds: on_off with a short on."""
    return on_off(rate, burst, period - burst)


@dataclasses.dataclass
class TrueBucket:
    """The shaper the trace went through (bytes, bytes/s)."""

    baseline: float
    peak: float
    bucket: float
    tokens: float = -1.0

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.bucket

    def run(self, t: float, pieces: list[tuple[float, float]]) -> tuple[float, float, Optional[float]]:
        """Offer the pieces from `t`: (bytes sent, bytes held back, the moment the bucket emptied or None)."""
        b, sent, held, empty = self.baseline, 0.0, 0.0, None
        for h, offered in pieces:
            rate = min(offered, self.peak)
            held += (offered - rate) * h
            if rate <= b or self.tokens >= (rate - b) * h:
                self.tokens = min(self.bucket, self.tokens - (rate - b) * h)
                sent += rate * h
            else:
                te = self.tokens / (rate - b)
                if empty is None:
                    empty = t + te
                self.tokens = 0.0
                sent += rate * te + b * (h - te)
                held += (rate - b) * (h - te)
            t += h
        return sent, held, empty


@dataclasses.dataclass(frozen=True)
class Phase:
    """`seconds` of `demand`; `drain`: a drain the zoo measures (its start, and its true empty moment if any)."""

    name: str
    demand: Pieces
    seconds: float
    drain: bool = False


@dataclasses.dataclass
class Drain:
    name: str
    start: float
    stop: float
    empty: Optional[float]              # the true bucket's first empty moment within the drain


@dataclasses.dataclass
class Trace:
    """A scenario's phases through a true bucket, out direction; `in` carries a trickle."""

    bucket: TrueBucket
    phases: Sequence[Phase]
    drains: list[Drain] = dataclasses.field(default_factory=list)
    t0: float = T0
    # the true bucket's size during each phase (None: `bucket`'s throughout); the tokens never exceed it
    sizes: Optional[Sequence[float]] = None

    def rows(self) -> Iterator[tuple[float, float, float, int]]:
        """(timestamp, in_bytes, out_bytes, out_shaped) per second."""
        t = self.t0
        for k, ph in enumerate(self.phases):
            if self.sizes is not None:
                self.bucket.bucket = self.sizes[k]
                self.bucket.tokens = min(self.bucket.tokens, self.bucket.bucket)
            start, d = t, None
            if ph.drain:
                d = Drain(ph.name, t, t + ph.seconds, None)
                self.drains.append(d)
            for _ in range(int(round(ph.seconds))):
                sent, held, empty = self.bucket.run(t, ph.demand(t - start, t - start + 1.0))
                if d is not None and d.empty is None and empty is not None:
                    d.empty = empty
                t += 1.0
                yield t, 1e4, sent, int(math.ceil(held / MTU))


def write_trace(path: Path, trace: Trace, shaped: bool = True) -> Path:
    with path.open("w", encoding="utf-8") as f:
        f.write("timestamp,in_bytes,out_bytes,in_shaped,out_shaped\n" if shaped
                else "timestamp,in_bytes,out_bytes\n")
        for t, in_b, out_b, n in trace.rows():
            f.write(f"{t:.0f},{in_b:.0f},{out_b:.0f},0,{n}\n" if shaped else f"{t:.0f},{in_b:.0f},{out_b:.0f}\n")
    return path


def drain_until(baseline: float, rate: float, bucket: float) -> float:
    """Seconds a steady `rate` takes to empty a full `bucket` over `baseline`."""
    return bucket / (rate - baseline)


Scenario = Callable[[], Trace]
