"""The traffic zoo: shapes of traffic against the real agent and a tbf shaper, the truth from the shaper.

One credit lab (tests/support/credit_lab.py: namespaces `inst` and `peer`, tbf on inst:eth0 for `out`, on
ifb0 for `in`) runs the real agent and a real Prometheus with the shipped rules (horizon and `for:` scaled
to the lab). Each shape starts from a full shaper and a fresh agent: the agent is stopped, its state
removed, both tbf qdiscs replaced (which refills their buckets) and the agent started again.

The truth is the shaper's: its token bucket replayed from its own parameters (rate = baseline, burst =
bucket) and the bytes it let through (inst:eth0 tx for `out`; ifb0, which counts after its tbf, for
`in`), from the moment it was known full. The empty moment is where the replayed tokens first fall
under 1 % of the bucket. For a continuous full-speed drain the bench cross-checks it against the moment
the rate falls from the peak to the baseline (the lab's older truth, `CreditLab.wait_clamp`).

Lab scale: baseline 100 Mbit/s, peak 300 Mbit/s, a 150 MB bucket (12 s of baseline, a 6 s drain at full
speed), 0.2-s samples, forecast_window 3 s: about 300x faster than EC2's one-hour buckets.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

from tests.support.credit_lab import ROOT, CreditLab, LabProfile, Trace, parse_metrics, scale_rules
from tests.support.lab import CLONE_NEWNET, Lab, _libc

RULES = Path(__file__).resolve().parents[2] / "packaging" / "prometheus" / "burstwatch.rules.yml"
# BurstCreditsRunningOut's horizon in the lab. EC2's 600 s against drains of 5-60 minutes would be 2 s at the
# lab's ~300x; Prometheus scrapes and evaluates once a second, so 4 s leaves it a scrape and an evaluation
# inside a 6-s full-speed drain, still under that drain's 6 s from a full bucket (a full bucket never
# pages). Every `for:` is 0s (EC2's 1m is 0.2 s here, under one evaluation).
HORIZON_SECONDS = 4.0
# After the shaper empties, the traffic goes on this long: the agent confirms an exhaustion within its rate
# window and 3 samples (1.2 s here), more on a loaded machine.
HOLD_SECONDS = 2.5
EMPTY_FRACTION = 0.01        # the replayed shaper is "empty" under 1 % of its bucket
FALSE_EXHAUSTION_FRACTION = 0.05   # the agent says exhausted while the shaper holds more than this
# Rates in the demands are on the wire, as the shaper and the counters see them: Ethernet (14) + IPv4 (20) +
# TCP with timestamps (32) bytes around every 1448-byte segment at MTU 1500.
WIRE_OVERHEAD = 1514 / 1448
# A paced sender writes at least this much at a time (or waits 2 ms): tiny writes leave as tiny segments on a
# link with a 20-us RTT (Nagle releases each one), and their headers would add a third to the rate.
SEND_QUANTUM = 64 * 1024


# -- demands: what the application offers, as a function of seconds since it started ---------------------

class Demand:
    """Offered traffic: full speed while full(t), else `cumulative(t)` bytes offered since the start."""

    label = "idle"

    def full(self, t: float) -> bool:
        return False

    def cumulative(self, t: float) -> float:
        return 0.0


class Idle(Demand):
    pass


class FullSpeed(Demand):
    label = "full speed"

    def full(self, t: float) -> bool:
        return True


@dataclasses.dataclass
class OnOff(Demand):
    """Full speed for `on` seconds, nothing for `off` seconds, repeating."""

    on: float
    off: float

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"on/off {self.on:g}/{self.off:g} s"

    def full(self, t: float) -> bool:
        return (t % (self.on + self.off)) < self.on


@dataclasses.dataclass
class Steady(Demand):
    rate: float              # bytes per second

    def cumulative(self, t: float) -> float:
        return self.rate * t


@dataclasses.dataclass
class Ramp(Demand):
    """From r0 to r1 bytes/s over `seconds`, then r1."""

    r0: float
    r1: float
    seconds: float

    def cumulative(self, t: float) -> float:
        u = min(t, self.seconds)
        slope = (self.r1 - self.r0) / self.seconds
        return self.r0 * u + slope * u * u / 2 + self.r1 * max(0.0, t - self.seconds)


@dataclasses.dataclass
class Microbursts(Demand):
    """A chunk every `every` seconds, written at once (line rate: the shaper passes it at its peak),
    averaging `average` bytes/s: a database flushing, a broker, a backup writing in bursts."""

    average: float
    every: float = 0.05

    def cumulative(self, t: float) -> float:
        return self.average * self.every * (math.floor(t / self.every + 1e-9) + 1)


# Every demand by name, for the sender process (tests/support/zoo_traffic.py).
DEMANDS: dict[str, type[Demand]] = {c.__name__: c for c in (Idle, FullSpeed, OnOff, Steady, Ramp, Microbursts)}


# -- threads that live in a namespace, and the traffic processes ------------------------------------------

def ns_thread(ns: str, fn: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread that enters network namespace `ns` for its whole life, then runs fn."""

    def body() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(f"setns({ns})")
        finally:
            os.close(fd)
        fn()

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    return t


