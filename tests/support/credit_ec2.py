"""The pure credit model driven at EC2's own scale: 1-s samples, r4 figures, every default untouched.

A token-bucket shaper as the field write-ups describe EC2's (seed 000: r4.large 0.75/10 Gbit/s and a
~2700 Gbit bucket; r4.2xlarge 2.5/10 Gbit/s, ~8925 Gbit), computed exactly between demand changes (no fine
time step, so hours of simulated traffic cost a second or two), sampled once a second like the daemon:
bytes per sample, the rate over the default 1-s `rate_window`, and the shaping signal. The model is a
`CreditEstimator` with its defaults (`forecast_window` 60 s). Deterministic: a test can regenerate the
figures of docs/credits.md and compare.

Each drain is measured against the shaper's own empty moment: the share of trend forecasts from the first
fifth of the drain to the empty moment within max(60 s, 20 %) of it, and when `BurstCreditsRunningOut` would
first fire (the rule's expression evaluated per sample: the sooner of the two forecasts under the 600-s
horizon, not exhausted, held for its `for: 1m`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import statistics
from typing import Callable, Iterator, Optional

from agent.models import credit_trend as cm
from agent.models.credit_model import CreditEstimator, CreditReading

GBIT = 1e9 / 8
HORIZON = 600.0             # BurstCreditsRunningOut's "< 600"
FOR_SECONDS = 60.0          # and its `for: 1m`
TOLERANCE = (60.0, 0.20)    # max(60 s, 20 % of the time left)
FIRST_FIFTH = 0.2
SAMPLE = 1.0
ALERT_LEAD = 60.0           # the alert's target: at least this long before empty


@dataclasses.dataclass(frozen=True)
class Size:
    name: str
    baseline: float         # bytes/s
    peak: float
    bucket: float           # bytes


SIZES = (Size("r4.large", 0.75 * GBIT, 10 * GBIT, 2700 * GBIT),
         Size("r4.2xlarge", 2.5 * GBIT, 10 * GBIT, 8925 * GBIT))


# -- demands: offered rate (bytes/s) as pieces of constant rate ----------------------------------------------

Pieces = Callable[[float, float], list[tuple[float, float]]]     # (t0, t1) -> [(seconds, rate), ...]


def steady(rate: float) -> Pieces:
    return lambda t0, t1: [(t1 - t0, rate)]


def on_off(rate: float, on: float, off: float) -> Pieces:
    """`rate` for `on` seconds, then nothing for `off` seconds, repeating from t = 0."""
    period = on + off

    def pieces(t0: float, t1: float) -> list[tuple[float, float]]:
        out = []
        t = t0
        while t < t1 - 1e-12:
            k = math.floor(t / period + 1e-12)
            phase = t - k * period
            if phase < on - 1e-12:
                end, r = k * period + on, rate
            else:
                end, r = (k + 1) * period, 0.0
            end = min(end, t1)
            out.append((end - t, r))
            t = end
        return out
    return pieces


def ramp(r0: float, r1: float, seconds: float, step: float = 0.25) -> Pieces:
    """From r0 to r1 over `seconds` (in `step`-s stairs), then r1."""
    def pieces(t0: float, t1: float) -> list[tuple[float, float]]:
        out = []
        t = t0
        while t < t1 - 1e-12:
            end = min(t1, (math.floor(t / step + 1e-12) + 1) * step)
            mid = (t + end) / 2
            out.append((end - t, r0 + (r1 - r0) * min(1.0, mid / seconds)))
            t = end
        return out
    return pieces


@dataclasses.dataclass
class Shaper:
    """Tokens refilled at the baseline up to the bucket; sends at most the peak while it holds tokens and
    the baseline once empty."""

    size: Size
    tokens: float = -1.0
    empty_at: Optional[float] = None

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.size.bucket

    def run(self, t: float, pieces: list[tuple[float, float]]) -> tuple[float, bool]:
        """Offer the pieces from time `t`; (bytes sent, shaped at the baseline)."""
        b, sent, shaped = self.size.baseline, 0.0, False
        for h, offered in pieces:
            rate = min(offered, self.size.peak)
            if rate <= b or self.tokens >= (rate - b) * h:
                self.tokens = min(self.size.bucket, self.tokens - (rate - b) * h)
                sent += rate * h
            else:
                te = self.tokens / (rate - b)
                if self.empty_at is None:
                    self.empty_at = t + te
                self.tokens = 0.0
                sent += rate * te + b * (h - te)
                shaped = True
            t += h
        return sent, shaped


@dataclasses.dataclass
class Sample:
    t: float
    reading: CreditReading
    tokens: float


@dataclasses.dataclass
class World:
    """The shaper (`out`) watched by a CreditEstimator with its defaults, one sample a second."""

    size: Size
    est: CreditEstimator = dataclasses.field(init=False)
    shaper: Shaper = dataclasses.field(init=False)
    t: float = 0.0
    sent_total: float = 0.0

    def __post_init__(self) -> None:
        self.est = CreditEstimator(self.size.baseline, self.size.bucket)
        self.shaper = Shaper(self.size)

    def sample(self, demand: Pieces, t_demand0: float) -> Sample:
        sent, shaped = self.shaper.run(self.t, demand(self.t - t_demand0, self.t - t_demand0 + SAMPLE))
        self.t += SAMPLE
        self.sent_total += sent
        r = self.est.update(SAMPLE, {"out": sent, "in": 0.0}, {"out": sent / SAMPLE, "in": 0.0},
                            {"out": int(shaped), "in": 0})["out"]
        return Sample(self.t, r, self.shaper.tokens)

    def run(self, demand: Pieces, seconds: float) -> list[Sample]:
        t0 = self.t
        return [self.sample(demand, t0) for _ in range(int(round(seconds / SAMPLE)))]

    def run_until_empty(self, demand: Pieces, limit: float = 36_000.0,
                        after: float = 0.0) -> tuple[list[Sample], float]:
        """Drive `demand` until the shaper empties, then `after` seconds more; (samples, empty moment)."""
        t0 = self.t
        self.shaper.empty_at = None
        out = []
        while self.shaper.empty_at is None:
            if self.t - t0 > limit:
                raise AssertionError(f"no empty bucket within {limit} s")
            out.append(self.sample(demand, t0))
        for _ in range(int(after / SAMPLE)):
            out.append(self.sample(demand, t0))
        assert self.shaper.empty_at is not None
        return out, self.shaper.empty_at


@dataclasses.dataclass
class Saver:
    """The daemon's save rule (agent/sampling/credits.py): on 1 % of the bucket of movement, else every 5 s."""

    world: World
    saved: Optional[dict] = None
    at: float = -math.inf
    bytes_at: float = 0.0

    def after_sample(self) -> None:
        est = self.world.est
        if self.saved is None or est.movement(self.saved) >= 0.01 or self.world.t - self.at >= 5.0:
            self.saved = json.loads(json.dumps(est.to_state()))
            self.at, self.bytes_at = self.world.t, self.world.sent_total


