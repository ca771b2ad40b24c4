"""The traffic zoo at EC2's scale through `burstwatch replay --openmetrics`, with the shipped rules evaluated by
a real Prometheus (docs/replay.md, "The zoo through replay").

Each case is a 1-s trace that a true token bucket shaped (tests/support/replay_traces.py): r4.large (0.75/10
Gbit/s, believed bucket 2700 Gbit, one hour of baseline) or r4.2xlarge (2.5/10, 9000 Gbit), the true bucket
0.3x to 2x of the belief, steady drains 1.5 to 10 Gbit/s, on/off cycles 2 to 300 s, microbursts, traffic
that averages under the baseline, and drains after the agent has learned a bucket. Every case is replayed
with `burstwatch replay TRACE --type SIZE --openmetrics FILE` (in-process through agent.cli.main), all files
are backfilled with `promtool tsdb create-blocks-from openmetrics` into one data directory (each case at its
own time, days apart), and one Prometheus on loopback serves them. The shipped `BurstCreditsRunningOut`
expression (read from packaging/prometheus/burstwatch.rules.yml) is queried with query_range at 15-s steps
(a 15-s rule evaluation) and its `for:` applied to the result (tests/support/prom_backfill.py alert_fires):
a rule file itself never evaluates the past.

The forecasts' accuracy is read from the replay's own OpenMetrics file, every 1-s sample: the figures
/metrics would have shown, the band's families (burstwatch_credit_exhaustion_earliest_seconds and
_latest_seconds) with them: a file without them misses the band's targets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from agent.cli import main
from tests.support import prom_backfill as pb
from tests.support.replay_traces import (
    GBIT,
    T0,
    Drain,
    Phase,
    Pieces,
    Trace,
    TrueBucket,
    microbursts,
    on_off,
    steady,
    write_trace,
)

EARLIEST = "burstwatch_credit_exhaustion_earliest_seconds"
LATEST = "burstwatch_credit_exhaustion_latest_seconds"
TREND = "burstwatch_credit_exhaustion_trend_seconds"
CASE_SPACING = 3 * 86400.0          # each case's trace starts this long after the one before
LEAD = 60.0                         # a drain of 3 min or more pages at least this long before empty
LONG_DRAIN = 180.0
POINT_TOLERANCE = (60.0, 0.20)      # max(60 s, 20 % of the time left)
BAND_TARGET, POINT_TARGET = 0.90, 0.80
EVAL_STEP = 15.0


@dataclasses.dataclass(frozen=True)
class Size:
    name: str
    baseline: float                 # bytes/s
    peak: float

    @property
    def belief(self) -> float:
        """The catalogue's default bucket: one hour of baseline (agent/models/profile.py)."""
        return self.baseline * 3600.0


SIZES = {"r4.large": Size("r4.large", 0.75 * GBIT, 10 * GBIT), "r4.2xlarge": Size("r4.2xlarge", 2.5 * GBIT, 10 * GBIT)}


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    demand: Pieces
    mean: float                     # bytes/s
    period: Optional[float] = None  # the cycle's (onset to onset); None for steady traffic


def steady_shape(gbps: float) -> Shape:
    return Shape(f"steady {gbps:g} Gbit/s", steady(gbps * GBIT), gbps * GBIT)


def cycle_shape(gbps: float, on: float, off: float) -> Shape:
    return Shape(f"on/off {gbps:g} Gbit/s {on:g}/{off:g} s", on_off(gbps * GBIT, on, off),
                 gbps * GBIT * on / (on + off), on + off)


def burst_shape(gbps: float, burst: float, period: float) -> Shape:
    return Shape(f"microbursts {gbps:g} Gbit/s {burst:g} s every {period:g} s", microbursts(gbps * GBIT, burst, period),
                 gbps * GBIT * burst / period, period)


