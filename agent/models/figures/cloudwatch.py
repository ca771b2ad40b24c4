"""How CloudWatch publishing goes (docs/metrics.md, "CloudWatch publisher")."""

from __future__ import annotations

from agent.models.figures.schema import Figure

CLOUDWATCH_DATAPOINTS_PUBLISHED_TOTAL = Figure(
    "burstwatch_cloudwatch_datapoints_published_total", "counter", "cloudwatch",
    "Datapoints (statistic sets) CloudWatch accepted.",
    doc="datapoints (statistic sets) CloudWatch accepted")
CLOUDWATCH_DATAPOINTS_FAILED_TOTAL = Figure(
    "burstwatch_cloudwatch_datapoints_failed_total", "counter", "cloudwatch",
    "Datapoints in PutMetricData calls that failed after retries (kept in the backlog and counted again on each "
    "try, unless rejected).",
    doc="datapoints in PutMetricData calls that failed after retries (kept in the backlog unless rejected)")
CLOUDWATCH_DATAPOINTS_DROPPED_TOTAL = Figure(
    "burstwatch_cloudwatch_datapoints_dropped_total", "counter", "cloudwatch",
    "Datapoints given up: backlog_full (oldest dropped to keep the newest), expired (older than CloudWatch takes), "
    "rejected (invalid), shutdown (unsent at stop), aggregator_full.",
    labels=("reason",),
    doc="datapoints given up: `backlog_full` (oldest dropped to keep the newest), `expired` (older than CloudWatch "
        "accepts), `rejected`, `shutdown`")
CLOUDWATCH_BACKLOG_DATAPOINTS = Figure(
    "burstwatch_cloudwatch_backlog_datapoints", "gauge", "cloudwatch",
    "Datapoints waiting to be sent.",
    doc="datapoints waiting to be sent")
CLOUDWATCH_BACKLOG_CAPACITY_DATAPOINTS = Figure(
    "burstwatch_cloudwatch_backlog_capacity_datapoints", "gauge", "cloudwatch",
    "Most datapoints the backlog keeps ([cloudwatch] backlog).",
    doc="the backlog's bound (`[cloudwatch] backlog`)")
CLOUDWATCH_LAST_SUCCESS_TIMESTAMP_SECONDS = Figure(
    "burstwatch_cloudwatch_last_success_timestamp_seconds", "gauge", "cloudwatch",
    "Unix time of the last accepted PutMetricData call; 0 before the first.",
    doc="Unix time of the last accepted PutMetricData")
CLOUDWATCH_REQUESTS_TOTAL = Figure(
    "burstwatch_cloudwatch_requests_total", "counter", "cloudwatch",
    "PutMetricData calls by result (botocore's retries inside one call are not counted).",
    labels=("result",),
    doc="PutMetricData calls by result")
CLOUDWATCH_ERRORS_TOTAL = Figure(
    "burstwatch_cloudwatch_errors_total", "counter", "cloudwatch",
    "Failed PutMetricData calls (and client set-up) by kind.",
    labels=("kind",),
    doc="failures by kind (throttling, credentials, endpoint, rejected, …), each logged once per episode")
