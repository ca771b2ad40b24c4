"""What an entry of the figure table is (Figure and its CloudWatch and status forms) and how figures are read
from a sample: pure functions over the sample's readings. The sample and the probe results are Protocols,
because their classes live above agent/models (agent/sampling, agent/probes), which the table may not import."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Optional, Protocol, Sequence

if TYPE_CHECKING:
    # Types only, no import at run time: the readings are this layer's own classes, and a process that only
    # renders figures (`burstwatch status`) need not load the credit model.
    from agent.models.credit_model import CreditReading
    from agent.models.shaping import ShapingReading

# Every family's prefix (the one namespace of the conventions; tests/models/test_figures.py holds it).
NAMESPACE = "burstwatch"

# "Not draining" (+Inf) cannot be sent ("special values ... +Infinity ... are not supported",
# API_PutMetricData); a year stands for "never" and longer forecasts are clipped to it, so Minimum and
# alarms below it stay meaningful.
EXHAUSTION_CAP_SECONDS = 365 * 86400.0


class SnapshotLike(Protocol):
    """What the per-direction readers take from a sample (agent/sampling/pipeline.py Snapshot)."""

    @property
    def instance_rates(self) -> Optional[Mapping[str, float]]: ...

    @property
    def shaping(self) -> Optional[ShapingReading]: ...

    @property
    def credits(self) -> Optional[Mapping[str, CreditReading]]: ...


class ProbeResultLike(Protocol):
    """What CloudWatch reads from a peer's latest probe result (agent/probes/service.py ProbeResult).

    The rate is `bits_per_second`, or else `throughput_bytes_per_second`; a result with a `timestamp` (Unix
    time the probe ran) is published once, in the period it ran, and one without is published as the
    latest value at every flush."""

    @property
    def peer(self) -> str: ...

    @property
    def direction(self) -> str: ...     # in | out

    @property
    def success(self) -> bool: ...


# (snapshot, direction) -> the value, or None when the sample has none for that direction
DirectionReader = Callable[[SnapshotLike, str], Optional[float]]
# (snapshot) -> an instance-wide value of the sample, or None when it has none
SampleReader = Callable[[SnapshotLike], Optional[float]]
# (the statuses of the latest check verdicts) -> the value
ChecksReader = Callable[[Sequence[str]], float]
# (a peer's latest probe result) -> the value
PeerReader = Callable[[ProbeResultLike], float]


@dataclass(frozen=True)
class CloudWatchForm:
    """How a figure is published to CloudWatch; one of the four kinds below, each with its own typed `read`
    and its dimensions beyond the instance's (`per`, for the docs and the cost model):

    - PerDirection: Direction; read(snapshot, direction), in the sampler thread;
    - PerSample: none; read(snapshot), an instance-wide figure of the sample such as the allowances';
    - PerChecks: none; read(statuses of the latest check verdicts), once per flush in the publisher's thread;
    - PerPeer: Peer and Direction; read(probe result), once per flush in the publisher's thread.

    `default`: published unless left out; the others need [cloudwatch] include.

    Every selected form is published twice over (docs/cloudwatch.md, "Per group, per instance"): per instance
    (InstanceId, ...: the period's full statistic set) under [cloudwatch] per_instance, and to each aggregation
    dimension set (no InstanceId; a peer form drops Peer too), where each instance sends ONE value per period:
    its period reduced by `rollup` (default: `statistic`), as a statistic set of SampleCount 1. CloudWatch
    merges them, so a group's Minimum is its worst instance, its SampleCount the instances reporting, and the
    Sum of a 0/1 figure the instances for which it was 1. `statistic` is how to read both."""

    per: ClassVar[str] = ""
    name: str
    unit: str
    statistic: str
    default: bool
    doc: str

    @property
    def rollup_statistic(self) -> str:
        """What one instance's period reduces to in a group metric: Minimum, Maximum, Sum or Average."""
        return getattr(self, "rollup", "") or self.statistic


@dataclass(frozen=True)
class PerDirection(CloudWatchForm):
    per: ClassVar[str] = "direction"
    read: DirectionReader
    rollup: str = ""


@dataclass(frozen=True)
class PerSample(CloudWatchForm):
    per: ClassVar[str] = "sample"
    read: SampleReader
    rollup: str = ""


@dataclass(frozen=True)
class PerChecks(CloudWatchForm):
    per: ClassVar[str] = "instance"
    read: ChecksReader
    rollup: str = ""


@dataclass(frozen=True)
class PerPeer(CloudWatchForm):
    per: ClassVar[str] = "peer"
    read: PeerReader
    rollup: str = ""


@dataclass(frozen=True)
class StatusForm:
    """The figure's field in each direction of `burstwatch status --json` ("directions"), and what of its
    samples it takes: "value", "source" (the sample's `source` label), "flag" (value == 1) or "sum" (over
    the direction's series)."""

    key: str
    pick: str = "value"


@dataclass(frozen=True)
class Figure:
    """One family on /metrics. `section` is its table in docs/metrics.md; `doc` the meaning printed there.
    `read` is set for the figures a view renders per direction from the snapshot."""

    name: str
    type: str                           # gauge | counter | info
    section: str
    help: str
    labels: tuple[str, ...] = ()
    doc: str = ""
    read: Optional[DirectionReader] = None
    cloudwatch: tuple[CloudWatchForm, ...] = ()
    status: tuple[StatusForm, ...] = ()

    @property
    def family(self) -> str:
        """The name prometheus_client's family takes: it adds `_total` to counters and `_info` to info."""
        suffix = {"counter": "_total", "info": "_info"}.get(self.type, "")
        return self.name[:-len(suffix)] if suffix else self.name

    @property
    def unit(self) -> str:
        """The base unit the name ends in (the naming convention: the name says its unit), "" for none."""
        for unit in ("bytes_per_second", "packets_per_second", "seconds", "bytes", "ratio", "entries", "datapoints",
                     "objects", "flows"):
            if self.family.endswith("_" + unit):
                return unit
        return ""


# -- how figures are read from a sample ---------------------------------------------------------------------

def _reading(snap: SnapshotLike, direction: str) -> Optional[CreditReading]:
    return (snap.credits or {}).get(direction)


def credit(field: str, *, bucket: bool = False, cap: Optional[float] = None) -> DirectionReader:
    """The direction's CreditReading `field` as a float (a bool as 0/1); None when the sample has no reading
    for the direction or, with `bucket`, when the size has no bucket (never exhausts, or no profile).
    `cap` clips the value (CloudWatch takes no +Inf)."""

    def read(snap: SnapshotLike, direction: str) -> Optional[float]:
        r = _reading(snap, direction)
        if r is None or (bucket and (r.bucket_bytes is None or r.remaining_bytes is None)):
            return None
        value = getattr(r, field)
        if value is None:
            return math.nan if bucket else None
        value = float(value)
        return min(value, cap) if cap is not None else value
    return read


def credit_while_draining(field: str, cap: float) -> DirectionReader:
    """The direction's CreditReading `field` while its bucket drains (`draining`) or is exhausted (0, as the
    point forecasts read then), else `cap` ("not draining"): the band's early side as the page reads it
    (packaging/prometheus/burstwatch.rules.yml)."""
    plain = credit(field, bucket=True, cap=cap)

    def read(snap: SnapshotLike, direction: str) -> Optional[float]:
        value = plain(snap, direction)
        r = _reading(snap, direction)
        if value is None or r is None or math.isnan(value):
            return None
        return value if r.draining or r.exhausted else cap
    return read


def instance_rate(snap: SnapshotLike, direction: str) -> Optional[float]:
    """The instance rate (all monitored interfaces) over the rate window; None before there is one."""
    rates = snap.instance_rates
    return rates[direction] if rates is not None and direction in rates else None


def instance_rate_or_credit(snap: SnapshotLike, direction: str) -> Optional[float]:
    """The instance rate, else the rate the credit reading used."""
    rate = instance_rate(snap, direction)
    if rate is None:
        r = _reading(snap, direction)
        rate = r.rate_bytes_per_second if r is not None else None
    return rate


def shaping_increase(snap: SnapshotLike, direction: str) -> Optional[float]:
    """This sample's increase of the shaping counter (none on its first reading, which sets the baseline)."""
    if snap.shaping is None or direction not in snap.shaping.increase:
        return None
    return float(snap.shaping.increase[direction])


def count_status(status: str) -> ChecksReader:
    """How many of the latest check verdicts have this status."""
    return lambda statuses: float(list(statuses).count(status))


def probe_bits_per_second(r: Any) -> float:
    """The probe's throughput in bit/s; 0 for a failed probe (a failure is a value, not a gap).

    The rate is `bits_per_second`, or else `throughput_bytes_per_second` (None when unknown)."""
    if not r.success:
        return 0.0
    bps = getattr(r, "bits_per_second", None)
    if bps is None:
        nbytes = getattr(r, "throughput_bytes_per_second", None)
        bps = nbytes * 8.0 if nbytes is not None else 0.0
    return float(bps)


def probe_success(r: ProbeResultLike) -> float:
    return 1.0 if r.success else 0.0
