"""burstwatch_fleet_* on /metrics: publishing learned buckets to the fleet and adopting its consensus."""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.exporters import View, counter_by
from agent.fleet.service import FleetStats
from agent.models.fleet import REJECT_REASONS

NS = "burstwatch_fleet"

# Counters that are all zero: rendered once, they name every family this view yields (FAMILIES).
_NOTHING_YET = FleetStats(published=0, publish_failures=0, backlog=0, dropped=0, objects_read=0, rejected={},
                          refresh_errors={}, refreshes=0, last_refresh_timestamp=0.0, consensus=None,
                          requests={})


def _render(s: FleetStats) -> Iterable[Metric]:
    yield CounterMetricFamily(f"{NS}_published", "Learned-bucket objects S3 took.", value=s.published)
    yield CounterMetricFamily(f"{NS}_publish_failures", "Uploads that failed after botocore's retries (the "
                              "object stays queued and is retried with backoff).", value=s.publish_failures)
    yield GaugeMetricFamily(f"{NS}_backlog_objects", "Objects waiting to be uploaded.", value=s.backlog)
    yield CounterMetricFamily(f"{NS}_dropped", "Objects given up because the backlog or the spool "
                              "was full.", value=s.dropped)
    yield CounterMetricFamily(f"{NS}_objects_read", "Objects of this type's partition fetched and parsed.",
                              value=s.objects_read)
    yield counter_by(f"{NS}_objects_rejected", "Objects ignored, by reason: garbage (unreadable, wrong format "
                     "or field, too large), foreign (another type's).", "reason",
                     {**dict.fromkeys(REJECT_REASONS, 0), **s.rejected})
    yield counter_by(f"{NS}_refresh_errors", "Failed reads (LIST, GET) of the partition by kind.", "kind",
                     s.refresh_errors)
    yield counter_by(f"{NS}_requests", "S3 requests by action (list, get, put).", "action", s.requests)
    yield CounterMetricFamily(f"{NS}_refreshes", "Completed reads of the partition.", value=s.refreshes)
    yield GaugeMetricFamily(f"{NS}_last_refresh_timestamp_seconds", "Unix time of the last completed read; 0 "
                            "before the first.", value=s.last_refresh_timestamp)
    c = s.consensus
    yield GaugeMetricFamily(f"{NS}_consensus_instances", "Distinct instances behind the fleet's consensus "
                            "for this type; 0 when there is none.", value=c.instances if c else 0)
    bucket = GaugeMetricFamily(f"{NS}_consensus_bucket_bytes", "The fleet's consensus bucket for this type; "
                               "absent when there is none.")
    outliers = GaugeMetricFamily(f"{NS}_consensus_outliers", "Instances left out of the consensus as outliers.")
    spread = GaugeMetricFamily(f"{NS}_consensus_spread", "(max - min) / median of the values behind the "
                               "consensus.")
    if c is not None:
        bucket.add_metric([], c.bucket_bytes)
        outliers.add_metric([], c.outliers)
        spread.add_metric([], c.spread)
    yield bucket
    yield outliers
    yield spread


class FleetView(View):
    """Renders `FleetService.stats()`; a scrape does no I/O."""

    FAMILIES = tuple((m.name, m.type) for m in _render(_NOTHING_YET))

    def __init__(self, stats_fn: Callable[[], FleetStats]) -> None:
        self._stats = stats_fn

    def collect(self) -> Iterable[Metric]:
        return _render(self._stats())
