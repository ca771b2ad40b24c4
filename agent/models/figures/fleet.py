"""Learned buckets shared through S3 (docs/metrics.md, "Fleet")."""

from __future__ import annotations

from agent.models.figures.schema import Figure

FLEET_PUBLISHED_TOTAL = Figure(
    "burstwatch_fleet_published_total", "counter", "fleet",
    "Learned-bucket objects S3 took.",
    doc="learned-bucket objects S3 took")
FLEET_PUBLISH_FAILURES_TOTAL = Figure(
    "burstwatch_fleet_publish_failures_total", "counter", "fleet",
    "Uploads that failed after botocore's retries (the object stays queued and is retried with backoff).",
    doc="uploads that failed after botocore's retries; the object stays queued (and spooled) and is retried with a "
        "doubling pause")
FLEET_BACKLOG_OBJECTS = Figure(
    "burstwatch_fleet_backlog_objects", "gauge", "fleet",
    "Objects waiting to be uploaded.",
    doc="objects waiting to be uploaded")
FLEET_DROPPED_TOTAL = Figure(
    "burstwatch_fleet_dropped_total", "counter", "fleet",
    "Objects given up because the backlog or the spool was full.",
    doc="objects given up because the backlog or the spool (`spool_max_objects`) was full")
FLEET_OBJECTS_READ_TOTAL = Figure(
    "burstwatch_fleet_objects_read_total", "counter", "fleet",
    "Objects of this type's partition fetched and parsed.",
    doc="objects of this type's partition fetched (GET) and parsed; a key is fetched once per run")
FLEET_OBJECTS_REJECTED_TOTAL = Figure(
    "burstwatch_fleet_objects_rejected_total", "counter", "fleet",
    "Objects ignored, by reason: garbage (unreadable, wrong format or field, too large), foreign (another type's).",
    labels=("reason",),
    doc="objects ignored: `garbage` (not UTF-8 or JSON, another format, a missing or mistyped field, a bucket ≤ 0, "
        "over 64 KiB), `foreign` (another type's record, or a key outside the partition); each key counted once")
FLEET_REFRESH_ERRORS_TOTAL = Figure(
    "burstwatch_fleet_refresh_errors_total", "counter", "fleet",
    "Failed reads (LIST, GET) of the partition by kind.",
    labels=("kind",),
    doc="failed LIST or GET requests by kind (`credentials` = access denied: see [fleet.md](fleet.md#iam)), as in "
        "`burstwatch_cloudwatch_errors_total`")
FLEET_REQUESTS_TOTAL = Figure(
    "burstwatch_fleet_requests_total", "counter", "fleet",
    "S3 requests by action (list, get, put).",
    labels=("action",),
    doc="S3 requests: `list`, `get`, `put` (attempts; botocore's retries inside one are not counted)")
FLEET_REFRESHES_TOTAL = Figure(
    "burstwatch_fleet_refreshes_total", "counter", "fleet",
    "Completed reads of the partition.",
    doc="completed reads of the partition (at start, then every `refresh_interval`)")
FLEET_LAST_REFRESH_TIMESTAMP_SECONDS = Figure(
    "burstwatch_fleet_last_refresh_timestamp_seconds", "gauge", "fleet",
    "Unix time of the last completed read; 0 before the first.",
    doc="Unix time of the last completed read; 0 before the first")
FLEET_CONSENSUS_INSTANCES = Figure(
    "burstwatch_fleet_consensus_instances", "gauge", "fleet",
    "Distinct instances behind the fleet's consensus for this type; 0 when there is none.",
    doc="distinct instances behind the fleet's consensus for this type; 0 when there is none")
FLEET_CONSENSUS_BUCKET_BYTES = Figure(
    "burstwatch_fleet_consensus_bucket_bytes", "gauge", "fleet",
    "The fleet's consensus bucket for this type; absent when there is none.",
    doc="the fleet's consensus bucket (the median of the instances kept); absent when there is none. The credit "
        "model uses it as `burstwatch_credit_bucket_info{source=\"fleet\"}` when neither config nor its own "
        "learning gives one")
FLEET_CONSENSUS_OUTLIERS = Figure(
    "burstwatch_fleet_consensus_outliers", "gauge", "fleet",
    "Instances left out of the consensus as outliers.",
    doc="instances left out of the consensus (value outside half to twice the median)")
FLEET_CONSENSUS_SPREAD = Figure(
    "burstwatch_fleet_consensus_spread", "gauge", "fleet",
    "(max - min) / median of the values behind the consensus.",
    doc="(max − min) ÷ median of the values behind the consensus")  # noqa: RUF001 (as docs/ writes it)