@dataclasses.dataclass
class Case:
    """One trace: `kind` is "drain" (every drain should page before empty), "quiet" (traffic at or under the
    baseline: never pages), "learned" (two drains the agent learns from, then one on a bucket half of what it
    learned) or "stopped" (drains that stop before empty: pages reported, not asserted)."""

    name: str
    size: Size
    kind: str
    factor: float                   # the true bucket / the belief (for "learned": of the third drain's)
    shape: Shape
    phases: list[Phase]
    true_buckets: list[float]       # the true bucket during each phase
    # filled by run()
    drains: list[Drain] = dataclasses.field(default_factory=list)
    rows: int = 0
    fires: list[float] = dataclasses.field(default_factory=list)
    samples: dict[str, dict[float, float]] = dataclasses.field(default_factory=dict)
    start: float = 0.0
    end: float = 0.0


def drain_seconds(size: Size, shape: Shape, bucket: float) -> float:
    return bucket / max(1.0, shape.mean - size.baseline)


def drain_case(size: Size, shape: Shape, factor: float) -> Case:
    bucket = factor * size.belief
    idle = Phase("idle", steady(0.1 * size.baseline), 300)
    length = math.ceil(1.3 * drain_seconds(size, shape, bucket) + (shape.period or 0) + 120)
    phases = [idle, Phase("drain", shape.demand, length, drain=True), Phase("rest", steady(0.0), 600)]
    return Case(f"{size.name} {shape.name} x{factor:g}", size, "drain", factor, shape, phases, [bucket] * 3)


def quiet_case(size: Size, shape: Shape, seconds: float = 7200.0) -> Case:
    assert shape.mean <= size.baseline
    return Case(f"{size.name} {shape.name} (quiet)", size, "quiet", 1.0, shape,
                [Phase("quiet", shape.demand, seconds, drain=True)], [size.belief])


def stopped_case(size: Size, shape: Shape, share: float) -> Case:
    """A drain on a true bucket equal to the belief that stops at `share` of its way to empty."""
    length = math.floor(share * drain_seconds(size, shape, size.belief))
    phases = [Phase("idle", steady(0.0), 300), Phase("drain", shape.demand, length, drain=True),
              Phase("rest", steady(0.0), 3600)]
    return Case(f"{size.name} {shape.name} stopped at {share:.0%}", size, "stopped", 1.0, shape, phases,
                [size.belief] * 3)


def learned_case(size: Size, shape: Shape, first: float = 2.0) -> Case:
    """Two drains on a true bucket of `first` x the belief (the agent learns it), a full refill after each,
    then a drain on half of it."""
    big, small = first * size.belief, 0.5 * first * size.belief
    refill = math.ceil(big / size.baseline) + 300
    phases, buckets = [], []
    for k, bucket in enumerate((big, big, small)):
        length = math.ceil(1.3 * drain_seconds(size, shape, bucket) + (shape.period or 0) + 120)
        phases += [Phase(f"idle{k}", steady(0.0), refill if k else 300),
                   Phase(f"drain{k}", shape.demand, length, drain=True)]
        buckets += [bucket, bucket]
    phases.append(Phase("rest", steady(0.0), 600))
    buckets.append(small)
    return Case(f"{size.name} {shape.name} learned x{first:g} then x{0.5 * first:g}", size, "learned",
                0.5 * first, shape, phases, buckets)


def short_zoo() -> list[Case]:
    """`make test`'s zoo: on r4.large a steady drain and a 2-min cycle at the belief, a steady drain at 0.3x,
    quiet microbursts and the third drain after learning; on r4.2xlarge a 20-s cycle at 0.6x."""
    s = SIZES["r4.large"]
    return [drain_case(s, steady_shape(5), 1.0), drain_case(s, cycle_shape(10, 60, 60), 1.0),
            drain_case(s, steady_shape(3), 0.3), quiet_case(s, burst_shape(10, 1, 20), 3600),
            learned_case(s, steady_shape(5)), drain_case(SIZES["r4.2xlarge"], cycle_shape(10, 10, 10), 0.6)]