class Sender:
    """One TCP connection from `src_ns` to a sink in `dst_ns` that follows a Demand, switched at will.

    Both ends are processes of their own (tests/support/zoo_traffic.py) at a raised priority (nice -10), so
    neither the test's own threads nor a loaded machine leave holes in a burst. The send buffer is small
    (256 KB) so that a pause is a pause on the wire too: a large autotuned buffer would keep sending for a
    while after the application stops. Paced demands are written in chunks of SEND_QUANTUM (a microburst's
    chunk whole), their wire rate converted to payload with WIRE_OVERHEAD."""

    def __init__(self, lab: Lab, src_ns: str, dst_ns: str, dst_ip: str, port: int) -> None:
        cmd = ("nice", "-n", "-10", sys.executable, "-m", "tests.support.zoo_traffic")
        self.sink = lab.popen(dst_ns, *cmd, "sink", dst_ip, str(port), cwd=str(ROOT), text=True,
                              stderr=subprocess.DEVNULL)
        assert self.sink.stdout is not None
        if self.sink.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the zoo's sink in {dst_ns} did not start")
        self.proc = lab.popen(src_ns, *cmd, "send", dst_ip, str(port), cwd=str(ROOT), text=True,
                              stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def set(self, demand: Demand) -> float:
        """Switch to `demand` now; returns the wall time it started at."""
        args = dataclasses.asdict(demand) if dataclasses.is_dataclass(demand) else {}
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"demand": type(demand).__name__, "args": args}) + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        for p in (self.proc, self.sink):
            if p.poll() is None:
                p.kill()
            p.wait(5)
        if self.proc.stdin is not None:
            self.proc.stdin.close()


# -- what the agent said ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Reading:
    t: float                 # when the agent read the counters of this sample (wall)
    remaining: float
    ratio: float
    bucket: float
    exhaustion: float
    trend: float
    exhausted: bool
    shaped: bool
    learned: float