# -- one drain's figures ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Result:
    size: str
    shape: str
    drain: Optional[float] = None           # seconds from the drain's start to empty (None: never)
    samples: int = 0
    trend_hit: Optional[float] = None       # share within tolerance from the first fifth to empty
    inst_hit: Optional[float] = None
    trend_err: Optional[float] = None       # median signed error (s)
    alert_lead: Optional[float] = None      # BurstCreditsRunningOut first fired this long before empty
    false_alarms: int = 0                   # firing episodes on traffic that never empties
    restart_hit: Optional[float] = None     # after a restart: share within tolerance from its first sample
    restart_first_err: Optional[float] = None
    restart_first_ok: bool = False          # the restart's first trend forecast within the tolerance

    def row(self) -> str:
        def pct(v: Optional[float]) -> str:
            return "-" if v is None else f"{100 * v:.0f} %"

        drain = "never" if self.drain is None else f"{self.drain:.0f} s"
        if self.drain is None:
            alert = f"none ({self.false_alarms} false)" if self.false_alarms else "none"
        else:
            alert = "never fired" if self.alert_lead is None else f"{self.alert_lead:.0f} s"
        err = "-" if self.trend_err is None else f"{self.trend_err:+.0f} s"
        extra = ""
        if self.restart_hit is not None:
            extra = f"; after the restart {pct(self.restart_hit)}, first {self.restart_first_err:+.0f} s"
        return (f"| {self.size} | {self.shape} | {drain} | {pct(self.trend_hit)} | {err} | {pct(self.inst_hit)} "
                f"| {alert}{extra} |")


