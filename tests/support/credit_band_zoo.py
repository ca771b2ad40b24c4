"""The credit band's zoo at EC2's scale (issue 28): the pure model against true buckets other than its belief.

Built on tests/support/credit_ec2.py's exact token-bucket shaper and 1-s sampler, with the shaper's bucket
set apart from the model's belief (0.3x to 2x of it, also after the model has seen two exhaustions). Per
drain: the share of samples from its start to its empty moment whose [earliest, latest] holds the true time
left; when BurstCreditsRunningOut (packaging/prometheus/burstwatch.rules.yml) first fires, its expression
evaluated every 15 s as Prometheus would, `for: 1m` included; the band's median width (latest / earliest).
Traffic that averages at or under the baseline, and drains that stop before the bucket empties, count pages.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Callable, Optional

from agent.models.credit_model import CreditReading
from agent.models.replay import (
    LOW_FOR,
    RUNNING_OUT_FOR,
    AlertRule,
    credits_low,
    running_out,
    running_out_point,
)
from tests.support import credit_ec2 as ce

SCRAPE = 15.0                # Prometheus' evaluation interval
COVERAGE_TARGET = 0.9
POINT_TARGET = 0.8
LEAD_TARGET = 60.0           # when the drain lasts LONG_DRAIN or more
LONG_DRAIN = 180.0
GBIT = ce.GBIT


def rule_fires(samples: list[ce.Sample], holds: Callable[[CreditReading], bool], hold: float) -> list[float]:
    """The evaluation times at which an alert whose expression `holds` and whose `for:` is `hold` is firing:
    evaluated every SCRAPE seconds on the newest sample (a scrape), by agent/models/replay.py's AlertRule (the
    Python form of the shipped rules the replay counts pages with)."""
    out: list[float] = []
    if not samples:
        return out
    rule = AlertRule("", hold)
    k, t = 0, samples[0].t
    while t <= samples[-1].t + 1e-9:
        while k + 1 < len(samples) and samples[k + 1].t <= t + 1e-9:
            k += 1
        rule.observe(t, holds(samples[k].reading))
        if rule.firing:
            out.append(t)
        t += SCRAPE
    return out


def episodes(times: list[float]) -> int:
    return (1 + sum(1 for a, b in zip(times, times[1:]) if b - a > SCRAPE + 1e-6)) if times else 0


@dataclasses.dataclass
class Drain:
    size: str
    shape: str
    factor: float                       # the true bucket / the model's belief
    learned: bool = False
    drain: Optional[float] = None       # seconds from start to empty; None: stopped before empty
    coverage: Optional[float] = None
    point: Optional[float] = None       # trend within max(60 s, 20 %) after the second onset (factor 1 only)
    lead: Optional[float] = None        # BurstCreditsRunningOut's first firing before empty
    pages: int = 0                      # its firing episodes (on traffic that never empties: false pages)
    low_pages: int = 0                  # BurstCreditsLow's
    width: Optional[float] = None       # median latest / earliest over the finite, positive samples
    lead_point: Optional[float] = None  # the rule before the band: its first firing before empty
    pages_point: int = 0                # and its firing episodes

    def ok(self) -> bool:
        if self.drain is None:
            return True
        need = LEAD_TARGET if self.drain >= LONG_DRAIN else 0.0
        return (self.coverage is not None and self.coverage >= COVERAGE_TARGET and self.lead is not None
                and self.lead > need and (self.point is None or self.point >= POINT_TARGET))

    def row(self) -> str:
        def pct(v: Optional[float]) -> str:
            return "-" if v is None else f"{100 * v:.0f} %"

        drain = "never" if self.drain is None else f"{self.drain:.0f} s"
        lead = "-" if self.drain is None else ("never" if self.lead is None else f"{self.lead:.0f} s")
        width = "-" if self.width is None else ("inf" if math.isinf(self.width) else f"{self.width:.2f}")
        before = "-" if self.drain is None else \
            ("never" if self.lead_point is None else f"{self.lead_point:.0f} s")
        return (f"| {self.size} | {self.shape} | {self.factor:g}x{' (learned)' if self.learned else ''} | {drain} | "
                f"{pct(self.coverage)} | {pct(self.point)} | {lead} ({before}) | {self.pages} "
                f"({self.pages_point}) | {width} |")


HEADER = ("| size | traffic | true bucket / belief | drain | in [earliest, latest] | point after 2nd onset | "
          "page before empty (before the band) | pages (before the band) | width latest/earliest |\n"
          "|---|---|---|---|---|---|---|---|---|")


def _world(size: ce.Size, factor: float) -> ce.World:
    w = ce.World(size)
    w.shaper = ce.Shaper(dataclasses.replace(size, bucket=factor * size.bucket))
    return w


def _onsets(demand: ce.Pieces, seconds: float) -> list[float]:
    """The demand's burst onsets (a rise from idle to on) from its start."""
    out, prev, t = [], 0.0, 0.0
    while t < seconds:
        pieces = demand(t, t + 1.0)
        for h, r in pieces:
            if r > 0 and prev <= 0:
                out.append(t)
            prev = r
            t += h
    return out


