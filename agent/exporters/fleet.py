"""burstwatch_fleet_* on /metrics: publishing learned buckets to the fleet and adopting its consensus."""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.core import Metric

from agent.exporters import View, counter_by, declared, family
from agent.fleet.service import FleetStats
from agent.models import figures as F
from agent.models.fleet import REJECT_REASONS


def _render(s: FleetStats) -> Iterable[Metric]:
    yield family(F.FLEET_PUBLISHED_TOTAL, s.published)
    yield family(F.FLEET_PUBLISH_FAILURES_TOTAL, s.publish_failures)
    yield family(F.FLEET_BACKLOG_OBJECTS, s.backlog)
    yield family(F.FLEET_DROPPED_TOTAL, s.dropped)
    yield family(F.FLEET_OBJECTS_READ_TOTAL, s.objects_read)
    yield counter_by(F.FLEET_OBJECTS_REJECTED_TOTAL, {**dict.fromkeys(REJECT_REASONS, 0), **s.rejected})
    yield counter_by(F.FLEET_REFRESH_ERRORS_TOTAL, s.refresh_errors)
    yield counter_by(F.FLEET_REQUESTS_TOTAL, s.requests)
    yield family(F.FLEET_REFRESHES_TOTAL, s.refreshes)
    yield family(F.FLEET_LAST_REFRESH_TIMESTAMP_SECONDS, s.last_refresh_timestamp)
    c = s.consensus
    yield family(F.FLEET_CONSENSUS_INSTANCES, c.instances if c else 0)
    bucket = family(F.FLEET_CONSENSUS_BUCKET_BYTES)
    outliers = family(F.FLEET_CONSENSUS_OUTLIERS)
    spread = family(F.FLEET_CONSENSUS_SPREAD)
    if c is not None:
        bucket.add_metric([], c.bucket_bytes)
        outliers.add_metric([], c.outliers)
        spread.add_metric([], c.spread)
    yield bucket
    yield outliers
    yield spread


class FleetView(View):
    """Renders `FleetService.snapshot()`; a scrape does no I/O."""

    FAMILIES = declared(F.FLEET_PUBLISHED_TOTAL, F.FLEET_PUBLISH_FAILURES_TOTAL, F.FLEET_BACKLOG_OBJECTS,
                        F.FLEET_DROPPED_TOTAL, F.FLEET_OBJECTS_READ_TOTAL, F.FLEET_OBJECTS_REJECTED_TOTAL,
                        F.FLEET_REFRESH_ERRORS_TOTAL, F.FLEET_REQUESTS_TOTAL, F.FLEET_REFRESHES_TOTAL,
                        F.FLEET_LAST_REFRESH_TIMESTAMP_SECONDS, F.FLEET_CONSENSUS_INSTANCES,
                        F.FLEET_CONSENSUS_BUCKET_BYTES, F.FLEET_CONSENSUS_OUTLIERS, F.FLEET_CONSENSUS_SPREAD)

    def __init__(self, snapshot: Callable[[], FleetStats]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        return _render(self._snapshot())