HEADER = ("| size | traffic | drain | trend within max(60 s, 20 %) | its median error | instant within | "
          "alert before empty |\n|---|---|---|---|---|---|---|")


def within(s: Sample, forecast: float, empty: float) -> bool:
    lo, frac = TOLERANCE
    return abs(s.t + forecast - empty) <= max(lo, frac * (empty - s.t))


def alert_times(samples: list[Sample]) -> list[float]:
    """The sample times at which BurstCreditsRunningOut fires: the sooner of the forecasts under the
    horizon and not exhausted, held for FOR_SECONDS (one evaluation per sample)."""
    out, since = [], None
    for s in samples:
        r = s.reading
        value = r.exhaustion_seconds if r.exhaustion_seconds <= r.exhaustion_trend_seconds \
            else r.exhaustion_trend_seconds
        if value < HORIZON and not r.exhausted:
            since = s.t if since is None else since
            if s.t - since >= FOR_SECONDS:
                out.append(s.t)
        else:
            since = None
    return out


def judge(res: Result, samples: list[Sample], start: float, empty: Optional[float]) -> Result:
    fires = alert_times(samples)
    if empty is None:
        res.false_alarms = 1 + sum(1 for a, b in zip(fires, fires[1:]) if b - a > SAMPLE + 1e-6) if fires else 0
        return res
    res.drain = empty - start
    sel = [s for s in samples if start + FIRST_FIFTH * res.drain <= s.t <= empty]
    res.samples = len(sel)
    if sel:
        res.trend_hit = sum(within(s, s.reading.exhaustion_trend_seconds, empty) for s in sel) / len(sel)
        res.inst_hit = sum(within(s, s.reading.exhaustion_seconds, empty) for s in sel) / len(sel)
        errs = [s.t + s.reading.exhaustion_trend_seconds - empty for s in sel]
        finite = [e for e in errs if math.isfinite(e)]
        res.trend_err = statistics.median(finite) if finite else math.inf
    before = [t for t in fires if start <= t <= empty]
    res.alert_lead = empty - before[0] if before else None
    return res


# -- the shapes ---------------------------------------------------------------------------------------------

IDLE_FIRST = 600.0          # a full, idle bucket before every drain: the history a real instance has


def drain(size: Size, demand: Pieces, label: str) -> Result:
    w = World(size)
    w.run(steady(0.0), IDLE_FIRST)
    start = w.t
    samples, empty = w.run_until_empty(demand, after=30.0)
    return judge(Result(size.name, label), samples, start, empty)


def cycle(size: Size, period: float, duty: float) -> Result:
    return drain(size, on_off(size.peak, duty * period, (1 - duty) * period),
                 f"{duty * period:g} s at peak / {(1 - duty) * period:g} s idle")


def refilled(size: Size, idle: float) -> Result:
    """Full speed to empty, idle `idle` s (a partly refilled bucket), then full speed to empty again."""
    w = World(size)
    w.run(steady(0.0), IDLE_FIRST)
    w.run_until_empty(steady(size.peak), after=60.0)
    w.run(steady(0.0), idle)
    start = w.t
    share = w.shaper.tokens / size.bucket
    samples, empty = w.run_until_empty(steady(size.peak), after=30.0)
    return judge(Result(size.name, f"full speed after {idle:g} s idle ({100 * share:.0f} % refilled)"),
                 samples, start, empty)


def slow_ramp(size: Size, r0: float = 0.5, r1: float = 3.0, seconds: float = 3600.0) -> Result:
    w = World(size)
    w.run(steady(0.0), IDLE_FIRST)
    t0 = w.t
    samples, empty = w.run_until_empty(ramp(r0 * size.baseline, r1 * size.baseline, seconds), after=30.0)
    start = t0 + seconds * (1 - r0) / (r1 - r0)          # where the demand crosses the baseline
    return judge(Result(size.name, f"ramp {r0:g}-{r1:g} x baseline over {seconds:g} s"), samples, start, empty)


