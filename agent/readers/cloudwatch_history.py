"""An instance's past traffic from CloudWatch: AWS/EC2 NetworkIn and NetworkOut through GetMetricData, for
`burstwatch replay --cloudwatch` (docs/replay.md, "From CloudWatch")."""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterator, NamedTuple

# EC2 publishes NetworkIn/NetworkOut every 5 minutes (basic monitoring) or every minute (detailed); each
# datapoint's Sum is the bytes in its period (EC2 user guide, "Instance metrics").
DETAILED_PERIOD = 60
BASIC_PERIOD = 300
METRICS = (("in", "NetworkIn"), ("out", "NetworkOut"))


class Interval(NamedTuple):
    """One period: it starts at `start` (Unix seconds; CloudWatch stamps a period with its start)."""

    start: float
    seconds: float
    in_bytes: float
    out_bytes: float


def queries(instance_id: str, period: int) -> list[dict[str, Any]]:
    return [{"Id": d, "ReturnData": True,
             "MetricStat": {"Metric": {"Namespace": "AWS/EC2", "MetricName": name,
                                       "Dimensions": [{"Name": "InstanceId", "Value": instance_id}]},
                            "Period": period, "Stat": "Sum", "Unit": "Bytes"}}
            for d, name in METRICS]


def read_metric_data(client: Any, instance_id: str, start: float, end: float, period: int) -> list[dict[str, Any]]:
    """GetMetricData's MetricDataResults pages for both metrics, raw."""
    out: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"MetricDataQueries": queries(instance_id, period),
                              "StartTime": dt.datetime.fromtimestamp(start, dt.timezone.utc),
                              "EndTime": dt.datetime.fromtimestamp(end, dt.timezone.utc),
                              "ScanBy": "TimestampAscending"}
    while True:
        page = client.get_metric_data(**kwargs)
        out.extend(page.get("MetricDataResults", []))
        token = page.get("NextToken")
        if not token:
            return out
        kwargs["NextToken"] = token


def _stamp(value: Any) -> float:
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
    return float(value)


def parse_metric_data(results: list[dict[str, Any]], period: int) -> list[Interval]:
    """The periods that have a datapoint for either metric, oldest first (the other metric missing: 0 bytes)."""
    by_time: dict[float, dict[str, float]] = {}
    for r in results:
        direction = r.get("Id")
        if direction not in ("in", "out"):
            continue
        for ts, value in zip(r.get("Timestamps", []), r.get("Values", [])):
            cell = by_time.setdefault(_stamp(ts), {})
            cell[direction] = cell.get(direction, 0.0) + float(value)
    return [Interval(t, float(period), v.get("in", 0.0), v.get("out", 0.0)) for t, v in sorted(by_time.items())]


def spacing(intervals: list[Interval]) -> float:
    """The median gap between consecutive periods (inf with fewer than two)."""
    gaps = sorted(b.start - a.start for a, b in zip(intervals, intervals[1:]))
    return gaps[len(gaps) // 2] if gaps else float("inf")


def network_history(client: Any, instance_id: str, start: float, end: float) -> tuple[int, list[Interval]]:
    """(period, intervals): 1-minute periods when the instance has detailed monitoring data in the range,
    else 5-minute ones. Without detailed monitoring, EC2 writes one datapoint per 5 minutes, so the 1-minute
    query holds points 5 minutes apart, each carrying five minutes' bytes: it is asked again at 300 s."""
    fine = parse_metric_data(read_metric_data(client, instance_id, start, end, DETAILED_PERIOD), DETAILED_PERIOD)
    if len(fine) >= 2 and spacing(fine) < BASIC_PERIOD:
        return DETAILED_PERIOD, fine
    return BASIC_PERIOD, parse_metric_data(read_metric_data(client, instance_id, start, end, BASIC_PERIOD),
                                           BASIC_PERIOD)


def rows(intervals: list[Interval]) -> Iterator[tuple[float, float, float, float]]:
    """(end of the period, seconds, in bytes, out bytes) per interval."""
    for iv in intervals:
        yield iv.start + iv.seconds, iv.seconds, iv.in_bytes, iv.out_bytes