def full_zoo() -> list[Case]:
    """`make bench BENCH=replay`'s zoo: both sizes, buckets 0.3x..2x, steady 1.5..10 Gbit/s, cycles 2..300 s,
    microbursts, quiet traffic, learned buckets and stopped drains."""
    cases: list[Case] = []
    cycles = [cycle_shape(10, 1, 1), cycle_shape(10, 10, 10), cycle_shape(10, 60, 60), cycle_shape(10, 150, 150)]
    for size in SIZES.values():
        rates = (1.5, 3, 5, 10) if size.name == "r4.large" else (5, 10)
        shapes = [steady_shape(r) for r in rates] + cycles
        if size.name == "r4.large":
            shapes.append(burst_shape(10, 2, 10))      # microbursts averaging 2 Gbit/s: a drain on r4.large
        for factor in (0.3, 0.6, 1.0, 2.0):
            cases += [drain_case(size, sh, factor) for sh in shapes]
        cases += [quiet_case(size, steady_shape(0.9 * size.baseline / GBIT)),
                  quiet_case(size, burst_shape(10, 1, math.ceil(10 / (size.baseline / GBIT) + 1))),
                  quiet_case(size, cycle_shape(6, 10, math.ceil(60 / (size.baseline / GBIT)) - 10))]
        cases += [learned_case(size, steady_shape(5)), learned_case(size, cycle_shape(10, 60, 60))]
        cases += [stopped_case(size, steady_shape(5), 0.5), stopped_case(size, cycle_shape(10, 60, 60), 0.7)]
    return cases


# -- running ------------------------------------------------------------------------------------------------

WANTED = (TREND, EARLIEST, LATEST)


def read_out_series(om: Path) -> dict[str, dict[float, float]]:
    """The `out` direction's forecast families from the replay's OpenMetrics file, per sample."""
    out: dict[str, dict[float, float]] = {}
    with om.open(encoding="utf-8") as f:
        for line in f:
            if not line.startswith(WANTED) or 'direction="out"' not in line:
                continue
            head, value, stamp = line.rsplit(" ", 2)
            name = head.split("{", 1)[0]
            out.setdefault(name, {})[float(stamp)] = float(value)
    return out


def run(cases: Sequence[Case], work: Path, log: Callable[[str], None] = lambda s: None) -> dict[str, float]:
    """Replay every case, backfill, evaluate BurstCreditsRunningOut with a real Prometheus; fills each case's
    figures. Returns timings (seconds)."""
    timing = {"replay": 0.0, "backfill": 0.0, "prometheus": 0.0, "rows": 0.0}
    data = work / "data"
    for k, case in enumerate(cases):
        t0 = T0 + k * CASE_SPACING
        tb = TrueBucket(case.size.baseline, case.size.peak, case.true_buckets[0])
        trace = Trace(tb, case.phases, t0=t0, sizes=case.true_buckets)
        csv = write_trace(work / f"case{k}.csv", trace)
        case.drains = trace.drains
        case.start, case.end = t0, t0 + sum(p.seconds for p in case.phases)
        case.rows = int(sum(p.seconds for p in case.phases))
        om = work / f"case{k}.om"
        began = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(["replay", str(csv), "--type", case.size.name, "--openmetrics", str(om)])
        assert rc == 0, case.name
        timing["replay"] += time.monotonic() - began
        timing["rows"] += case.rows
        case.samples = read_out_series(om)
        began = time.monotonic()
        pb.backfill(om, data)
        timing["backfill"] += time.monotonic() - began
        om.unlink()
        csv.unlink()
        log(f"  replayed {case.name}: {case.rows} rows")
    expr, for_s = pb.shipped_alert("BurstCreditsRunningOut")
    began = time.monotonic()
    prom = pb.Prometheus(data)
    try:
        for case in cases:
            series = prom.query_range(expr, case.start, case.end + 60, EVAL_STEP)
            case.fires = pb.alert_fires(pb.value_at(series, "direction", "out") or [], for_s, EVAL_STEP)
            others = [s for s in series if s["metric"].get("direction") != "out"]
            assert not any(pb.alert_fires(s["values"], for_s, EVAL_STEP) for s in others), case.name
    finally:
        prom.close()
    timing["prometheus"] = time.monotonic() - began
    return timing


# -- figures per drain --------------------------------------------------------------------------------------