def under_baseline(size: Size, period: float, average: float, seconds: float = 7200.0) -> Result:
    """On/off at the peak averaging `average` x the baseline: never empties, must never page."""
    duty = average * size.baseline / size.peak
    w = World(size)
    samples = w.run(on_off(size.peak, duty * period, (1 - duty) * period), seconds)
    assert w.shaper.empty_at is None
    return judge(Result(size.name, f"{duty * period:g} s at peak / {(1 - duty) * period:g} s idle "
                                   f"({average:g} x baseline)"), samples, 0.0, None)


def restart_drain(size: Size, period: float, duty: float, at: float = 0.5, down: float = 10.0) -> Result:
    """An on/off drain with a SIGKILL `at` of the way through and a restart `down` s later: the trend from
    the restart's first sample (the state as last saved, the gap's bytes from the counters)."""
    demand = on_off(size.peak, duty * period, (1 - duty) * period)
    first = cycle(size, period, duty)                   # where it empties undisturbed
    assert first.drain is not None
    w = World(size)
    saver = Saver(w)
    w.run(steady(0.0), IDLE_FIRST)
    start = w.t
    samples = []
    while w.t - start < at * first.drain:
        samples.append(w.sample(demand, start))
        saver.after_sample()
    assert saver.saved is not None
    # down: the shaper goes on, the model sees nothing; the counters keep counting
    for _ in range(int(down / SAMPLE)):
        sent, _ = w.shaper.run(w.t, demand(w.t - start, w.t - start + SAMPLE))
        w.sent_total += sent
        w.t += SAMPLE
    assert w.shaper.empty_at is None, "the drain ended while the agent was down"
    est = CreditEstimator(size.baseline, size.bucket)
    est.restore(saver.saved)
    est.account_gap(w.t - saver.at, {"out": w.sent_total - saver.bytes_at, "in": 0.0}, size.peak)
    w.est = est
    after, empty = w.run_until_empty(demand, after=30.0)
    res = judge(Result(size.name, f"{duty * period:g}/{(1 - duty) * period:g} s, SIGKILL mid-drain, "
                                  f"{down:g} s down"), samples + after, start, empty)
    if after:
        res.restart_hit = sum(within(s, s.reading.exhaustion_trend_seconds, empty) for s in after) / len(after)
        res.restart_first_err = after[0].t + after[0].reading.exhaustion_trend_seconds - empty
        res.restart_first_ok = within(after[0], after[0].reading.exhaustion_trend_seconds, empty)
    return res



# -- the grid of `make bench BENCH=ec2` and its table in docs/credits.md -----------------------------------

PERIODS = (2.0, 10.0, 30.0, 60.0, 120.0, 200.0, 300.0)
DUTIES = {"r4.large": (0.25, 0.5, 0.75), "r4.2xlarge": (0.4, 0.6, 0.8)}
HIT_TARGET = 0.8


@contextlib.contextmanager
def fixed_window() -> Iterator[None]:
    """The trend as it was before the window rule: a fixed forecast_window, the line and its excursion alone, and no
    history across a restart."""
    saved = cm.CYCLES_PER_WINDOW, cm.CYCLE_REPLAY, cm.TrendForecast.restore
    cm.CYCLES_PER_WINDOW, cm.CYCLE_REPLAY = 0.0, False
    cm.TrendForecast.restore = lambda self, *a, **kw: False    # type: ignore[method-assign]
    try:
        yield
    finally:
        cm.CYCLES_PER_WINDOW, cm.CYCLE_REPLAY, cm.TrendForecast.restore = saved   # type: ignore[method-assign]