class Watcher:
    """Reads the agent's /metrics from inside the namespace every `period` s; keeps one Reading per sample
    and direction (none while the agent is down)."""

    def __init__(self, ns: str, url: str, period: float = 0.08) -> None:
        self.url, self.period = url, period
        self.readings: dict[str, list[Reading]] = {"in": [], "out": []}
        self._stop = threading.Event()
        self._t = ns_thread(ns, self._run, "zoo-watcher")

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            try:
                m = parse_metrics(urllib.request.urlopen(self.url, timeout=2).read().decode())
            except (OSError, ValueError, http.client.HTTPException):
                # Down, or killed mid-answer (the SIGKILL drain cuts a scrape short: IncompleteRead, an
                # HTTPException, not an OSError): no reading, and the watcher goes on for the next test.
                self._stop.wait(self.period)
                continue
            stamp = m.get("burstwatch_last_sample_timestamp_seconds")
            if stamp is not None and stamp != last:
                last = stamp
                # The sample's time is stamped when its step ends; its counters were read when it began
                # (the first step after a start takes a while: restore, first netlink calls).
                t = stamp - m.get("burstwatch_sample_duration_seconds", 0.0)
                for d in ("in", "out"):
                    self.readings[d].append(self._reading(m, t, d))
            self._stop.wait(self.period)

    @staticmethod
    def _reading(m: dict[str, float], t: float, d: str) -> Reading:
        def g(name: str) -> float:
            return m.get(f'burstwatch_credit_{name}{{direction="{d}"}}', math.nan)

        return Reading(t, g("remaining_bytes"), g("remaining_ratio"), g("bucket_bytes"), g("exhaustion_seconds"),
                       g("exhaustion_trend_seconds"), g("exhausted") == 1.0, g("shaped") == 1.0,
                       g("bucket_learned_total"))

    def between(self, direction: str, t0: float, t1: float) -> list[Reading]:
        return [r for r in list(self.readings[direction]) if t0 <= r.t <= t1]

    def wait_samples(self, direction: str, after: float, n: int, timeout: float = 20.0) -> None:
        deadline = time.time() + timeout
        while len(self.between(direction, after, math.inf)) < n:
            if time.time() > deadline:
                raise TimeoutError(f"the agent gave no {n} samples within {timeout} s")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._t.join(3)


# -- the truth --------------------------------------------------------------------------------------------

class Replay:
    """The shaper's token bucket, replayed from its parameters and the bytes it let through, starting full
    at `t0` (tbf: tokens += rate x dt up to the burst; every byte passed takes one)."""

    def __init__(self, series: list[tuple[float, int]], t0: float, baseline: float, bucket: float) -> None:
        self.bucket = bucket
        pts = [p for p in series if p[0] >= t0]
        self.points: list[tuple[float, float]] = [(t0, bucket)]
        tokens, prev_t = bucket, t0
        prev_b = pts[0][1] if pts else 0
        for t, b in pts[1:]:
            tokens = min(bucket, tokens + baseline * (t - prev_t) - (b - prev_b))
            self.points.append((t, tokens))
            prev_t, prev_b = t, b

    def tokens_at(self, t: float) -> float:
        pts = self.points
        if t <= pts[0][0]:
            return pts[0][1]
        for (ta, va), (tb, vb) in zip(pts, pts[1:]):
            if ta <= t <= tb:
                return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else vb
        return pts[-1][1]

    def empty_at(self, after: float, until: float = math.inf) -> Optional[float]:
        """First moment after `after` the tokens fall under EMPTY_FRACTION of the bucket (interpolated)."""
        line = EMPTY_FRACTION * self.bucket
        for (ta, va), (tb, vb) in zip(self.points, self.points[1:]):
            if tb < after or ta > until:
                continue
            if vb <= line < va:
                return ta + (tb - ta) * (va - line) / (va - vb)
            if va <= line and ta >= after:
                return ta
        return None

    def min_tokens(self, t0: float, t1: float) -> float:
        return min((v for t, v in self.points if t0 <= t <= t1), default=self.bucket)


def rate_drop(series: list[tuple[float, int]], after: float, baseline: float, peak: float) -> Optional[float]:
    """Where a continuous full-speed drain's rate fell from the peak to the baseline and stayed (0.2 s
    windows, 0.6 s to stay): the lab's older truth, kept as a cross-check of the replay."""
    mid = (baseline + peak) / 2
    pts = [p for p in series if p[0] > after + 0.3]

    def rate(t: float) -> float:
        w = [p for p in pts if t - 0.2 <= p[0] <= t]
        return (w[-1][1] - w[0][1]) / (w[-1][0] - w[0][0]) if len(w) >= 2 and w[-1][0] > w[0][0] else math.inf

    for t, _ in pts:
        if rate(t) < mid and all(rate(u) < mid for u, _ in pts if t <= u <= t + 0.6) \
                and pts[-1][0] >= t + 0.6:
            return t - 0.1
    return None