def judge(d: Drain, samples: list[ce.Sample], start: float, empty: Optional[float],
          onsets: Optional[list[float]] = None) -> Drain:
    fires = rule_fires(samples, running_out, RUNNING_OUT_FOR)
    d.pages = episodes(fires)
    point_fires = rule_fires(samples, running_out_point, RUNNING_OUT_FOR)
    d.pages_point = episodes(point_fires)
    d.low_pages = episodes(rule_fires(samples, credits_low, LOW_FOR))
    if empty is None:
        return d
    d.drain = empty - start
    sel = [s for s in samples if start <= s.t <= empty]
    slack = ce.SAMPLE
    d.coverage = sum(s.reading.exhaustion_earliest_seconds - slack <= empty - s.t
                     <= s.reading.exhaustion_latest_seconds + slack for s in sel) / max(1, len(sel))
    widths = [s.reading.exhaustion_latest_seconds / s.reading.exhaustion_earliest_seconds for s in sel
              if s.reading.exhaustion_earliest_seconds > 0 and math.isfinite(s.reading.exhaustion_earliest_seconds)]
    d.width = statistics.median(widths) if widths else None
    before = [t for t in fires if start <= t <= empty]
    d.lead = empty - before[0] if before else None
    before = [t for t in point_fires if start <= t <= empty]
    d.lead_point = empty - before[0] if before else None
    if d.factor == 1.0 and not d.learned:
        second = start + onsets[1] if onsets is not None and len(onsets) > 1 else start
        after = [s for s in sel if s.t >= second]
        if after:
            d.point = sum(ce.within(s, s.reading.exhaustion_trend_seconds, empty) for s in after) / len(after)
    return d


def drain(size: ce.Size, demand: ce.Pieces, label: str, factor: float, cyclic: bool = False) -> Drain:
    w = _world(size, factor)
    w.run(ce.steady(0.0), ce.IDLE_FIRST)
    start = w.t
    samples, empty = w.run_until_empty(demand, after=30.0)
    onsets = _onsets(demand, empty - start + 1.0) if cyclic else None
    return judge(Drain(size.name, label, factor), samples, start, empty, onsets)


def learned_then(size: ce.Size, demand: ce.Pieces, label: str, factor: float = 0.5) -> Drain:
    """Two full-speed drains of a bucket the size of the belief (two observations: the band narrows around
    it), a full refill, then `demand` on a true bucket of `factor` x it."""
    w = _world(size, 1.0)
    w.run(ce.steady(0.0), ce.IDLE_FIRST)
    for _ in range(2):
        w.run_until_empty(ce.steady(size.peak), after=30.0)
        w.run(ce.steady(0.0), size.bucket / size.baseline + 120.0)
    assert w.est.buckets["out"].sizes.observations, "the model saw no exhaustion"
    w.shaper = ce.Shaper(dataclasses.replace(size, bucket=factor * size.bucket))
    start = w.t
    samples, empty = w.run_until_empty(demand, after=30.0)
    return judge(Drain(size.name, label, factor, learned=True), samples, start, empty)


def stopped(size: ce.Size, seconds: float, factor: float = 1.0) -> Drain:
    """Full speed for `seconds`, then idle: a drain that stops before the bucket is empty."""
    w = _world(size, factor)
    w.run(ce.steady(0.0), ce.IDLE_FIRST)
    samples = w.run(ce.steady(size.peak), seconds) + w.run(ce.steady(0.0), 900.0)
    assert w.shaper.empty_at is None
    return judge(Drain(size.name, f"full speed {seconds:g} s, then idle", factor), samples, 0.0, None)


def quiet(size: ce.Size, demand: ce.Pieces, label: str, seconds: float = 3600.0) -> Drain:
    """Traffic averaging at or under the baseline: never empties, must never page."""
    w = _world(size, 1.0)
    samples = w.run(demand, seconds)
    assert w.shaper.empty_at is None
    return judge(Drain(size.name, label, 1.0), samples, 0.0, None)


def microbursts(rate_average: float, every: float = 0.1, peak: float = 10 * GBIT) -> ce.Pieces:
    """Chunks at the peak every `every` seconds (a divisor of the 1-s sample) averaging `rate_average`."""
    on = every * rate_average / peak

    def pieces(t0: float, t1: float) -> list[tuple[float, float]]:
        return [(on, peak), (every - on, 0.0)] * int(round((t1 - t0) / every))
    return pieces


FACTORS = (0.3, 0.6, 1.0, 2.0)
STEADY_GBPS = (1.5, 3.0, 6.0, 10.0)
CYCLES = ((2.0, 0.5), (10.0, 0.5), (30.0, 0.5), (60.0, 0.5), (120.0, 0.5), (200.0, 0.5), (300.0, 0.5),
          (300.0, 0.75), (120.0, 0.25))


