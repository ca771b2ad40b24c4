"""Turn cumulative interface counters into safe deltas and windowed rates (resets, wraps, re-creation)."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, Hashable, Optional, TypeVar

from agent.readers.netdev import COUNTER_NAMES, NetDevCounters

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)

# Ceiling on a believable rate, used to tell a 32-bit wrap or a counter that restarted from zero from
# garbage: 400 Gbit/s is the largest ENA network card (e.g. p5 instances have 3200 Gbit/s across 32 cards).
MAX_BYTES_PER_SECOND = 400e9 / 8
MAX_PACKETS_PER_SECOND = 100e6
WRAP32 = 2**32


def counter_delta(prev: int, cur: int, dt: float, per_second_cap: float) -> tuple[int, str]:
    """Increase of a cumulative counter between two readings, and what happened ('ok', 'wrap', 'reset').

    A counter that went down either wrapped at 32 bits (some drivers keep 32-bit counters) or restarted
    from zero (driver reset, interface re-created). Neither may become a negative or absurd rate: a wrap
    (only believable from the upper half of the 32-bit range) counts the distance to 2**32, a reset
    counts the new value only if it fits in one interval at the cap, else nothing (the bytes before
    the reset are lost, not invented).
    """
    if cur >= prev:
        return cur - prev, "ok"
    cap = per_second_cap * max(dt, 1e-3)
    if WRAP32 // 2 <= prev < WRAP32:
        wrapped = cur + WRAP32 - prev
        if wrapped <= cap:
            return wrapped, "wrap"
    return (cur if cur <= cap else 0), "reset"


class CounterSet(Generic[K]):
    """Many cumulative counters, each turned into per-sample increases and a total that never goes down
    (psutil's wrap_numbers, once for every counter burstwatch reads: ethtool statistics, tc overlimits).

    A key seen for the first time only sets its baseline (increase 0: its earlier history is not ours to
    count); a key that disappears is forgotten, so when it comes back it starts afresh instead of
    counting its whole value as one interval's increase; a decrease goes through counter_delta."""

    def __init__(self, per_second_cap: float = MAX_PACKETS_PER_SECOND, what: str = "counter",
                 start_at_value: bool = False) -> None:
        self.cap = per_second_cap
        self.what = what
        # True: a new key's total starts at its raw value (a driver's own cumulative count, exported as
        # such); False: at 0 (counts only what happened while we watched).
        self.start_at_value = start_at_value
        self._last: dict[K, int] = {}
        self.totals: dict[K, int] = {}
        self.resets = 0

    def update(self, values: dict[K, int], dt: float) -> dict[K, int]:
        """Feed the current raw values of the keys present now; returns each key's increase this interval
        (0 for a key seen for the first time). Keys absent from `values` are forgotten."""
        out: dict[K, int] = {}
        for key in [k for k in self._last if k not in values]:
            del self._last[key]
        for key, value in values.items():
            prev = self._last.get(key)
            self._last[key] = value
            if prev is None:
                self.totals.setdefault(key, value if self.start_at_value else 0)
                out[key] = 0
                continue
            inc, kind = counter_delta(prev, value, dt, self.cap)
            if kind != "ok":
                self.resets += 1
                log.info("%s %s went %d -> %d (%s)", self.what, key, prev, value, kind)
            out[key] = inc
            self.totals[key] = self.totals.get(key, 0) + inc
        return out

    def total(self, key: K) -> Optional[int]:
        return self.totals.get(key)


@dataclass
class InterfaceDelta:
    """What crossed one interface during one sample interval."""

    counters: NetDevCounters          # per-counter increase during the interval
    dt: float
    event: str = "ok"                 # ok | wrap | reset | new | recreated


@dataclass
class _IfState:
    ifindex: int | None
    last: NetDevCounters
    total: list[int]                  # cumulative accounted counters (never decrease)
    history: deque = field(default_factory=deque)  # (t, rx_bytes_total, tx_bytes_total)


class CounterTracker:
    """Keeps per-interface counter state across samples; pure: readings in, deltas and rates out."""

    def __init__(self, rate_window: float) -> None:
        self.rate_window = rate_window
        self._ifs: dict[str, _IfState] = {}
        self._last_t: float | None = None
        self.resets_total: dict[str, int] = {}
        self._agg: deque = deque()    # (t, in_total, out_total) across monitored interfaces
        self._agg_total = [0, 0]

    def update(self, t: float, readings: dict[str, tuple[int | None, NetDevCounters]]) -> dict[str, InterfaceDelta]:
        """Feed one sample: interface -> (ifindex, counters). Returns per-interface deltas for
        interfaces seen before; a new or re-appearing interface only sets its baseline."""
        dt = 0.0 if self._last_t is None else t - self._last_t
        self._last_t = t
        deltas: dict[str, InterfaceDelta] = {}
        for name in list(self._ifs):
            if name not in readings:
                del self._ifs[name]     # gone; picked up again as new when it comes back
        agg_in = agg_out = 0
        for name, (ifindex, cur) in readings.items():
            st = self._ifs.get(name)
            if st is None:
                self._ifs[name] = _IfState(ifindex, cur, [0] * len(cur))
                self._push(self._ifs[name], t)
                continue
            recreated = ifindex is not None and st.ifindex is not None and ifindex != st.ifindex
            event = "recreated" if recreated else "ok"
            inc = []
            for i, fname in enumerate(COUNTER_NAMES):
                cap = MAX_BYTES_PER_SECOND if fname.endswith("bytes") else MAX_PACKETS_PER_SECOND
                if recreated:
                    # Re-created between two samples: its counters started at zero during the interval;
                    # count them when they fit one interval at the cap, else nothing.
                    d = cur[i] if cur[i] <= cap * max(dt, 1e-3) else 0
                else:
                    d, kind = counter_delta(st.last[i], cur[i], dt, cap)
                    if kind != "ok" and event == "ok":
                        event = kind
                inc.append(d)
            if event != "ok":
                self.resets_total[name] = self.resets_total.get(name, 0) + 1
            st.ifindex, st.last = ifindex, cur
            st.total = [a + b for a, b in zip(st.total, inc)]
            self._push(st, t)
            delta = NetDevCounters(*inc)
            deltas[name] = InterfaceDelta(delta, dt, event)
            agg_in += delta.rx_bytes
            agg_out += delta.tx_bytes
        self._agg_total[0] += agg_in
        self._agg_total[1] += agg_out
        self._agg.append((t, self._agg_total[0], self._agg_total[1]))
        self._trim(self._agg, t)
        return deltas

    def _push(self, st: _IfState, t: float) -> None:
        st.history.append((t, st.total[0], st.total[4]))
        self._trim(st.history, t)

    def _trim(self, hist: deque, t: float) -> None:
        # Keep the newest sample at least `rate_window` old so the window is always fully covered.
        while len(hist) > 2 and hist[1][0] <= t - self.rate_window:
            hist.popleft()

    @staticmethod
    def _rate(hist: deque) -> dict[str, float] | None:
        if len(hist) < 2:
            return None
        (t0, in0, out0), (t1, in1, out1) = hist[0], hist[-1]
        span = t1 - t0
        if span <= 0:
            return None
        return {"in": (in1 - in0) / span, "out": (out1 - out0) / span}

    def interface_rates(self) -> dict[str, dict[str, float]]:
        """Bytes per second per interface and direction over the rate window (once two samples exist)."""
        out = {}
        for name, st in self._ifs.items():
            r = self._rate(st.history)
            if r is not None:
                out[name] = r
        return out

    def instance_rates(self) -> dict[str, float] | None:
        """Bytes per second per direction summed over the monitored interfaces."""
        return self._rate(self._agg)

    def totals(self) -> dict[str, list[int]]:
        """Accounted cumulative counters per interface (monotonic across resets), COUNTER_NAMES order."""
        return {name: list(st.total) for name, st in self._ifs.items()}

    def ifindex(self, name: str) -> int | None:
        st = self._ifs.get(name)
        return st.ifindex if st else None

    def raw(self) -> dict[str, NetDevCounters]:
        return {name: st.last for name, st in self._ifs.items()}
