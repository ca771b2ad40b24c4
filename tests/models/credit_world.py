"""A simulated shaper and sampler for the credit model's unit tests (pure: no I/O, no clock).

The shaper behaves like the lab's tbf (tests/support/credit_lab.py) and, as far as the field reports
show, like EC2's: a token bucket of `bucket` bytes refilled at the baseline, sending at most at the peak
rate while it holds tokens and at the baseline once empty. Traffic over what it may send waits in a short
queue (tail-dropped beyond it); a fine step that leaves packets waiting counts as shaped, which is what
ENA's bw_*_allowance_exceeded and tc's overlimits count. The sampler reads it like agent/sampling does:
bytes per sample, the rate over `rate_window`, and the shaping counter's increase.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from agent.models.credit_model import CreditEstimator, CreditReading

MBIT = 1e6 / 8


@dataclass
class Shaper:
    baseline: float                     # bytes per second
    peak: float
    bucket: float                       # bytes
    tokens: float = -1.0                # -1: full
    queue_seconds: float = 0.05         # queue limit, in seconds at the peak
    backlog: float = 0.0

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.bucket

    def step(self, dt: float, offered: float) -> tuple[float, bool]:
        """Offer `offered` bytes during `dt`; returns (bytes sent, shaped?)."""
        self.tokens = min(self.bucket, self.tokens + self.baseline * dt)
        self.backlog += offered
        sent = min(self.backlog, self.peak * dt, self.tokens)
        self.tokens -= sent
        self.backlog -= sent
        shaped = self.backlog > 1e-6
        self.backlog = min(self.backlog, self.peak * self.queue_seconds)
        return sent, shaped


# A demand is "bytes offered during [t, t + dt)".
Demand = Callable[[float, float], float]


def steady(rate: float) -> Demand:
    return lambda t, dt: rate * dt


def idle() -> Demand:
    return lambda t, dt: 0.0


def on_off(rate: float, on: float, off: float) -> Demand:
    """`rate` for `on` seconds, nothing for `off` seconds, repeating."""
    period = on + off
    return lambda t, dt: rate * dt if (t % period) < on - 1e-9 else 0.0


def microbursts(average: float, every: float = 0.05) -> Demand:
    """Line-rate chunks every `every` seconds averaging `average` bytes/s (a database flushing, a broker)."""
    def demand(t: float, dt: float) -> float:
        # one chunk at the start of each period
        k0, k1 = int(t / every + 1e-9), int((t + dt) / every + 1e-9)
        return average * every * (k1 - k0)
    return demand


@dataclass
class Sample:
    t: float                            # end of the sample
    reading: CreditReading
    true_remaining: float               # the shaper's tokens at the end of the sample
    sent: float                         # bytes during the sample


@dataclass
class World:
    """One direction of a shaper watched by a CreditEstimator, sample by sample (the other one idle)."""

    est: CreditEstimator
    shaper: Shaper
    direction: str = "out"
    sample_interval: float = 0.2
    rate_window: float = 0.6
    fine: float = 0.005
    shaping_source: bool = True
    t: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    empty_at: Optional[float] = None    # first moment the shaper's bucket ran dry (run_until_empty resets it)
    _window: deque = field(default_factory=deque)

    def run(self, demand: Demand, seconds: float, start: Optional[float] = None) -> list[Sample]:
        """Drive `demand` (its clock starts at `start`, default now) for `seconds`; the samples taken."""
        t_demand0 = self.t if start is None else start
        out = []
        steps = int(round(self.sample_interval / self.fine))
        for _ in range(int(round(seconds / self.sample_interval))):
            sent = 0.0
            shaped = 0
            for _ in range(steps):
                s, sh = self.shaper.step(self.fine, demand(self.t - t_demand0, self.fine))
                sent += s
                shaped += int(sh)
                self.t += self.fine
                if self.empty_at is None and self.shaper.tokens < self.shaper.baseline * self.fine:
                    self.empty_at = self.t
            self._window.append(sent)
            n = max(1, int(round(self.rate_window / self.sample_interval)))
            while len(self._window) > n:
                self._window.popleft()
            rate = sum(self._window) / (len(self._window) * self.sample_interval)
            d, other = self.direction, "in" if self.direction == "out" else "out"
            r = self.est.update(self.sample_interval, {d: sent, other: 0.0}, {d: rate, other: 0.0},
                                {d: shaped, other: 0} if self.shaping_source else None)[d]
            smp = Sample(self.t, r, self.shaper.tokens, sent)
            self.samples.append(smp)
            out.append(smp)
        return out

    def run_until_empty(self, demand: Demand, limit: float) -> tuple[list[Sample], float]:
        """Drive `demand` from now until the shaper's bucket is empty (at fine resolution), then to the end
        of that sample; (samples, the empty moment)."""
        out: list[Sample] = []
        t0 = self.t
        self.empty_at = None
        while self.empty_at is None:
            if self.t - t0 >= limit:
                raise AssertionError(f"the shaper did not empty within {limit} s")
            out += self.run(demand, self.sample_interval, start=t0)
        return out, self.empty_at