# -- one shape's figures ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Result:
    shape: str
    direction: str
    start: float = 0.0                       # wall time the shape's traffic started
    drain_start: float = 0.0                 # where the forecasts are measured from
    empty: Optional[float] = None            # true empty moment (wall), None: never
    instant_hit: Optional[float] = None      # share of samples within tolerance of the empty moment
    trend_hit: Optional[float] = None
    instant_err: Optional[float] = None      # median signed error, seconds
    trend_err: Optional[float] = None
    samples: int = 0                         # samples the hit rates are over
    trend_inf: int = 0                       # samples a window into the drain whose trend said "never"
    tolerance: tuple[float, float] = (1.0, 0.15)
    alert_lead: Optional[float] = None       # BurstCreditsRunningOut first fired this long before empty
    false_alarms: int = 0                    # credit alerts that fired for traffic that never empties
    alerts: dict[str, int] = dataclasses.field(default_factory=dict)   # firing episodes by alert name
    exhausted_samples: int = 0
    false_exhaustions: int = 0               # exhausted while the shaper held > 5 % of its bucket
    learned: float = 0.0
    bucket_error: float = 0.0                # learned bucket / true - 1 (0 when nothing learned)
    min_ratio: float = 1.0                   # lowest remaining ratio the agent showed
    min_true_ratio: float = 1.0              # and the shaper held
    extra: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0                     # how long the shape ran
    # per sample: (s since start, agent's remaining / bucket, shaper's, trend, instant, exhausted, shaped)
    trajectory: list[tuple[float, float, float, float, float, bool, bool]] = dataclasses.field(default_factory=list)

    def story(self, every: int = 5) -> str:
        """The trajectory, every `every`-th sample: what a failed assert prints."""
        lines = [self.row(), "     t  agent  shaper   trend instant exh shaped"]
        for t, agent, true, trend, inst, exh, shaped in self.trajectory[::every]:
            lines.append(f"{t:6.2f} {agent:6.3f} {true:7.3f} {trend:7.2f} {inst:7.2f} {exh:d}   {shaped:d}")
        return "\n".join(lines)

    def row(self) -> str:
        def pct(v: Optional[float]) -> str:
            return "-" if v is None else f"{100 * v:3.0f}%"

        def sec(v: Optional[float]) -> str:
            return "-" if v is None else f"{v:+.2f}"

        empty = "never" if self.empty is None else f"{self.empty - self.drain_start:5.2f}s"
        if self.empty is None:
            alert = f"false {self.false_alarms}"
        else:
            alert = "none" if self.alert_lead is None else f"{self.alert_lead:+.1f}s"
        extra = " ".join(f"{k}={v:+.3f}" if abs(v) < 10 else f"{k}={v:.0f}" for k, v in self.extra.items())
        return (f"{self.shape:<26} {self.direction:<3} {empty:>7} {pct(self.instant_hit):>5} {sec(self.instant_err):>6}"
                f" {pct(self.trend_hit):>5} {sec(self.trend_err):>6} {alert:>9} {self.false_exhaustions:>5}"
                f" {self.bucket_error:+7.1%} {self.min_ratio:5.2f}/{self.min_true_ratio:4.2f}  {extra}")

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "trajectory"}


HEADER = (f"{'shape':<26} {'dir':<3} {'empty':>7} {'inst':>5} {'err':>6} {'trend':>5} {'err':>6} {'alert':>9}"
          f" {'f.exh':>5} {'bucket':>7} {'ratio min':>10}  extra")
LEGEND = """\
empty: true empty moment, seconds after the drain began (the shaper's replayed tokens), or never
inst/trend: share of samples whose forecast (instant / trend) lands within the tolerance of the empty moment
  (max(1 s, 15 %); steady drains max(0.5 s, 10 %)), from 3.5 s into the drain (short drains: from 1 s) to 1 s
  before empty; err: the median signed error (s) over the same samples
alert: BurstCreditsRunningOut's first firing before the empty moment (real Prometheus, horizon 4 s, for: 0s);
  for shapes that never empty: credit alerts that fired (false alarms)
f.exh: samples the agent called exhausted while the shaper held > 5 % of its bucket
bucket: learned bucket against the real one (trust_configured_bucket = false: the agent may relearn)
ratio min: lowest remaining ratio the agent showed / the shaper held"""


