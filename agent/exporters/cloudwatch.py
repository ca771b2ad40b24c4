"""burstwatch_cloudwatch_* on /metrics: how CloudWatch publishing goes (renders the publisher's counters)."""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.cloudwatch.publisher import PublisherStats
from agent.exporters import View, counter_by

NS = "burstwatch_cloudwatch"


# Counters that are all zero: rendered once, they name every family this view yields (FAMILIES, which
# describe() announces).
_NOTHING_YET: PublisherStats = {"published": 0, "failed": 0, "dropped": {}, "backlog": 0, "backlog_capacity": 0,
                                "last_success": 0.0, "requests": {}, "errors": {}, "refused": 0}


def _render(s: PublisherStats) -> Iterable[Metric]:
    yield CounterMetricFamily(f"{NS}_datapoints_published", "Datapoints (statistic sets) CloudWatch "
                              "accepted.", value=s["published"])
    yield CounterMetricFamily(f"{NS}_datapoints_failed", "Datapoints in PutMetricData calls that failed "
                              "after retries (kept in the backlog and counted again on each try, "
                              "unless rejected).", value=s["failed"])
    dropped = CounterMetricFamily(f"{NS}_datapoints_dropped", "Datapoints given up: backlog_full (oldest "
                                  "dropped to keep the newest), expired (older than CloudWatch takes), "
                                  "rejected (invalid), shutdown (unsent at stop), aggregator_full.",
                                  labels=["reason"])
    for reason, n in sorted(s["dropped"].items()):
        dropped.add_metric([reason], n)
    dropped.add_metric(["aggregator_full"], s["refused"])
    yield dropped
    yield GaugeMetricFamily(f"{NS}_backlog_datapoints", "Datapoints waiting to be sent.", value=s["backlog"])
    yield GaugeMetricFamily(f"{NS}_backlog_capacity_datapoints", "Most datapoints the backlog keeps "
                            "([cloudwatch] backlog).", value=s["backlog_capacity"])
    yield GaugeMetricFamily(f"{NS}_last_success_timestamp_seconds", "Unix time of the last accepted "
                            "PutMetricData call; 0 before the first.", value=s["last_success"])
    yield counter_by(f"{NS}_requests", "PutMetricData calls by result (botocore's retries inside one call "
                     "are not counted).", "result", s["requests"])
    yield counter_by(f"{NS}_errors", "Failed PutMetricData calls (and client set-up) by kind.", "kind",
                     s["errors"])


class CloudWatchView(View):
    """Renders `CloudWatchPublisher.stats()`; a scrape does no I/O and never waits on a request."""

    FAMILIES = tuple((m.name, m.type) for m in _render(_NOTHING_YET))

    def __init__(self, stats: Callable[[], PublisherStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        return _render(self._stats())