def shapes(size: ce.Size, short: bool = False) -> list[Callable[[], Drain]]:
    """Every shape at one size as thunks; `short`: a few per kind (make test)."""
    out: list[Callable[[], Drain]] = []
    factors = (0.3, 1.0, 2.0) if short else FACTORS
    steadies = (1.5, 10.0) if short else STEADY_GBPS
    cycles = ((120.0, 0.5), (300.0, 0.5)) if short else CYCLES
    for f in factors:
        for g in steadies:
            rate = g * GBIT
            if rate > size.baseline * 1.2:
                out.append(lambda f=f, g=g, rate=rate: drain(size, ce.steady(rate), f"steady {g:g} Gbit/s", f))
        for p, duty in cycles:
            if duty * size.peak <= 1.2 * size.baseline:
                continue            # averages at about the baseline: never empties (the quiet shapes below)
            out.append(lambda f=f, p=p, duty=duty: drain(
                size, ce.on_off(size.peak, duty * p, (1 - duty) * p),
                f"{duty * p:g} s at peak / {(1 - duty) * p:g} s idle", f, cyclic=True))
        out.append(lambda f=f: drain(size, microbursts(3 * size.baseline), "microbursts averaging 3 x baseline", f))
    out.append(lambda: learned_then(size, ce.steady(size.peak), "full speed, after two drains of the belief"))
    if not short:
        out.append(lambda: learned_then(size, ce.steady(3 * size.baseline),
                                        "steady 3 x baseline, after two drains of the belief"))
    for secs in ((60.0, 180.0) if short else (30.0, 60.0, 120.0, 180.0, 240.0)):
        out.append(lambda secs=secs: stopped(size, secs))
    for p, avg in (((60.0, 0.9),) if short else ((10.0, 0.5), (60.0, 0.9), (300.0, 0.9), (300.0, 1.0))):
        duty = avg * size.baseline / size.peak
        out.append(lambda p=p, duty=duty, avg=avg: quiet(size, ce.on_off(size.peak, duty * p, (1 - duty) * p),
                                                          f"{duty * p:.3g} s at peak / {(1 - duty) * p:.3g} s idle "
                                                          f"({avg:g} x baseline)"))
    out.append(lambda: quiet(size, ce.steady(size.baseline), "steady at the baseline"))
    if not short:
        out.append(lambda: quiet(size, microbursts(0.9 * size.baseline), "microbursts averaging 0.9 x baseline"))
    return out


def zoo(short: bool = False, sizes: tuple[ce.Size, ...] = ce.SIZES) -> list[Drain]:
    return [thunk() for size in sizes for thunk in shapes(size, short)]


def summary(rows: list[Drain]) -> list[str]:
    drains = [r for r in rows if r.drain is not None]
    stops = [r for r in rows if "then idle" in r.shape]
    quiet_rows = [r for r in rows if r.drain is None and "then idle" not in r.shape]
    cov = [r.coverage for r in drains if r.coverage is not None]
    pts = [r.point for r in drains if r.point is not None]
    leads = [r.lead for r in drains if r.lead is not None]
    widths = [r.width for r in drains if r.width is not None and math.isfinite(r.width)]
    return [
        f"drains {len(drains)}: coverage >= 90 % in {sum(c >= COVERAGE_TARGET for c in cov)}/{len(cov)} "
        f"(min {100 * min(cov):.0f} %)" if cov else "no drains",
        f"point forecast >= 80 % after the second onset in {sum(p >= POINT_TARGET for p in pts)}/{len(pts)} "
        f"(min {100 * min(pts):.0f} %)" if pts else "no point figures",
        f"paged before empty {len(leads)}/{len(drains)}; lead min {min(leads):.0f} s, median "
        f"{statistics.median(leads):.0f} s" if leads else "no pages",
        f"band width latest/earliest median {statistics.median(widths):.2f}" if widths else "no widths",
        f"pages on drains that stopped before empty: {sum(r.pages for r in stops)} in {len(stops)} drains "
        f"(the point rule before the band: {sum(r.pages_point for r in stops)}); "
        f"BurstCreditsLow {sum(r.low_pages for r in stops)}",
        f"the point rule before the band paged before empty on {sum(r.lead_point is not None for r in drains)}"
        f"/{len(drains)} drains, >= 60 s ahead on {sum((r.lead_point or 0) >= LEAD_TARGET for r in drains)}",
        f"pages on traffic at or under the baseline: {sum(r.pages + r.low_pages for r in quiet_rows)}",
    ]


if __name__ == "__main__":
    import sys

    print(HEADER)
    rows = []
    for size in ce.SIZES:
        for thunk in shapes(size, short="--short" in sys.argv):
            rows.append(thunk())
            print(rows[-1].row() + ("" if rows[-1].ok() else " **miss**"), flush=True)
    print()
    print("\n".join(summary(rows)))