# -- the zoo ----------------------------------------------------------------------------------------------

class Zoo:
    """One lab for many shapes (see the module docstring)."""

    def __init__(self, profile: Optional[LabProfile] = None, prometheus: bool = True) -> None:
        self.p = profile or LabProfile()
        self.lab = CreditLab(self.p, trust_configured_bucket=False)
        try:
            self.ifb_trace = Trace(self.lab.holder.pid, dev="ifb0")
            self.senders = {"out": Sender(self.lab.lab, self.lab.inst, self.lab.peer, "10.77.0.2", 7101),
                            "in": Sender(self.lab.lab, self.lab.peer, self.lab.inst, "10.77.0.1", 7102)}
            self.prometheus = prometheus
            if prometheus:
                self.lab.start_prometheus(scale_rules(RULES.read_text(), minutes=HORIZON_SECONDS / 60))
            self.watcher = Watcher(self.lab.inst, "http://127.0.0.1:9786/metrics")
            self.full_since = 0.0
        except BaseException:
            self.close()
            raise

    # -- the shaper and the agent -----------------------------------------------------------------------
    def series(self, direction: str) -> list[tuple[float, int]]:
        """Bytes the shaper let through: inst:eth0 tx (out), ifb0 after its tbf (in)."""
        if direction == "out":
            return self.lab.trace.series("out")
        return self.ifb_trace.series("out")      # ifb0 transmits what its tbf released back into eth0

    def replay(self, direction: str) -> Replay:
        return Replay(self.series(direction), self.full_since, self.p.baseline, self.p.bucket)

    def refill(self) -> None:
        """Stop the traffic and the agent, refill both shapers, start a fresh agent (no state)."""
        for s in self.senders.values():
            s.set(Idle())
        time.sleep(0.4)                                      # socket buffers and qdisc queues drain
        if self.lab.agent is not None and self.lab.agent.poll() is None:
            self.lab.kill_agent(signal.SIGTERM)
        shutil.rmtree(self.lab.state_dir, ignore_errors=True)
        rate, peak = int(self.p.baseline_mbit * 1e6), int(self.p.peak_mbit * 1e6)
        # `tc qdisc replace` of a tbf sets its tokens to the full burst (tbf_change)
        self.lab.lab.tbf(self.lab.inst, "eth0", rate, int(self.p.bucket), peak_bit=peak, mtu=16384)
        self.lab.lab.tbf(self.lab.inst, "ifb0", rate, int(self.p.bucket), peak_bit=peak, mtu=16384)
        self.full_since = time.time()
        self.start_agent()

    def start_agent(self) -> None:
        t = time.time()
        self.lab.start_agent()
        self.watcher.wait_samples("out", t, 3)

    def kill_agent(self) -> None:
        self.lab.kill_agent(signal.SIGKILL)

    def wait_empty(self, direction: str, timeout: float) -> float:
        """Block until the replayed shaper is empty; its moment."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            time.sleep(0.1)
            e = self.replay(direction).empty_at(self.full_since)
            if e is not None:
                return e
        raise TimeoutError(f"the {direction} shaper did not empty within {timeout} s")

    # -- alerts -------------------------------------------------------------------------------------------
    def alerts(self, t0: float, t1: float) -> dict[tuple[str, str], list[float]]:
        """(alertname, direction) -> the evaluation times at which it was firing in [t0, t1]."""
        if not self.prometheus:
            return {}
        time.sleep(1.2)                                      # the last evaluation lands
        span = max(1, int(math.ceil(time.time() - t0)) + 1)
        q = urllib.parse.urlencode({"query": f'ALERTS{{alertstate="firing"}}[{span}s]', "time": f"{time.time():.3f}"})
        doc = json.loads(self.lab.lab.http_get(self.lab.inst,
                                               f"http://127.0.0.1:{self.lab.prom_port}/api/v1/query?{q}"))
        out: dict[tuple[str, str], list[float]] = {}
        for series in doc["data"]["result"]:
            key = (series["metric"].get("alertname", ""), series["metric"].get("direction", ""))
            out.setdefault(key, []).extend(float(ts) for ts, _ in series["values"] if t0 <= float(ts) <= t1)
        return {k: sorted(v) for k, v in out.items() if v}

    # -- figures ------------------------------------------------------------------------------------------
    def figures(self, res: Result, end: float, eval_from: float = 3.5, trend_from: Optional[float] = None,
                eval_before: float = 1.0, empty_after: Optional[float] = None) -> Result:
        """Fill `res` from the agent's readings, the replayed shaper and Prometheus over [res.start, end]."""
        d = res.direction
        rep = self.replay(d)
        res.seconds = end - res.start
        res.empty = rep.empty_at(empty_after if empty_after is not None else res.drain_start, end)
        readings = self.watcher.between(d, res.start, end)
        res.min_ratio = min((r.ratio for r in readings if not math.isnan(r.ratio)), default=math.nan)
        res.min_true_ratio = rep.min_tokens(res.start, end) / self.p.bucket
        res.trajectory = [(r.t - res.start, r.remaining / self.p.bucket, rep.tokens_at(r.t) / self.p.bucket, r.trend,
                           r.exhaustion, r.exhausted, r.shaped) for r in readings]
        res.exhausted_samples = sum(r.exhausted for r in readings)
        res.false_exhaustions = sum(1 for r in readings if r.exhausted
                                    and rep.tokens_at(r.t) > FALSE_EXHAUSTION_FRACTION * self.p.bucket)
        last = readings[-1] if readings else None
        if last is not None:
            res.learned = last.learned
            res.bucket_error = last.bucket / self.p.bucket - 1.0 if last.learned else 0.0
        if res.empty is not None:
            empty = res.empty
            lo, frac = res.tolerance

            def hits(attr: str, start: float) -> tuple[Optional[float], Optional[float], int]:
                sel = [r for r in readings if res.drain_start + start <= r.t <= empty - eval_before]
                if not sel:
                    return None, None, 0
                errs = [r.t + getattr(r, attr) - empty for r in sel]
                ok = [abs(e) <= max(lo, frac * (empty - r.t)) for e, r in zip(errs, sel)]
                finite = [e for e in errs if math.isfinite(e)]
                return (sum(ok) / len(ok), statistics.median(finite) if finite else math.inf, len(sel))

            res.trend_inf = sum(1 for r in readings if res.drain_start + self.p.forecast_window <= r.t <= empty
                                and not math.isfinite(r.trend))
            res.instant_hit, res.instant_err, res.samples = hits("exhaustion", eval_from)
            res.trend_hit, res.trend_err, _ = hits("trend", trend_from if trend_from is not None else eval_from)
        fired = self.alerts(res.start, end)
        res.alerts = {}
        for (name, direction), times in fired.items():
            if direction not in ("", d):
                continue
            episodes = 1 + sum(1 for a, b in zip(times, times[1:]) if b - a > 1.5)
            res.alerts[name] = res.alerts.get(name, 0) + episodes
        credit_alerts = ("BurstCreditsRunningOut", "NetworkShapedAtBaseline", "BurstCreditsLow")
        if res.empty is None:
            res.false_alarms = sum(res.alerts.get(a, 0) for a in credit_alerts)
        else:
            first = fired.get(("BurstCreditsRunningOut", d), [])
            before = [t for t in first if res.drain_start <= t <= res.empty]
            res.alert_lead = res.empty - before[0] if before else None
        return res

    def close(self) -> None:
        for attr in ("watcher",):
            w = getattr(self, attr, None)
            if w is not None:
                w.close()
        for s in getattr(self, "senders", {}).values():
            s.close()
        tr = getattr(self, "ifb_trace", None)
        if tr is not None:
            tr.stop()
        self.lab.close()
        shutil.rmtree(self.lab.state_dir, ignore_errors=True)
        shutil.rmtree(self.lab.state_dir + "-prom", ignore_errors=True)


