"""CloudWatch datapoints: aggregate samples per period into statistic sets, pack batches, bound a backlog."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Optional
from urllib.parse import urlencode

# PutMetricData limits, from botocore 1.29's model (data/cloudwatch/2010-08-01/service-2.json) and the
# API reference (docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutMetricData.html):
# "Each PutMetricData request is limited to 1 MB in size for HTTP POST requests ... no more than 1000
# different metrics", "up to 30 dimensions per metric", "up to 150 values per metric" (Values/Counts).
# The limits are enforced by the service, not by botocore (the MetricData list has no "max" in the model),
# and they were 20 datums / 40 KB until 2022 (micrometer-metrics/micrometer#3376): the publisher also
# shrinks its batches when an endpoint answers with the old limit or with 413 (see BatchLimits).
MAX_DATUMS_PER_REQUEST = 1000
MAX_REQUEST_BYTES = 1_000_000         # "1 MB"; read as 10**6, the smaller reading
# What we aim for: 10 % under the limit, for HTTP framing and for a proxy or VPC endpoint that counts
# differently (the form body is what we measure exactly; see request_size()).
SAFE_REQUEST_BYTES = 900_000
MAX_DIMENSIONS = 30
MAX_VALUES_PER_DATUM = 150
# "Values must be in the range of -2^360 to 2^360 ... NaN, +Infinity, -Infinity are not supported."
MAX_ABS_VALUE = 2.0 ** 360
# "You can specify time stamps that are as much as two weeks before the current date": older datapoints
# would be rejected, so the backlog drops them first (with an hour of margin for clock skew).
MAX_AGE_SECONDS = 14 * 86400 - 3600

Dims = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class SeriesKey:
    """One CloudWatch metric as the aggregator sees it: name, unit and the metric's own dimensions
    (e.g. Direction); the instance's common dimensions are added when datums are built."""

    name: str
    unit: str
    dims: Dims = ()


class StatSet:
    """SampleCount / Sum / Minimum / Maximum of the samples of one series in one period."""

    __slots__ = ("count", "maximum", "minimum", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.minimum = min(value, self.minimum)
        self.maximum = max(value, self.maximum)

    def merge(self, other: StatSet) -> None:
        self.count += other.count
        self.total += other.total
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)

    def stat(self, statistic: str) -> float:
        """The set read with a CloudWatch statistic: Minimum, Maximum, Sum, SampleCount or Average."""
        return {"Minimum": self.minimum, "Maximum": self.maximum, "Sum": self.total,
                "SampleCount": float(self.count)}.get(statistic, self.total / max(1, self.count))


@dataclass(frozen=True)
class Datum:
    """One MetricDatum with a statistic set, ready to be sent (or kept in the backlog)."""

    name: str
    unit: str
    dims: Dims
    timestamp: float                   # Unix time of the period's start
    sample_count: float
    total: float
    minimum: float
    maximum: float
    storage_resolution: int = 60       # 1 = high resolution

    def to_api(self) -> dict[str, Any]:
        """The MetricDatum structure as boto3's put_metric_data takes it."""
        out: dict[str, Any] = {"MetricName": self.name}
        if self.dims:  # an empty list would still be sent, as "Dimensions="
            out["Dimensions"] = [{"Name": n, "Value": v} for n, v in self.dims]
        out.update({
            "Timestamp": datetime.fromtimestamp(self.timestamp, tz=timezone.utc),
            "StatisticValues": {"SampleCount": self.sample_count, "Sum": self.total,
                                "Minimum": self.minimum, "Maximum": self.maximum},
            "Unit": self.unit,
            "StorageResolution": self.storage_resolution,
        })
        return out

    def wire_pairs(self, index: int) -> list[tuple[str, Any]]:
        """The form fields botocore's query serializer sends for this datum at 1-based `index`."""
        p = f"MetricData.member.{index}."
        out: list[tuple[str, Any]] = [(p + "MetricName", self.name)]
        for i, (n, v) in enumerate(self.dims, 1):
            out.append((f"{p}Dimensions.member.{i}.Name", n))
            out.append((f"{p}Dimensions.member.{i}.Value", v))
        ts = datetime.fromtimestamp(self.timestamp, tz=timezone.utc)
        # botocore's query serializer: ISO 8601, with microseconds only when there are some.
        fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if ts.microsecond else "%Y-%m-%dT%H:%M:%SZ"
        out.append((p + "Timestamp", ts.strftime(fmt)))
        for field, value in (("SampleCount", self.sample_count), ("Sum", self.total),
                             ("Minimum", self.minimum), ("Maximum", self.maximum)):
            out.append((f"{p}StatisticValues.{field}", float(value)))
        out.append((p + "Unit", self.unit))
        out.append((p + "StorageResolution", self.storage_resolution))
        return out

    def wire_size(self, index: int = MAX_DATUMS_PER_REQUEST) -> int:
        """Bytes this datum adds to the form body (with '&'); the default index is the widest one."""
        return len(urlencode(self.wire_pairs(index))) + 1