def shapes(size: Size) -> list[Callable[[], Result]]:
    """Every shape at one size, as thunks (run twice: with the window rule and without)."""
    out: list[Callable[[], Result]] = [
        lambda: drain(size, steady(size.peak), "full speed"),
        lambda: drain(size, steady(2 * size.baseline), "steady 2 x baseline")]
    out += [functools.partial(cycle, size, p, d) for p in PERIODS for d in DUTIES[size.name]]
    out += [lambda: slow_ramp(size), lambda: refilled(size, 1800.0),
            functools.partial(restart_drain, size, 60.0, 0.5), functools.partial(restart_drain, size, 120.0, 0.5)]
    out += [functools.partial(under_baseline, size, p, a) for p in (10.0, 60.0, 300.0) for a in (0.5, 0.9)]
    return out


def grid() -> list[tuple[Result, Result]]:
    """(with the window rule, with a fixed 60-s window) for every shape at both sizes (~15 s of CPU)."""
    out = []
    for size in SIZES:
        for thunk in shapes(size):
            now = thunk()
            with fixed_window():
                out.append((now, thunk()))
    return out


def table(rows: list[tuple[Result, Result]]) -> str:
    """The Markdown table of docs/credits.md's generated region."""
    def pct(v: Optional[float]) -> str:
        return "-" if v is None else f"{100 * v:.0f} %"

    lines = ["| size | traffic (from a full, idle bucket) | drain | trend within max(60 s, 20 %): fixed 60 s → now "
             "| median error now | instant within | alert before empty: fixed → now |",
             "|---|---|---|---|---|---|---|"]
    for now, old in rows:
        drain = "never" if now.drain is None else f"{now.drain:.0f} s"
        if now.drain is None:
            alert = f"{old.false_alarms} → {now.false_alarms} false alarms"
        else:
            alert = " → ".join("never" if r.alert_lead is None else f"{r.alert_lead:.0f} s" for r in (old, now))
        hit = f"{pct(old.trend_hit)} → **{pct(now.trend_hit)}**" if now.trend_hit is not None else "-"
        if now.restart_hit is not None:
            hit += (f"; from the restart's first sample {pct(old.restart_hit)} → **{pct(now.restart_hit)}** "
                    f"(first error {now.restart_first_err:+.0f} s)")
        err = "-" if now.trend_err is None else f"{now.trend_err:+.0f} s"
        lines.append(f"| {now.size} | {now.shape} | {drain} | {hit} | {err} | {pct(now.inst_hit)} | {alert} |")
    return "\n".join(lines)


def is_cycle(r: Result) -> bool:
    return "idle" in r.shape and "refilled" not in r.shape and "baseline)" not in r.shape


def checks(rows: list[tuple[Result, Result]]) -> list[tuple[str, bool, str]]:
    """The EC2-scale targets judged on the grid: (target, met, the shapes that miss it)."""
    now = [r for r, _ in rows]
    cycles = [r for r in now if is_cycle(r)]
    short = [f"{r.size} {r.shape} {100 * (r.trend_hit or 0):.0f} %" for r in cycles
             if (r.trend_hit or 0) < HIT_TARGET]
    late = [f"{r.size} {r.shape}" for r in now if r.drain is not None
            and (r.alert_lead is None or r.alert_lead < ALERT_LEAD)]
    false = [f"{r.size} {r.shape}" for r in now if r.drain is None and r.false_alarms]
    restart = [f"{r.size} {r.shape} {100 * (r.restart_hit or 0):.0f} %" for r in now
               if r.restart_hit is not None and (r.restart_hit < HIT_TARGET or not r.restart_first_ok)]
    return [("on/off cycles 2-300 s: trend within max(60 s, 20 %) in >= 80 % of samples after the first fifth",
             not short, "; ".join(short)),
            ("BurstCreditsRunningOut fires >= 60 s before empty on every drain", not late, "; ".join(late)),
            ("and never on traffic that averages under the baseline", not false, "; ".join(false)),
            ("after a SIGKILL mid-drain, the trend within tolerance from the first sample", not restart,
             "; ".join(restart))]


def region(rows: list[tuple[Result, Result]]) -> str:
    """docs/credits.md's generated region: the table and the targets judged on it."""
    lines = [table(rows), ""]
    for what, ok, misses in checks(rows):
        missed = f" (missed by: {misses})" if misses else ""
        lines.append(f"- target {'met' if ok else '**missed**'}: {what}{missed}")
    return "\n".join(lines)