# -- the shapes -------------------------------------------------------------------------------------------
# Each runs one shape in one direction from a full shaper and a fresh agent, and returns its Result.

def steady(zoo: Zoo, d: str) -> Result:
    """Full speed from full until empty, then held at the baseline for HOLD_SECONDS."""
    zoo.refill()
    res = Result("steady full speed", d, tolerance=(0.5, 0.10))
    res.start = res.drain_start = zoo.senders[d].set(FullSpeed())
    empty = zoo.wait_empty(d, 30)
    time.sleep(HOLD_SECONDS)
    zoo.senders[d].set(Idle())
    end = time.time()
    zoo.figures(res, end, eval_from=1.0, trend_from=zoo.p.forecast_window)
    clamp = rate_drop(zoo.series(d), res.drain_start, zoo.p.baseline, zoo.p.peak)
    res.extra["replay-vs-clamp"] = empty - clamp if clamp is not None else math.nan
    return res


def idle_then_burst(zoo: Zoo, d: str, idle: float = 5.0) -> Result:
    """Drain to empty, idle `idle` s (a partly refilled bucket), then full speed to empty again."""
    zoo.refill()
    s = zoo.senders[d]
    start = s.set(FullSpeed())
    zoo.wait_empty(d, 30)
    time.sleep(HOLD_SECONDS)
    s.set(Idle())
    time.sleep(idle)
    res = Result(f"idle {idle:g}s then burst", d, start=start)
    burst = s.set(FullSpeed())
    res.drain_start = burst
    before = [r for r in zoo.watcher.between(d, burst - 0.5, burst + 0.05)]
    rep = zoo.replay(d)
    deadline = time.time() + 30
    while rep.empty_at(burst + 0.05) is None and time.time() < deadline:
        time.sleep(0.1)
        rep = zoo.replay(d)
    time.sleep(1.0)
    s.set(Idle())
    end = time.time()
    zoo.figures(res, end, eval_from=1.0, trend_from=1.0, eval_before=0.5, empty_after=burst + 0.05)
    if before:
        r = before[-1]
        res.extra["idle-err"] = (r.remaining - rep.tokens_at(r.t)) / zoo.p.bucket
    return res


