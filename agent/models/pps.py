"""The packets-per-second allowance: a ceiling learned from the moments PPS shaping drops packets (pure).

AWS publishes no PPS maximum per instance (docs/ec2-network-facts.md, "The other allowances"); the ENA
driver only counts what exceeded it, `pps_allowance_exceeded` ("the bidirectional PPS exceeded the maximum
for the instance", EC2 user guide, "Monitor network performance for ENA settings"). docs/allowances.md
explains the rule below.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

INF = math.inf

# An episode teaches only after this many consecutive samples with PPS drops and no bandwidth shaping: a
# one-off burst drops packets in one sample, and the average rate of that sample says little about the
# ceiling (the burst may have lasted a millisecond).
MIN_EPISODE_SAMPLES = 3
# At most this many samples of one episode are kept for its median (bounded memory on a long episode).
MAX_EPISODE_SAMPLES = 600
# The ceiling is the largest of the last few episodes' medians. An episode's passed rate can fall short of
# the ceiling (the excess filled only part of each sample) but cannot exceed it by more than the shaper's
# burst, which the median over >= MIN_EPISODE_SAMPLES trims; the largest recent one is therefore the best
# estimate, and keeping only the last few lets a resized or re-placed instance move on.
RECENT_EPISODES = 5
# A sample's drops are counted only when they are at least this share of the packets that passed: a shaper
# at its ceiling drops a real share of a sustained excess (the lab's limiter at 2,000/s offered 5,000/s
# dropped ~3,000 per second, tests/e2e/test_allowance_lab.py), while microbursts in an otherwise light
# sample drop a handful out of many, and that sample's average rate says nothing about the ceiling.
MIN_DROP_SHARE = 0.001
# Bandwidth explains the drops when a bandwidth allowance counter rose in the same sample, or when the byte
# rate of either direction is at least this share of its baseline (shaping holds a rate at the baseline,
# docs/credits.md, "Exhaustion needs evidence").
BANDWIDTH_NEAR_BASELINE = 0.95
# PpsNearCeiling: the packet rate at or above this share of the learned ceiling.
NEAR_CEILING_RATIO = 0.9


@dataclass(frozen=True)
class PpsReading:
    """The PPS figures after one sample; what exporters render."""

    pps: float                          # packets per second, both directions (the allowance is bidirectional)
    ceiling: Optional[float]            # learned (or restored) packets per second; None before any episode
    source: str                         # none | learned | restored
    headroom_ratio: Optional[float]     # pps / ceiling (1.0 = at the ceiling)
    exceeded: bool                      # pps_allowance_exceeded rose during the last interval
    explained_by_bandwidth: bool        # ... while bandwidth shaping explains it: not a PPS limit
    exceeded_total: int
    learned_count: int = 0              # episodes that taught the ceiling


def _median(values: deque[float]) -> float:
    """The median (no `statistics` import: it pulls in decimal, fractions and random, ~0.5 MB of RSS in the
    resident daemon, which must stay within 1.3x node_exporter's; tests/test_resident_imports.py)."""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def near_ceiling(reading: PpsReading, ratio: float = NEAR_CEILING_RATIO) -> bool:
    """The PpsNearCeiling condition."""
    return reading.headroom_ratio is not None and reading.headroom_ratio >= ratio


def bandwidth_explains(shaped: bool, rate_over_baseline: Optional[float]) -> bool:
    """Whether bandwidth shaping explains a sample's drops: a bandwidth allowance counter (or the lab's
    qdisc) rose, or the byte rate sits at the baseline or above (`rate_over_baseline`, the larger of the
    two directions' rate / baseline; None when no baseline is known)."""
    return shaped or (rate_over_baseline is not None and rate_over_baseline >= BANDWIDTH_NEAR_BASELINE)


class PpsCeilingModel:
    """Fed once per sample: (seconds, packets that passed, pps_allowance_exceeded increase, bandwidth
    explains). An episode is a run of consecutive samples with PPS drops that bandwidth does not explain;
    once it has MIN_EPISODE_SAMPLES it yields a candidate, the median of its samples' passed rates, and the
    ceiling is the largest of the last RECENT_EPISODES candidates. A sample where bandwidth explains the
    drops ends the episode and teaches nothing."""

    def __init__(self) -> None:
        self.episode: deque[float] = deque(maxlen=MAX_EPISODE_SAMPLES)
        self.candidates: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.learned_count = 0
        self.exceeded_total = 0
        self.source = "none"
        self._open = False      # the current episode already counted once
        self.learn = True       # [allowances] learn = false: count, never learn (restored ceilings stay)

    @property
    def ceiling(self) -> Optional[float]:
        return max(self.candidates) if self.candidates else None

    def observe(self, dt: float, packets: float, exceeded_increase: int,
                bandwidth_explained: bool) -> PpsReading:
        """One sample of `dt` s: `packets` that passed the interfaces (rx + tx), `exceeded_increase` this
        sample's reset-safe increase of pps_allowance_exceeded, `bandwidth_explained` from
        bandwidth_explains()."""
        exceeded_increase = max(0, int(exceeded_increase))
        self.exceeded_total += exceeded_increase
        pps = packets / dt if dt > 0 else 0.0
        dropping = exceeded_increase > 0 and exceeded_increase >= MIN_DROP_SHARE * max(packets, 1.0)
        if dt <= 0 or not dropping or bandwidth_explained or not self.learn:
            self._close()
        else:
            self.episode.append(pps)
            if len(self.episode) >= MIN_EPISODE_SAMPLES:
                self._update()
        ceiling = self.ceiling
        return PpsReading(pps, ceiling, self.source, pps / ceiling if ceiling else None, exceeded_increase > 0,
                          exceeded_increase > 0 and bandwidth_explained, self.exceeded_total, self.learned_count)

    def _update(self) -> None:
        median = _median(self.episode)
        if self._open:
            self.candidates[-1] = median     # the open episode's median, refined as it goes on
        else:
            self.candidates.append(median)
            self.learned_count += 1
            self._open = True
        self.source = "learned"

    def _close(self) -> None:
        self.episode.clear()
        self._open = False

    # -- persistence (pure; the caller keys it by instance type and writes the file) ----------------------
    def to_state(self) -> dict[str, Any]:
        return {"candidates": list(self.candidates), "learned_count": self.learned_count}

    def restore(self, state: dict[str, Any]) -> None:
        cands = state.get("candidates")
        if isinstance(cands, list):
            good = [float(c) for c in cands if isinstance(c, (int, float)) and not isinstance(c, bool)
                    and math.isfinite(c) and c > 0]
            if good:
                self.candidates = deque(good[-RECENT_EPISODES:], maxlen=RECENT_EPISODES)
                self.source = "restored"
        count = state.get("learned_count")
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            self.learned_count = count