def request_size(namespace: str, datums: Iterable[Datum]) -> int:
    """Exact size of the PutMetricData form body botocore 1.29 sends (query protocol)."""
    head = urlencode([("Action", "PutMetricData"), ("Version", "2010-08-01"), ("Namespace", namespace)])
    return len(head) + sum(d.wire_size(i) for i, d in enumerate(datums, 1))


def clean_value(value: float) -> Optional[float]:
    """A value CloudWatch accepts, or None: NaN is dropped, infinities and huge values are clipped."""
    if math.isnan(value):
        return None
    if value > MAX_ABS_VALUE:
        return MAX_ABS_VALUE
    if value < -MAX_ABS_VALUE:
        return -MAX_ABS_VALUE
    return float(value)


def period_start(t: float, period: int) -> float:
    return math.floor(t / period) * period


class PeriodAggregator:
    """Samples in, one statistic set per series per period out. Bounded: at most `max_series`
    (series, period) pairs are open at once; samples for new pairs beyond that are refused and counted
    (a stalled publisher then costs memory proportional to the bound, not to the stall)."""

    def __init__(self, period: int, max_series: int = 5000) -> None:
        if period < 1:
            raise ValueError("period must be at least 1 second")
        self.period = period
        self.max_series = max_series
        self._open: dict[float, dict[SeriesKey, StatSet]] = {}
        self._size = 0
        self.refused = 0                 # samples refused because the bound was reached
        self.invalid = 0                 # NaN samples

    def __len__(self) -> int:
        return self._size

    def add(self, t: float, key: SeriesKey, value: float) -> bool:
        v = clean_value(value)
        if v is None:
            self.invalid += 1
            return False
        start = period_start(t, self.period)
        bucket = self._open.get(start)
        if bucket is None:
            bucket = self._open[start] = {}
        st = bucket.get(key)
        if st is None:
            if self._size >= self.max_series:
                self.refused += 1
                return False
            st = bucket[key] = StatSet()
            self._size += 1
        st.add(v)
        return True

    @property
    def resolution(self) -> int:
        return 1 if self.period < 60 else 60

    def close_periods(self, now: float, force: bool = False) -> list[tuple[float, dict[SeriesKey, StatSet]]]:
        """(period start, its statistic sets) for every period that ended at or before `now` (every open
        period with `force`), oldest first, taken out of the aggregator."""
        out = []
        for start in sorted(self._open):
            if not force and start + self.period > now:
                continue
            bucket = self._open.pop(start)
            self._size -= len(bucket)
            out.append((start, bucket))
        return out

    def close(self, now: float, common_dims: Dims = (), force: bool = False) -> list[Datum]:
        """Datums for every period that ended at or before `now` (every open period with `force`),
        oldest first; the instance's `common_dims` come first in each datum's dimensions."""
        return [d for start, bucket in self.close_periods(now, force)
                for d in instance_datums(start, bucket, common_dims, self.resolution)]


def instance_datums(start: float, bucket: dict[SeriesKey, StatSet], common_dims: Dims,
                    resolution: int) -> list[Datum]:
    """One instance's period as it is: each series' full statistic set, under the instance's dimensions."""
    return [Datum(key.name, key.unit, common_dims + key.dims, start, float(st.count), st.total, st.minimum,
                  st.maximum, resolution) for key, st in bucket.items()]


# The metric's own dimensions a group metric leaves out: a peer is another instance, so per group and peer
# would be a metric per instance again.
GROUP_DROPS = frozenset({"Peer"})


def rollup_datums(start: float, bucket: dict[SeriesKey, StatSet], sets: Iterable[Dims],
                  rollups: dict[str, str], resolution: int) -> list[Datum]:
    """One instance's period as its share of each aggregation set's metrics: per series (its Peer merged
    away), ONE value, the period read with the metric's rollup statistic (`rollups` by name), sent as a
    statistic set of SampleCount 1. CloudWatch merges the instances' sets: Minimum is the worst instance,
    SampleCount the instances reporting, Sum of a 0/1 value the instances where it was 1."""
    merged: dict[SeriesKey, StatSet] = {}
    for key, st in bucket.items():
        if key.name not in rollups:
            continue
        gkey = SeriesKey(key.name, key.unit, tuple(p for p in key.dims if p[0] not in GROUP_DROPS))
        into = merged.get(gkey)
        if into is None:
            into = merged[gkey] = StatSet()
        into.merge(st)
    out = []
    for dims in sets:
        for key, st in merged.items():
            v = st.stat(rollups[key.name])
            out.append(Datum(key.name, key.unit, dims + key.dims, start, 1.0, v, v, v, resolution))
    return out


