"""What the publisher sends of each closed period, and when: per group always, per instance by [cloudwatch]
per_instance, at once when an alarm's condition starts, holds or ends on this instance, else at the steady
flush (docs/cloudwatch.md, "Per group, per instance" and "Requests at fleet scale")."""

from __future__ import annotations

import math
import random
import zlib
from typing import Optional

from agent.models.cw_aggregate import Datum, Dims, SeriesKey, StatSet, instance_datums, period_stats, rollup_datums
from agent.models.cw_alarms import HORIZON_SECONDS, alarming
from agent.models.figures import CLOUDWATCH_METRICS

HOUR = 3600.0
# Per-instance datums held for the rest of an hour at most (an hour of the default set at period 60 is 660;
# at period 1 the oldest go first).
MAX_HELD = 5000


def phase(instance_id: Optional[str], interval: float) -> float:
    """This instance's offset in the steady flush interval, the same at every start: a fleet's calls are
    spread evenly over the interval instead of all landing at its start (the throttling page's advice:
    "add jitter"). From the instance id's CRC-32, so no two restarts of one instance pick different ones."""
    if not instance_id:
        return random.uniform(0.0, interval)
    return (zlib.crc32(instance_id.encode()) % 100_000) / 100_000 * interval


def next_steady(now: float, interval: float, offset: float) -> float:
    """The first steady flush time after `now` at this instance's phase."""
    return (math.floor((now - offset) / interval) + 1) * interval + offset


class PublishPolicy:
    """Turns each closed period into datums and says whether to send now. Publisher thread only.

    - Group metrics: every period, one value per series to each aggregation set (rollup_datums). A period
      closed twice (a late sample) goes to the group once: a second value would count the instance twice.
    - Per-instance metrics: "always", "never", or "when_draining": only in the clock hours in which one of
      the alarms' conditions held on this instance (CloudWatch bills a metric for the hours in which it
      receives data, so the rest of such an hour is free: the hour's earlier periods are sent too, from a
      buffer, and the later ones as they close).
    - Urgent: a period in which an alarm's condition starts or stops holding is sent at once, so the alarm
      (and its OK) is as prompt as with a flush every period; while one holds, the publisher sends every
      period (at most every 10 s), so the group's newest periods always carry this instance's value;
      everything else waits for the steady flush."""

    def __init__(self, mode: str, instance_dims: Dims, group_sets: list[Dims], resolution: int,
                 horizon: float = HORIZON_SECONDS) -> None:
        # Without an InstanceId (no IMDS) the instance's dimensions can be a group's: its full statistic
        # sets would then land in the group's metric and count as many instances.
        self.mode = "never" if instance_dims in group_sets else mode
        self.horizon = horizon
        self.instance_dims = instance_dims
        self.group_sets = group_sets
        self.resolution = resolution
        self.rollups = {n: f.rollup_statistic for n, f in CLOUDWATCH_METRICS.items()}
        self.alarming: frozenset[tuple[str, str]] = frozenset()
        self._hour = -1
        self._hot = False                 # when_draining: this clock hour's per-instance metrics go out
        self._held: list[Datum] = []      # ... and until then, its periods wait here
        self._last_group = -math.inf      # the newest period sent to the groups

    def take(self, start: float, bucket: dict[SeriesKey, StatSet]) -> tuple[list[Datum], bool]:
        """The datums of one closed period, and whether an alarm's condition started or stopped holding
        in it (send at once); while one holds, `alarming` is not empty (send every period)."""
        now = alarming(period_stats(bucket), self.horizon)
        urgent = now != self.alarming
        self.alarming = now
        out: list[Datum] = []
        if start > self._last_group:
            self._last_group = start
            out += rollup_datums(start, bucket, self.group_sets, self.rollups, self.resolution)
        if self.mode == "never":
            return out, urgent
        mine = instance_datums(start, bucket, self.instance_dims, self.resolution)
        if self.mode == "always":
            return out + mine, urgent
        hour = int(start // HOUR)
        if hour != self._hour:
            self._hour, self._hot, self._held = hour, False, []
        if now and not self._hot:
            self._hot = True
            out += self._held
            self._held = []
        if self._hot:
            out += mine
        else:
            self._held += mine
            del self._held[:-MAX_HELD]
        return out, urgent

    @property
    def held(self) -> int:
        """Per-instance datums of this hour waiting for an alarm condition (dropped at the hour's end)."""
        return len(self._held)