@dataclasses.dataclass
class DrainFigures:
    case: str
    kind: str
    factor: float
    seconds: Optional[float]        # drain start to the true empty moment (None: never emptied)
    lead: Optional[float]           # the first page's lead on the empty moment (None: no page in the drain)
    pages: int                      # pages during the drain (start .. empty, or its end)
    band_hit: Optional[float]       # share of samples whose [earliest, latest] holds the empty moment
    band_width: Optional[float]     # median latest / earliest
    point_hit: Optional[float]      # share of trend forecasts within max(60 s, 20 %) after the second onset
    needs_point: bool               # the point target applies (true bucket = belief)


def figures(case: Case) -> list[DrainFigures]:
    out = []
    trend = case.samples.get(TREND, {})
    early, late = case.samples.get(EARLIEST), case.samples.get(LATEST)
    for i, d in enumerate(case.drains):
        until = d.empty if d.empty is not None else d.stop
        fires = [f for f in case.fires if d.start <= f < until + 1e-9]
        lead = (d.empty - fires[0]) if fires and d.empty is not None else None
        band_hit = band_width = point_hit = None
        ts = [t for t in sorted(trend) if d.start < t <= until] if d.empty is not None else []
        if ts and early is not None and late is not None:
            empty = d.empty
            assert empty is not None
            hits = [t + early[t] <= empty + 1e-6 <= t + late[t] + 2e-6 for t in ts if t in early and t in late]
            band_hit = sum(hits) / len(hits) if hits else None
            widths = [late[t] / early[t] for t in ts if early.get(t, 0) > 0 and math.isfinite(late.get(t, math.inf))]
            band_width = statistics.median(widths) if widths else math.inf
        # a learned case's first two drains are on 2x the default belief; its third on half what it learned
        factor = case.factor if case.kind != "learned" else (0.5 if i == 2 else 2.0)
        needs_point = case.kind == "drain" and factor == 1.0 and d.empty is not None
        if needs_point and d.empty is not None:
            second = d.start + (case.shape.period or 60.0)
            pts = [t for t in ts if t >= second]
            lo, frac = POINT_TOLERANCE
            ok = [abs(t + trend[t] - d.empty) <= max(lo, frac * (d.empty - t)) for t in pts]
            point_hit = sum(ok) / len(ok) if ok else None
        out.append(DrainFigures(case.name + (f" #{i + 1}" if len(case.drains) > 1 else ""), case.kind,
                                factor, None if d.empty is None else d.empty - d.start, lead, len(fires),
                                band_hit, band_width, point_hit, needs_point))
    return out


def pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.0f} %"


HEADER = ("| case | drain to empty | first page before empty | band holds empty | band width (median latest/earliest) "
          "| point within max(60 s, 20 %) | pages |\n|---|---|---|---|---|---|---|")


def row(f: DrainFigures) -> str:
    drain = "never" if f.seconds is None else f"{f.seconds:.0f} s"
    lead = "-" if f.seconds is None else ("no page" if f.lead is None else f"{f.lead:.0f} s")
    width = "-" if f.band_width is None else f"{f.band_width:.2f}"
    return f"| {f.case} | {drain} | {lead} | {pct(f.band_hit)} | {width} | {pct(f.point_hit)} | {f.pages} |"


def failures(figs: Sequence[DrainFigures]) -> dict[str, list[str]]:
    """The targets each drain misses, by target: "page" (bucket = belief), "page-band" (bucket off the belief:
    the band's job), "quiet", "band" and "point"."""
    out: dict[str, list[str]] = {"page": [], "page-band": [], "quiet": [], "band": [], "point": []}
    for f in figs:
        if f.kind == "quiet":
            if f.pages:
                out["quiet"].append(f"{f.case}: {f.pages} pages")
            continue
        if f.kind == "stopped" or f.seconds is None:
            continue
        need = LEAD if f.seconds >= LONG_DRAIN else 1e-9
        if f.lead is None or f.lead < need:
            out["page" if f.factor == 1.0 else "page-band"].append(f"{f.case}: lead {f.lead} (drain {f.seconds:.0f} s)")
        if f.band_hit is None or f.band_hit < BAND_TARGET:
            out["band"].append(f"{f.case}: {pct(f.band_hit)}")
        if f.needs_point and (f.point_hit is None or f.point_hit < POINT_TARGET):
            out["point"].append(f"{f.case}: {pct(f.point_hit)}")
    return out