def on_off(zoo: Zoo, d: str, on: float, off: float, never_seconds: float = 15.0) -> Result:
    """Full speed `on` s, idle `off` s, repeating, from full; to empty, or for `never_seconds` when it
    averages under the baseline."""
    zoo.refill()
    demand = OnOff(on, off)
    res = Result(demand.label, d)
    res.start = res.drain_start = zoo.senders[d].set(demand)
    if on * (zoo.p.peak - zoo.p.baseline) > off * zoo.p.baseline:
        zoo.wait_empty(d, 60)
        time.sleep(HOLD_SECONDS)
    else:
        time.sleep(never_seconds)
    zoo.senders[d].set(Idle())
    return zoo.figures(res, time.time())


def ramp(zoo: Zoo, d: str, r0: float = 0.5, r1: float = 2.0, seconds: float = 16.0) -> Result:
    """A slow ramp from r0 to r1 x the baseline over `seconds`, then held: through the baseline to empty."""
    zoo.refill()
    b = zoo.p.baseline
    res = Result(f"ramp {r0:g}-{r1:g}x over {seconds:g}s", d)
    res.start = zoo.senders[d].set(Ramp(r0 * b, r1 * b, seconds))
    # the drain begins where the demand crosses the baseline
    res.drain_start = res.start + seconds * (1.0 - r0) / (r1 - r0)
    zoo.wait_empty(d, 60)
    time.sleep(HOLD_SECONDS)
    zoo.senders[d].set(Idle())
    return zoo.figures(res, time.time())


def microbursts(zoo: Zoo, d: str, average: float = 0.9, seconds: float = 14.0) -> Result:
    """Line-rate chunks every 50 ms averaging `average` x the baseline, from full: shaped at the peak,
    never empty (issue 12)."""
    zoo.refill()
    res = Result(f"microbursts {average:g}x", d)
    res.start = res.drain_start = zoo.senders[d].set(Microbursts(average * zoo.p.baseline))
    time.sleep(seconds)
    zoo.senders[d].set(Idle())
    res = zoo.figures(res, time.time())
    readings = zoo.watcher.between(d, res.start + 1.0, res.start + seconds)
    # the shape is the ambiguous one: shaped (at the peak) in most samples
    res.extra["shaped"] = sum(r.shaped for r in readings) / max(1, len(readings))
    return res