def period_stats(bucket: dict[SeriesKey, StatSet]) -> dict[tuple[str, str], dict[str, float]]:
    """(metric, direction) -> its statistics, for the series with a Direction and no Peer (what the
    alarm rules read: agent/models/cw_alarms.py)."""
    out = {}
    for key, st in bucket.items():
        dims = dict(key.dims)
        if "Direction" in dims and "Peer" not in dims:
            out[(key.name, dims["Direction"])] = {s: st.stat(s) for s in ("Minimum", "Maximum", "Sum")}
    return out


@dataclass
class BatchLimits:
    """How big one PutMetricData call may be; shrinks when an endpoint says it takes less."""

    max_datums: int = MAX_DATUMS_PER_REQUEST
    max_bytes: int = SAFE_REQUEST_BYTES
    # The pre-2022 limits (20 datums, 40 KB): no endpoint has ever taken less, so we never go below.
    min_datums: int = 20
    min_bytes: int = 40_000

    def limit_datums(self, n: int) -> bool:
        """Take an endpoint's stated maximum; False when that changes nothing."""
        new = max(1, min(n, self.max_datums))
        changed = new != self.max_datums
        self.max_datums = new
        return changed

    def halve(self) -> bool:
        """After a 413: halve both limits, not below the old ones; False when already there."""
        datums = max(min(self.min_datums, self.max_datums), self.max_datums // 2)
        nbytes = max(min(self.min_bytes, self.max_bytes), self.max_bytes // 2)
        changed = (datums, nbytes) != (self.max_datums, self.max_bytes)
        self.max_datums, self.max_bytes = datums, nbytes
        return changed


def take_batch(namespace: str, datums: Iterable[Datum], limits: BatchLimits) -> list[Datum]:
    """The leading datums that fit in one request (always at least one)."""
    out: list[Datum] = []
    size = request_size(namespace, [])
    for d in datums:
        n = d.wire_size(len(out) + 1)
        if out and (len(out) >= limits.max_datums or size + n > limits.max_bytes):
            break
        out.append(d)
        size += n
    return out


def pack(namespace: str, datums: list[Datum], limits: BatchLimits | None = None) -> list[list[Datum]]:
    """Split datums into as few requests as the limits allow, in order (greedy filling is optimal when
    order is kept and every datum must go out)."""
    limits = limits or BatchLimits()
    batches: list[list[Datum]] = []
    i = 0
    while i < len(datums):
        batch = take_batch(namespace, datums[i:], limits)
        batches.append(batch)
        i += len(batch)
    return batches


class Backlog:
    """Datums waiting to be sent, oldest first, at most `capacity`; when full it keeps the newest and
    counts what it dropped, by reason."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._q: deque[Datum] = deque()
        self.dropped: dict[str, int] = {"backlog_full": 0, "expired": 0, "rejected": 0, "shutdown": 0}

    def __len__(self) -> int:
        return len(self._q)

    def extend(self, datums: Iterable[Datum]) -> int:
        """Append; returns how many old datums were dropped to make room."""
        dropped = 0
        for d in datums:
            self._q.append(d)
            if len(self._q) > self.capacity:
                self._q.popleft()
                dropped += 1
        self.dropped["backlog_full"] += dropped
        return dropped

    def expire(self, now: float, max_age: float = MAX_AGE_SECONDS) -> int:
        n = 0
        while self._q and self._q[0].timestamp < now - max_age:
            self._q.popleft()
            n += 1
        self.dropped["expired"] += n
        return n

    def peek_batch(self, namespace: str, limits: BatchLimits) -> list[Datum]:
        """The oldest datums that fit in one request (at least one while any are waiting)."""
        return take_batch(namespace, self._q, limits)

    def pop(self, n: int) -> None:
        for _ in range(min(n, len(self._q))):
            self._q.popleft()

    def drop(self, n: int, reason: str) -> None:
        """Remove the oldest `n` datums, counting them under `reason`."""
        n = min(n, len(self._q))
        self.pop(n)
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    def drop_all(self, reason: str) -> int:
        n = len(self._q)
        self.drop(n, reason)
        return n