def summary(figs: Sequence[DrainFigures]) -> dict[str, float]:
    widths = [f.band_width for f in figs if f.band_width is not None and math.isfinite(f.band_width)]
    emptied = [f for f in figs if f.kind in ("drain", "learned") and f.seconds is not None]
    hits = [f.band_hit for f in emptied if f.band_hit is not None]
    points = [f.point_hit for f in emptied if f.needs_point and f.point_hit is not None]
    leads = [f.lead for f in emptied if f.lead is not None]
    return {"drains": float(sum(1 for f in figs if f.kind != "quiet")),
            "emptied": float(len(emptied)),
            "band_met": float(sum(h >= BAND_TARGET for h in hits)),
            "band_min": min(hits) if hits else math.nan,
            "point_met": float(sum(p >= POINT_TARGET for p in points)),
            "point_drains": float(sum(f.needs_point for f in emptied)),
            "point_min": min(points) if points else math.nan,
            "paged_before_empty": float(len(leads)),
            "lead_min_seconds": min(leads) if leads else math.nan,
            "lead_median_seconds": statistics.median(leads) if leads else math.nan,
            "pages_on_quiet": float(sum(f.pages for f in figs if f.kind == "quiet")),
            "band_median_width": statistics.median(widths) if widths else math.nan,
            "pages_on_stopped_drains": float(sum(f.pages for f in figs if f.kind == "stopped")),
            "stopped_drains": float(sum(1 for f in figs if f.kind == "stopped"))}


# -- make bench BENCH=replay ---------------------------------------------------------------------------------

WEEK = 7 * 86400


def week_trace() -> Trace:
    """A week of 1-s samples on r4.large's true bucket at the belief: every third hour a 10-minute drain at
    5 Gbit/s, the rest of the time 1-s microbursts at 10 Gbit/s every 20 s (under the baseline)."""
    s = SIZES["r4.large"]
    phases = []
    for h in range(WEEK // 3600):
        if h % 3 == 0:
            phases += [Phase(f"drain{h}", steady(5 * GBIT), 600),
                       Phase(f"bursts{h}", microbursts(10 * GBIT, 1, 20), 3000)]
        else:
            phases.append(Phase(f"bursts{h}", microbursts(10 * GBIT, 1, 20), 3600))
    return Trace(TrueBucket(s.baseline, s.peak, s.belief), phases)


def time_week(work: Path, report: Callable[[str, float], None]) -> None:
    """`burstwatch replay` of a week of 1-s samples (604,800 rows) for one type, as a user runs it: its own
    process; wall and CPU seconds (target: <= 60 s on this machine)."""
    import resource
    import subprocess
    import sys

    csv = write_trace(work / "week.csv", week_trace())
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "agent", "replay", str(csv), "--type", "r4.large"],
                          capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    print(done.stdout, flush=True)
    report("replay_week_rows", float(sum(1 for _ in csv.open()) - 1))
    report("replay_week_wall_seconds", wall)
    report("replay_week_cpu_seconds", (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def bench(report: Callable[[str, float], None]) -> None:
    import tempfile

    cases = full_zoo()
    print(f"replay zoo: {len(cases)} cases, {sum(sum(p.seconds for p in c.phases) for c in cases):.0f} rows of 1 s, "
          "through `burstwatch replay --openmetrics`, promtool backfill, Prometheus at 15-s steps", flush=True)
    with tempfile.TemporaryDirectory(prefix="replay-zoo-") as d:
        timing = run(cases, Path(d))
        figs = [f for c in cases for f in figures(c)]
        print(HEADER)
        for f in figs:
            print(row(f))
        fails = failures(figs)
        for target, bad in fails.items():
            print(f"  {target}: " + ("all met" if not bad else f"{len(bad)} MISSED: " + "; ".join(bad)))
        for k, v in summary(figs).items():
            report(f"replay_zoo_{k}", v)
        for k, v in timing.items():
            report(f"replay_zoo_{k}" + ("" if k == "rows" else "_seconds"), v)
        for target, bad in fails.items():
            report(f"replay_zoo_misses_{target}", float(len(bad)))
        time_week(Path(d), report)
