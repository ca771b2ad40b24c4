"""The CloudWatch publisher's first job: fold samples into statistic sets per period, with the series and
values the figure table (agent/models/figures/) names. Cheap: no I/O, one lock held for the adds."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Protocol

from agent.models.cw_aggregate import Datum, Dims, PeriodAggregator, SeriesKey, StatSet
from agent.models.figures import (
    CLOUDWATCH_METRICS,
    DirectionReader,
    PerChecks,
    PerDirection,
    PerPeer,
    PerSample,
    ProbeResultLike,
    SampleReader,
)
from agent.models.units import DIRECTIONS

if TYPE_CHECKING:
    from agent.sampling.pipeline import Snapshot

log = logging.getLogger(__name__)


class VerdictLike(Protocol):
    """What the publisher reads from a check verdict (agent/models/checks.py Verdict has these)."""

    @property
    def check(self) -> str: ...

    @property
    def interface(self) -> Optional[str]: ...

    @property
    def status(self) -> str: ...        # ok | warn | fail | skip


class Aggregation:
    """The open periods of the published series. The sampler thread calls observe() with each snapshot;
    the publisher thread calls sample_services() and close() once per flush. `metrics` are the CloudWatch
    names to publish; which series each makes and how its value is read is the figure table's."""

    def __init__(self, period: int, metrics: Iterable[str],
                 checks: Optional[Callable[[], Iterable[VerdictLike]]] = None,
                 probes: Optional[Callable[[], Iterable[ProbeResultLike]]] = None,
                 on_error: Callable[[str, BaseException], None] = lambda kind, exc: None) -> None:
        self.period = period
        self._agg = PeriodAggregator(period)
        self._lock = threading.Lock()            # the aggregator: sampler thread vs publisher thread
        forms = [CLOUDWATCH_METRICS[m] for m in metrics]
        # Worked out once, so observe() only calls the readers: (reader, direction, series key).
        self._per_direction: list[tuple[DirectionReader, str, SeriesKey]] = [
            (f.read, d, SeriesKey(f.name, f.unit, (("Direction", d),)))
            for d in DIRECTIONS for f in forms if isinstance(f, PerDirection)]
        # Instance-wide figures of the sample (the allowances'): read(snapshot), no extra dimension.
        self._per_sample: list[tuple[SampleReader, SeriesKey]] = [
            (f.read, SeriesKey(f.name, f.unit)) for f in forms if isinstance(f, PerSample)]
        self._per_instance: list[PerChecks] = [f for f in forms if isinstance(f, PerChecks)] \
            if checks is not None else []
        self._per_peer: list[PerPeer] = [f for f in forms if isinstance(f, PerPeer)] if probes is not None else []
        self._checks, self._probes = checks, probes
        self._probe_seen: dict[Dims, Any] = {}   # (Peer, Direction) -> timestamp of the result published
        self._on_error = on_error                # a service callable's failure: counted by the publisher

    def __len__(self) -> int:
        with self._lock:
            return len(self._agg)

    @property
    def refused(self) -> int:
        """Samples the aggregator refused (its series bound) or found invalid (NaN)."""
        return self._agg.refused + self._agg.invalid

    def observe(self, snap: Snapshot) -> None:
        """Fold one snapshot into the open periods (the sampler thread, after each sample). The shaping figure
        sends the shaping reading's `increase`, the one the sampler computed for the credit model too."""
        samples = []
        for read, d, key in self._per_direction:
            value = read(snap, d)
            if value is not None:
                samples.append((key, value))
        for read_sample, key in self._per_sample:
            value = read_sample(snap)
            if value is not None:
                samples.append((key, value))
        if samples:
            t = float(snap.wall_time)
            with self._lock:
                for key, value in samples:
                    self._agg.add(t, key, value)

    def sample_services(self, t: float) -> None:
        """Checks and probes are read here, in the publisher thread, once per flush: their callables may
        take locks of their own, and the sampler thread must not wait on them."""
        samples = self._check_samples(t) + self._probe_samples(t)
        if samples:
            with self._lock:
                for when, key, value in samples:
                    self._agg.add(when, key, value)

    def close(self, now: float, dims: Dims = (), force: bool = False) -> list[Datum]:
        with self._lock:
            return self._agg.close(now, dims, force=force)

    def close_periods(self, now: float, force: bool = False) -> list[tuple[float, dict[SeriesKey, StatSet]]]:
        """The closed periods' statistic sets (the publish policy turns them into datums)."""
        with self._lock:
            return self._agg.close_periods(now, force=force)

    def _check_samples(self, t: float) -> list[tuple[float, SeriesKey, float]]:
        if not self._per_instance or self._checks is None:
            return []
        try:
            statuses = [v.status for v in self._checks()]
        except Exception as exc:
            self._on_error("other", exc)
            return []
        return [(t, SeriesKey(f.name, f.unit), float(f.read(statuses))) for f in self._per_instance]

    def _probe_samples(self, t: float) -> list[tuple[float, SeriesKey, float]]:
        if not self._per_peer or self._probes is None:
            return []
        try:
            results = list(self._probes())
        except Exception as exc:
            self._on_error("other", exc)
            return []
        samples = []
        for r in results:
            dims = (("Peer", str(r.peer)), ("Direction", str(r.direction)))
            ran = getattr(r, "timestamp", None)
            when = t
            if ran is not None:
                if self._probe_seen.get(dims) == ran:
                    continue                  # already published, in the period it ran
                self._probe_seen[dims] = ran
                when = float(ran)
            samples += [(when, SeriesKey(f.name, f.unit, dims), float(f.read(r))) for f in self._per_peer]
        return samples