def under_baseline(zoo: Zoo, d: str, average: float = 0.7, seconds: float = 12.0) -> Result:
    """Steady traffic under the baseline: never empties."""
    zoo.refill()
    res = Result(f"steady {average:g}x baseline", d)
    res.start = res.drain_start = zoo.senders[d].set(Steady(average * zoo.p.baseline))
    time.sleep(seconds)
    zoo.senders[d].set(Idle())
    return zoo.figures(res, time.time())


def restart(zoo: Zoo, d: str, kill_after: float = 1.5, down: float = 0.5) -> Result:
    """Full speed from full; SIGKILL the agent `kill_after` s in (at the default save_interval, 5 s:
    longer than the whole drain so far), restart it `down` s later; where it continues against the shaper."""
    zoo.refill()
    res = Result("drain across SIGKILL", d, tolerance=(0.5, 0.10))
    s = zoo.senders[d]
    res.start = res.drain_start = s.set(FullSpeed())
    time.sleep(kill_after)
    zoo.kill_agent()
    killed = time.time()
    time.sleep(down)
    zoo.start_agent()
    zoo.wait_empty(d, 30)
    time.sleep(HOLD_SECONDS)
    s.set(Idle())
    end = time.time()
    zoo.figures(res, end, eval_from=1.0, trend_from=zoo.p.forecast_window)
    rep = zoo.replay(d)
    after = zoo.watcher.between(d, killed, end)
    if after:
        first = after[0]
        res.extra["restart-err"] = (first.remaining - rep.tokens_at(first.t)) / zoo.p.bucket
    if after and res.empty is not None:
        # the trend from the restart's first sample: its history is saved with the deficit (docs/credits.md,
        # "Persistence"), so it need not wait for a window of the drain again
        lo, frac = res.tolerance
        sel = [r for r in after if r.t <= res.empty - 0.5]
        if sel:
            res.extra["restart-trend"] = sum(abs(r.t + r.trend - res.empty) <= max(lo, frac * (res.empty - r.t))
                                             for r in sel) / len(sel)
    return res


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    run: Callable[[Zoo, str], Result]
    directions: tuple[str, ...] = ("out", "in")


def _on_off(on: float, off: float) -> Callable[[Zoo, str], Result]:
    return lambda zoo, d: on_off(zoo, d, on, off)


# The full zoo (`make bench`); tests/e2e/test_credit_zoo.py runs a representative subset per direction.
SHAPES: tuple[Shape, ...] = (
    Shape("steady", steady),
    Shape("idle-then-burst", idle_then_burst),
    Shape("on-off-0.6-0.4", _on_off(0.6, 0.4)),
    Shape("on-off-0.3-0.2", _on_off(0.3, 0.2)),
    Shape("on-off-0.5-0.5", _on_off(0.5, 0.5)),
    Shape("on-off-0.2-0.8", _on_off(0.2, 0.8)),          # averages 0.6 x the baseline: never empties
    Shape("ramp", ramp),
    Shape("microbursts-0.9", microbursts),
    Shape("microbursts-0.98", lambda zoo, d: microbursts(zoo, d, 0.98)),
    Shape("under-baseline", under_baseline),
    Shape("restart", restart),
)
BY_NAME = {s.name: s for s in SHAPES}


def run(names: Optional[list[tuple[str, str]]] = None, echo: Callable[[str], None] = print) -> list[Result]:
    """Run shapes ((name, direction) pairs; default all) in one zoo; echo each row as it completes."""
    todo = names or [(s.name, d) for s in SHAPES for d in s.directions]
    out = []
    zoo = Zoo()
    try:
        echo(HEADER)
        for name, d in todo:
            res = BY_NAME[name].run(zoo, d)
            out.append(res)
            echo(res.row())
    finally:
        zoo.close()
    return out

