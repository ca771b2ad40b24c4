"""The connection-tracking allowance: its learned size, the share in use and when it fills (pure; no I/O).

The ENA driver reports `conntrack_allowance_available`, a level (tracked connections still available), and
`conntrack_allowance_exceeded`, a counter (packets dropped because no new connection could be tracked).
AWS publishes no per-instance size (docs/ec2-network-facts.md, "The other allowances"; EC2 user guide,
"Monitor network performance for ENA settings"), so the model learns it; docs/allowances.md explains it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from agent.models.spend_trend import SpendTrend

INF = math.inf

# Trend window, EC2 default: 300 s. A tracked UDP flow lives 30 s after its last packet and a UDP stream
# 180 s (EC2 "Connection tracking timeouts"), so a request/response workload's level saws up and down on
# those periods: a window of at least one UDP-stream timeout averages the sawtooth into its drift, and
# 300 s (five minutes of 1-s samples, CloudWatch's basic period) also spans bursts of connection churn
# (pool reconnects, cron fan-outs). Fills that matter are leaks and traffic growth over minutes to hours;
# a SYN flood fills in seconds, and for that the exceeded counter, not a forecast, is the signal.
DEFAULT_WINDOW = 300.0
# The lab runs about 100x faster (0.1-0.2 s samples, fills of ~10 s): the same five-minute idea scaled down.
LAB_WINDOW = 3.0
# A slope under this share of the size per second is flat: full in more than ~11.6 days (1e6 s).
FLAT_FRACTION = 1e-6
# The level's whole excursion above its fitted line is taken off the room left (the credit trend takes half,
# docs/credits.md, "Two forecasts"): new connections fail the first time a burst's top reaches the size, and
# erring early is the safe side for a table. Simulated at EC2 scale with the 300-s window
# (tests/models/test_conntrack.py): UDP batches of 10 % of the table every 120 s that expire after 30 s on
# a one-hour leak put 81 % of the forecasts within max(2 samples, 20 %) with the whole excursion, 56 % with
# half; random bursts of up to 5 % every few samples cost 97 % -> 88 %.
EXCURSION_WEIGHT = 1.0
# An exceeded moment teaches the size only when the level read then is at most this share of it: the level
# is sampled, the drops happen between samples, so a reading far above 0 belongs to another moment.
FULL_LEVEL_FRACTION = 0.05
# Later learnings move the size half-way, so one odd count cannot swing it (the credit bucket's rule).
LEARN_WEIGHT_AFTER_FIRST = 0.5
# ConntrackRunningOut needs the table this full as well as a forecast within the horizon: fills plateau
# (pools reach their size; expiries balance arrivals), and a warm-up to 70 % at a brisk pace forecasts
# "full soon" all the way. Past 80 % in use the table has little room left for a burst of new flows.
RUNNING_OUT_MIN_SHARE = 0.8
# Default horizon for ConntrackRunningOut on EC2: ten minutes, time to act (raise timeouts' sharpness,
# shed load) before new connections start failing.
RUNNING_OUT_HORIZON = 600.0


class InstanceLevel:
    """Which ENI's `conntrack_allowance_available` stands for the instance: the one whose value changed last,
    and, until one changes, the first interface given (the primary ENI when discovered). Pure; fed once per
    sample with {interface: level}.

    AWS sizes the allowance per instance ("a maximum number of connections that can be tracked per instance",
    EC2 user guide, "Monitor network performance for your EC2 instance"), yet the driver reports it on every
    ENI, each value read from that ENI's device at the moment of `ethtool -S` (ena_ethtool.c
    ena_metrics_stats -> ena_com_get_customer_metrics: no copy kept by the driver). So the values do not add
    up (a sum counts the instance's table once per ENI), and one ENI's copy can go stale for hours while
    another's moves (amzn/amzn-drivers #291: the secondary's value changed only every few hours while most
    traffic ran through it; the primary's moved all the time). A value that just changed is current by
    definition; one that has not may be stale or merely steady, so the freshest wins and a tie keeps the
    ENI already chosen. docs/allowances.md, "Several ENIs, one table", has the reasoning and its sources."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._changed: dict[str, float] = {}
        self.source: Optional[str] = None           # the interface whose level was used last

    def pick(self, t: float, levels: Mapping[str, int]) -> Optional[int]:
        """The instance's level from this sample's per-ENI `levels` (None when there are none)."""
        for name in [n for n in self._last if n not in levels]:   # an ENI gone: forget it
            del self._last[name]
            self._changed.pop(name, None)
        for name, value in levels.items():
            if name in self._last and self._last[name] != value:
                self._changed[name] = t
            self._last[name] = value
        if not levels:
            self.source = None
            return None
        if self.source not in levels:
            self.source = next(iter(levels))
        fresh = max(self._changed.items(), key=lambda kv: kv[1], default=None)
        if fresh is not None and fresh[1] > self._changed.get(str(self.source), -INF):
            self.source = fresh[0]
        return levels[str(self.source)]


@dataclass(frozen=True)
class ConntrackReading:
    """The connection-tracking figures after one sample; what exporters render (never recompute)."""

    supported: bool                     # the driver reports the available level
    available: Optional[int]            # conntrack_allowance_available now
    size: Optional[float]               # learned allowance (tracked connections); None before any level
    size_method: str                    # none | max_available (a lower bound) | exceeded (seen full)
    in_use: Optional[float]             # size - available
    in_use_ratio: Optional[float]       # 0..1
    full_seconds: float                 # trend forecast to available = 0; +Inf when not filling; 0 when full
    exceeded: bool                      # conntrack_allowance_exceeded rose during the last interval
    exceeded_total: int                 # reset-safe total of the increases seen
    learned_count: int = 0              # exceeded moments that taught the size


def running_out(reading: ConntrackReading, horizon: float = RUNNING_OUT_HORIZON,
                min_share: float = RUNNING_OUT_MIN_SHARE) -> bool:
    """The ConntrackRunningOut condition: full within `horizon` s at the trend, and past `min_share` in use."""
    return (reading.in_use_ratio is not None and reading.in_use_ratio >= min_share
            and reading.full_seconds <= horizon)


class ConntrackModel:
    """Fed once per sample: (time, available level or None, exceeded increase, optional in-use count).

    Size. Every available level seen is a lower bound of the size (nothing can be more available than the
    table holds): `max_available`. When the exceeded counter rises the table was full; if an independent
    count of the tracked flows in use is given then (the flow reader's count of this host's flows), size =
    in_use + available at that moment, which settles a size the lower bound under-reads because the table
    was never seen empty. The first such moment replaces the bound; later ones move it half-way; it never
    falls below max_available.

    Trend. The level's used side (-available) goes into agent.models.spend_trend.SpendTrend, the credit
    forecast's least-squares slope over a sliding window with bounded memory: the same estimator fits, so it
    is reused rather than copied. Seconds to full = (available - the excursion) / slope."""

    def __init__(self, window: float = DEFAULT_WINDOW) -> None:
        self.window = window
        self.trend = SpendTrend(window)
        self.max_available: Optional[int] = None
        self.learned: Optional[float] = None    # size from exceeded moments
        self.learned_count = 0
        self.exceeded_total = 0
        self._supported: Optional[bool] = None
        self.level = InstanceLevel()
        # A size saved before the level was counted once per instance: on a host with several ENIs it may be a
        # sum (too large, and the size never falls below the largest level seen), so the first sample with
        # several levels drops it (to_state's "counted").
        self._maybe_summed = False

    @property
    def size(self) -> Optional[float]:
        if self.max_available is None:
            return self.learned
        return max(float(self.max_available), self.learned or 0.0)

    @property
    def size_method(self) -> str:
        if self.learned is not None and (self.max_available is None or self.learned >= self.max_available):
            return "exceeded"
        return "max_available" if self.max_available is not None else "none"

    def set_window(self, seconds: float) -> None:
        self.window = seconds
        self.trend.set_window(seconds)

    def observe(self, t: float, available: Union[None, int, Mapping[str, int]], exceeded_increase: int = 0,
                in_use: Optional[float] = None) -> ConntrackReading:
        """One sample: `t` monotonic seconds; `available` the level (None: the driver does not report it), or
        {interface: level} from several ENIs, of which one stands for the instance (InstanceLevel);
        `exceeded_increase` this sample's reset-safe increase of conntrack_allowance_exceeded, summed over
        the ENIs (each dropped packet is counted on the one ENI it was dropped at); `in_use` an independent
        count of the tracked flows now, when one exists."""
        if isinstance(available, Mapping):
            if self._maybe_summed and len(available) > 1:
                self.max_available, self.learned, self.learned_count = None, None, 0
            self._maybe_summed = False
            available = self.level.pick(t, available)
        exceeded_increase = max(0, int(exceeded_increase))
        self.exceeded_total += exceeded_increase
        self._supported = available is not None
        if available is None:
            self.trend.reset()      # a gap in the level: the fit starts again when it returns
            return self._reading(None, exceeded_increase > 0)
        available = max(0, int(available))
        if self.max_available is None or available > self.max_available:
            self.max_available = available
        if exceeded_increase > 0 and in_use is not None:
            self._learn(in_use, available)
        self.trend.add(t, -float(available))
        return self._reading(available, exceeded_increase > 0)

    def _learn(self, in_use: float, available: int) -> None:
        candidate = in_use + available
        if available > FULL_LEVEL_FRACTION * candidate:
            return  # the level read is far from 0: the drops belong to a moment between samples
        size = self.size
        if size is not None and candidate < 0.5 * size:
            return  # under half of a size already seen: the count missed most of the table
        if self.learned is None:
            self.learned = candidate
        else:
            self.learned += LEARN_WEIGHT_AFTER_FIRST * (candidate - self.learned)
        self.learned_count += 1

    def _forecast(self, available: int, size: float) -> float:
        if available <= 0:
            return 0.0
        slope = self.trend.slope()
        if slope is None or slope <= FLAT_FRACTION * max(size, 1.0):
            return INF
        room = max(0.0, available - EXCURSION_WEIGHT * self.trend.excursion(slope))
        return room / slope

    def _reading(self, available: Optional[int], exceeded: bool) -> ConntrackReading:
        size = self.size
        if available is None or size is None:
            return ConntrackReading(bool(self._supported), available, size, self.size_method, None, None, INF,
                                    exceeded, self.exceeded_total, self.learned_count)
        in_use = max(0.0, size - available)
        ratio = in_use / size if size > 0 else None
        full = 0.0 if exceeded and available <= FULL_LEVEL_FRACTION * size else self._forecast(available, size)
        return ConntrackReading(True, available, size, self.size_method, in_use, ratio, full, exceeded,
                                self.exceeded_total, self.learned_count)

    # -- persistence (pure: dicts in and out; the caller keys it by instance type and writes the file) ----
    def to_state(self) -> dict[str, Any]:
        return {"max_available": self.max_available, "learned": self.learned,
                "learned_count": self.learned_count, "counted": "instance"}

    def restore(self, state: dict[str, Any]) -> None:
        """Take a saved size; anything malformed is ignored field by field (a bad file is never fatal)."""
        m, learned, count = state.get("max_available"), state.get("learned"), state.get("learned_count", 0)
        self._maybe_summed = "max_available" in state and state.get("counted") != "instance"
        if isinstance(m, (int, float)) and not isinstance(m, bool) and m >= 0:
            self.max_available = int(max(m, self.max_available or 0))
        if isinstance(learned, (int, float)) and not isinstance(learned, bool) and learned > 0:
            self.learned = float(learned)
        if isinstance(count, int) and count >= 0:
            self.learned_count = count
