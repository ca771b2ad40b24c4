"""burstwatch_cloudwatch_* on /metrics: how CloudWatch publishing goes (renders the publisher's counters)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from prometheus_client.core import Metric

from agent.exporters import View, counter_by, declared, family
from agent.models import figures as F

if TYPE_CHECKING:
    from agent.cloudwatch.publisher import PublisherSnapshot


def _render(s: PublisherSnapshot) -> Iterable[Metric]:
    yield family(F.CLOUDWATCH_DATAPOINTS_PUBLISHED_TOTAL, s.published)
    yield family(F.CLOUDWATCH_DATAPOINTS_FAILED_TOTAL, s.failed)
    dropped = family(F.CLOUDWATCH_DATAPOINTS_DROPPED_TOTAL)
    for reason, n in sorted(s.dropped.items()):
        dropped.add_metric([reason], n)
    dropped.add_metric(["aggregator_full"], s.refused)
    yield dropped
    yield family(F.CLOUDWATCH_BACKLOG_DATAPOINTS, s.backlog)
    yield family(F.CLOUDWATCH_BACKLOG_CAPACITY_DATAPOINTS, s.backlog_capacity)
    yield family(F.CLOUDWATCH_LAST_SUCCESS_TIMESTAMP_SECONDS, s.last_success)
    yield counter_by(F.CLOUDWATCH_REQUESTS_TOTAL, s.requests)
    yield counter_by(F.CLOUDWATCH_ERRORS_TOTAL, s.errors)


class CloudWatchView(View):
    """Renders `CloudWatchPublisher.snapshot()`; a scrape does no I/O and never waits on a request."""

    FAMILIES = declared(F.CLOUDWATCH_DATAPOINTS_PUBLISHED_TOTAL, F.CLOUDWATCH_DATAPOINTS_FAILED_TOTAL,
                        F.CLOUDWATCH_DATAPOINTS_DROPPED_TOTAL, F.CLOUDWATCH_BACKLOG_DATAPOINTS,
                        F.CLOUDWATCH_BACKLOG_CAPACITY_DATAPOINTS, F.CLOUDWATCH_LAST_SUCCESS_TIMESTAMP_SECONDS,
                        F.CLOUDWATCH_REQUESTS_TOTAL, F.CLOUDWATCH_ERRORS_TOTAL)

    def __init__(self, snapshot: Callable[[], PublisherSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        return _render(self._snapshot())
