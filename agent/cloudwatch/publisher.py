"""Publish burstwatch's figures to CloudWatch as custom metrics, off the sampling path, outage-proof."""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol, Union

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.models.cw_aggregate import (
    MAX_DIMENSIONS,
    Backlog,
    BatchLimits,
    CounterIncrease,
    Dims,
    PeriodAggregator,
    SeriesKey,
    period_start,
)

log = logging.getLogger(__name__)

NS = "burstwatch"
DIRECTIONS = ("in", "out")
# "Not draining" (+Inf) cannot be sent ("special values ... +Infinity ... are not supported",
# API_PutMetricData); a year stands for "never" and longer forecasts are clipped to it, so Minimum and
# alarms below it stay meaningful.
EXHAUSTION_CAP_SECONDS = 365 * 86400.0
ASG_TAG = "aws:autoscaling:groupName"
# A flush at most this often when the period is shorter (high resolution): each flush is one request,
# and requests are billed ($0.01 per 1,000, docs/cloudwatch.md).
MIN_FLUSH_INTERVAL = 10.0


@dataclass(frozen=True)
class MetricSpec:
    """One published metric: its CloudWatch name and unit, what it is per, the statistic to read."""

    name: str
    unit: str
    per: str            # "direction" | "instance" | "peer" (Peer and Direction)
    statistic: str
    doc: str


# The catalogue. DEFAULT_METRICS are published when enabled; the others need [cloudwatch] include.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("CreditRemainingRatio", "None", "direction", "Minimum",
               "estimated burst credit left, as a fraction of the bucket (0..1)"),
    MetricSpec("CreditExhaustionSeconds", "Seconds", "direction", "Minimum",
               "forecast seconds until the bucket is empty at the current rate; 31536000 (a year) when "
               "not draining"),
    MetricSpec("ThroughputBytesPerSecond", "Bytes/Second", "direction", "Average",
               "measured instance throughput (all monitored interfaces)"),
    MetricSpec("ShapingEvents", "Count", "direction", "Sum",
               "increase of the shaping counter (ENA bw_in/bw_out_allowance_exceeded, or the tc qdisc's "
               "overlimits): packets queued or dropped by the shaper"),
    MetricSpec("FailedChecks", "Count", "instance", "Maximum",
               "checks (ENA, driver, MTU) whose verdict is fail"),
    MetricSpec("ProbeThroughputBitsPerSecond", "Bits/Second", "peer", "Average",
               "probe throughput per peer and direction, in the period the probe ran (0 when it failed)"),
    # Optional
    MetricSpec("CreditRemainingBytes", "Bytes", "direction", "Minimum", "estimated burst credit left"),
    MetricSpec("CreditBucketBytes", "Bytes", "direction", "Maximum", "bucket size in use"),
    MetricSpec("CreditRefillSeconds", "Seconds", "direction", "Minimum",
               "seconds until the bucket is full at the current rate; 31536000 when not refilling"),
    MetricSpec("Shaped", "None", "direction", "Maximum", "1 when the shaping counter rose, else 0"),
    MetricSpec("CreditExhausted", "None", "direction", "Maximum",
               "1 while the shaper holds the rate at the baseline (bucket empty), else 0"),
    MetricSpec("WarnedChecks", "Count", "instance", "Maximum", "checks whose verdict is warn"),
    MetricSpec("ProbeSuccess", "None", "peer", "Minimum", "1 when the peer's latest probe succeeded"),
)
DEFAULT_METRICS = ("CreditRemainingRatio", "CreditExhaustionSeconds", "ThroughputBytesPerSecond",
                   "ShapingEvents", "FailedChecks", "ProbeThroughputBitsPerSecond")
SPECS = {m.name: m for m in METRICS}


class VerdictLike(Protocol):
    """What the publisher reads from a check verdict (agent/models/checks.py Verdict has these)."""

    @property
    def check(self) -> str: ...

    @property
    def interface(self) -> Optional[str]: ...

    @property
    def status(self) -> str: ...        # ok | warn | fail | skip


class ProbeResultLike(Protocol):
    """What the publisher reads from a peer's latest probe result (agent/probes/service.py ProbeResult).

    The rate is `bits_per_second`, or else `throughput_bytes_per_second` (None when unknown); a result
    with a `timestamp` (Unix time the probe ran) is published once, in the period it ran, and one without
    is published as the latest value at every flush."""

    @property
    def peer(self) -> str: ...

    @property
    def direction(self) -> str: ...     # in | out

    @property
    def success(self) -> bool: ...


def probe_bits_per_second(r: Any) -> float:
    """The probe's throughput in bit/s; 0 for a failed probe (a failure is a value, not a gap)."""
    if not r.success:
        return 0.0
    bps = getattr(r, "bits_per_second", None)
    if bps is None:
        nbytes = getattr(r, "throughput_bytes_per_second", None)
        bps = nbytes * 8.0 if nbytes is not None else 0.0
    return float(bps)


# -- which metrics and dimensions -----------------------------------------------------------------

def selected_metrics(include: Iterable[str]) -> tuple[list[str], list[str]]:
    """(metrics to publish, unknown names in `include`)."""
    names = list(DEFAULT_METRICS)
    unknown = []
    for n in include:
        if n not in SPECS:
            unknown.append(n)
        elif n not in names:
            names.append(n)
    return names, unknown


def check_dimension(name: str, value: str) -> Optional[str]:
    """Why CloudWatch would reject this dimension (Dimension shape in the API), or None."""
    if not name.strip() or len(name) > 255 or name.startswith(":") or not name.isascii():
        return f"dimension name {name!r} must be 1-255 ASCII characters, not starting with ':'"
    if not value.strip() or len(value) > 1024 or not value.isascii():
        return f"dimension {name}={value!r}: the value must be 1-1024 ASCII characters"
    return None


def common_dimensions(instance_id: Optional[str], instance_type: Optional[str],
                      autoscaling_group: Optional[str], extra: dict[str, str]) -> Dims:
    """InstanceId, InstanceType, AutoScalingGroupName (when known), then the configured extra
    dimensions in name order; room is left for the per-metric Peer and Direction (30 in all)."""
    dims: list[tuple[str, str]] = []
    for name, value in (("InstanceId", instance_id), ("InstanceType", instance_type),
                        ("AutoScalingGroupName", autoscaling_group)):
        if value and name not in extra:
            dims.append((name, value))
    for name in sorted(extra):
        problem = check_dimension(name, extra[name])
        if problem:
            log.error("cloudwatch: ignoring extra %s", problem)
            continue
        dims.append((name, extra[name]))
    room = MAX_DIMENSIONS - 2
    if len(dims) > room:
        log.error("cloudwatch: %d dimensions, at most %d fit beside Peer and Direction; dropping %s",
                  len(dims), room, ", ".join(n for n, _ in dims[room:]))
        dims = dims[:room]
    return tuple(dims)


def autoscaling_group_name(instance_id: Optional[str], imds_get: Optional[Callable[[str], Optional[str]]],
                           ec2: Optional[Callable[[], Any]] = None) -> Optional[str]:
    """The instance's Auto Scaling group, from its `aws:autoscaling:groupName` tag.

    First through IMDS (`meta-data/tags/instance/...`, free, but only when instance metadata tags are
    enabled), else through ec2:DescribeTags when `ec2` (a client factory) is given. IMDS's
    `autoscaling/target-lifecycle-state` tells the lifecycle state, not the group's name."""
    if imds_get is not None:
        try:
            listing = imds_get("meta-data/tags/instance")
            if listing is not None:
                keys = [k.strip() for k in listing.splitlines()]
                if ASG_TAG not in keys:
                    return None           # tags are visible and this one is absent: no group
                value = imds_get(f"meta-data/tags/instance/{ASG_TAG}")
                if value:
                    return value.strip()
        except Exception as exc:
            log.debug("cloudwatch: instance tags from IMDS unavailable: %s", exc)
    if ec2 is None or not instance_id:
        return None
    try:
        resp = ec2().describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]},
                                            {"Name": "key", "Values": [ASG_TAG]}])
    except Exception as exc:
        log.warning("cloudwatch: cannot look up the Auto Scaling group (ec2:DescribeTags, or enable "
                    "instance metadata tags); publishing without AutoScalingGroupName: %s", exc)
        return None
    for tag in resp.get("Tags", []):
        if tag.get("Key") == ASG_TAG and tag.get("Value"):
            return str(tag["Value"])
    return None


# -- errors ---------------------------------------------------------------------------------------

THROTTLING_CODES = {"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
                    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
                    "LimitExceededException", "SlowDown"}
CREDENTIAL_CODES = {"AccessDenied", "AccessDeniedException", "UnrecognizedClientException",
                    "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException",
                    "SignatureDoesNotMatch", "AuthFailure", "MissingAuthenticationToken",
                    "IncompleteSignature", "InvalidAccessKeyId", "NotAuthorized"}
# The pre-2022 answer to a batch over the datum limit: "The collection MetricData must not have a size
# greater than 20."
_OLD_LIMIT = re.compile(r"must not have a size greater than (\d+)")


def classify(exc: BaseException) -> tuple[str, Optional[int]]:
    """(kind, the endpoint's datum limit if it stated one). Kinds: throttling, credentials, network,
    server, too_large, rejected, config, other. Only `rejected` loses the batch."""
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        limit = _OLD_LIMIT.search(str(err.get("Message", "")))
        if limit:
            return "too_large", int(limit.group(1))
        if code in THROTTLING_CODES or status == 429:
            return "throttling", None
        if code in CREDENTIAL_CODES or status in (401, 403):
            return "credentials", None
        if status == 413 or code == "RequestEntityTooLarge":
            return "too_large", None
        if status >= 500 or code in ("InternalServiceFault", "InternalFailure", "ServiceUnavailable"):
            return "server", None
        return "rejected", None
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError)):
        return "credentials", None
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError,
                        bx.ConnectionClosedError, bx.HTTPClientError)):
        return "network", None
    if isinstance(exc, bx.NoRegionError):
        return "config", None
    return "other", None


ERROR_KINDS = ("throttling", "credentials", "network", "server", "too_large", "rejected", "config", "other")

ClientFactory = Callable[..., Any]


def _default_client(region: Optional[str], endpoint_url: Optional[str], **kw: Any) -> Any:
    from agent.readers import aws

    return aws.client("cloudwatch", region, endpoint_url, **kw)


# -- the publisher --------------------------------------------------------------------------------

class CloudWatchPublisher:
    """The `cloudwatch` service: the sampler hands each snapshot to observe(), which only aggregates
    in memory; a thread of its own closes each period, keeps a bounded backlog and sends it with
    PutMetricData, so neither a slow nor a dead endpoint ever holds up sampling."""

    name = "cloudwatch"

    def __init__(self, cfg: Any, *, region: Optional[str] = None, instance_id: Optional[str] = None,
                 instance_type: Optional[str] = None,
                 autoscaling_group: Union[None, str, Callable[[], Optional[str]]] = None,
                 checks: Optional[Callable[[], Iterable[VerdictLike]]] = None,
                 probes: Optional[Callable[[], Iterable[ProbeResultLike]]] = None,
                 flush_interval: Optional[float] = None,
                 client_factory: ClientFactory = _default_client,
                 max_attempts: int = 3, wall: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.namespace: str = cfg.namespace
        self.period: int = int(cfg.period)
        self.region = region if region is not None else cfg.region
        self.endpoint_url: Optional[str] = cfg.endpoint_url
        self.flush_interval = float(flush_interval if flush_interval is not None
                                    else max(self.period, MIN_FLUSH_INTERVAL))
        # A sample may arrive just after its period ended (the sampler stamps a snapshot when the step
        # finishes); a period is closed this long after its end. A later sample still counts: CloudWatch
        # merges two statistic sets with the same timestamp.
        self.grace = min(1.0, self.period / 4)
        self.metrics, unknown = selected_metrics(cfg.include)
        if unknown:
            log.warning("cloudwatch: unknown metric names in include, ignored: %s (known: %s)",
                        ", ".join(unknown), ", ".join(SPECS))
        self._enabled = set(self.metrics)
        self._instance = (instance_id, instance_type)
        self._asg_source = autoscaling_group
        self._extra: dict[str, str] = dict(cfg.dimensions)
        self.dims: Dims = common_dimensions(instance_id, instance_type,
                                            autoscaling_group if isinstance(autoscaling_group, str) else None,
                                            self._extra)
        self._checks, self._probes = checks, probes
        self._probe_seen: dict[Dims, Any] = {}   # (Peer, Direction) -> timestamp of the result published
        self._client_factory = client_factory
        self._max_attempts = max_attempts
        self._wall = wall

        self._agg = PeriodAggregator(self.period)
        self._lock = threading.Lock()            # the aggregator: sampler thread vs publisher thread
        self._keys = {(m, d): SeriesKey(m, SPECS[m].unit, (("Direction", d),))
                      for m in self._enabled if SPECS[m].per == "direction" for d in DIRECTIONS}
        self._shaping = CounterIncrease()        # touched by the sampler thread only

        self.backlog = Backlog(int(cfg.backlog))
        self.limits = BatchLimits()
        self._blk = threading.Lock()             # backlog and counters: publisher thread vs scrapes
        self.published = 0
        self.failed = 0
        self.requests = {"success": 0, "error": 0}
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.last_success = 0.0
        self._logged: set[str] = set()

        self._client: Any = None
        self._final_client: Any = None
        self._stop = threading.Event()
        self._deadline = math.inf
        self._thread: Optional[threading.Thread] = None
        self.view = CloudWatchView(self)

    # -- sampler side: cheap, never blocks on I/O --------------------------------------------------
    def observe(self, snap: Any) -> None:
        """Fold one snapshot into the open periods (called by the sampler thread after each step)."""
        if self._stop.is_set():
            return
        t = float(snap.wall_time)
        en = self._enabled
        keys = self._keys
        samples: list[tuple[SeriesKey, float]] = []
        credits = snap.credits or {}
        rates = snap.instance_rates
        shaping = snap.shaping
        for d in DIRECTIONS:
            r = credits.get(d)
            if r is not None:
                if r.ratio is not None and "CreditRemainingRatio" in en:
                    samples.append((keys["CreditRemainingRatio", d], r.ratio))
                if "CreditExhaustionSeconds" in en:
                    samples.append((keys["CreditExhaustionSeconds", d],
                                    min(r.exhaustion_seconds, EXHAUSTION_CAP_SECONDS)))
                if r.remaining_bytes is not None and "CreditRemainingBytes" in en:
                    samples.append((keys["CreditRemainingBytes", d], r.remaining_bytes))
                if r.bucket_bytes is not None and "CreditBucketBytes" in en:
                    samples.append((keys["CreditBucketBytes", d], r.bucket_bytes))
                if "CreditRefillSeconds" in en:
                    samples.append((keys["CreditRefillSeconds", d],
                                    min(r.refill_seconds, EXHAUSTION_CAP_SECONDS)))
                if "Shaped" in en:
                    samples.append((keys["Shaped", d], 1.0 if r.shaped else 0.0))
                if "CreditExhausted" in en:
                    samples.append((keys["CreditExhausted", d], 1.0 if getattr(r, "exhausted", False) else 0.0))
            if "ThroughputBytesPerSecond" in en:
                if rates is not None and d in rates:
                    samples.append((keys["ThroughputBytesPerSecond", d], rates[d]))
                elif r is not None:
                    samples.append((keys["ThroughputBytesPerSecond", d], r.rate_bytes_per_second))
            if shaping and d in shaping and "ShapingEvents" in en:
                inc = self._shaping.update(d, int(shaping[d]))
                if inc is not None:
                    samples.append((keys["ShapingEvents", d], float(inc)))
        if samples:
            with self._lock:
                for key, value in samples:
                    self._agg.add(t, key, value)

    # -- service --------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cloudwatch-publisher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Close the open periods and send what fits in `timeout`; what is left is counted as dropped."""
        self._deadline = time.monotonic() + max(0.0, timeout - 0.05)
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join(max(0.0, timeout))
        if self._thread.is_alive():
            with self._blk:
                left = len(self.backlog)
            with self._lock:
                left += len(self._agg)
            log.warning("cloudwatch: stopped with a request in flight; about %d datapoints not sent", left)

    # -- publisher thread -----------------------------------------------------------------------
    def _setup(self) -> None:
        src = self._asg_source
        if callable(src):
            try:
                asg = src()
            except Exception as exc:
                log.warning("cloudwatch: Auto Scaling group lookup failed: %s", exc)
                asg = None
            self.dims = common_dimensions(self._instance[0], self._instance[1], asg, self._extra)
        log.info("cloudwatch: publishing %s to namespace %s every %ss (region=%s, dimensions=%s)",
                 ",".join(self.metrics), self.namespace, self.period, self.region or "default",
                 ",".join(f"{n}={v}" for n, v in self.dims))

    def _clients(self) -> bool:
        if self._client is not None:
            return True
        try:
            self._client = self._client_factory(self.region, self.endpoint_url,
                                                max_attempts=self._max_attempts)
            # For the last flush at SIGTERM: no retry (botocore's max_attempts counts retries), short
            # timeouts, so stop() keeps its deadline.
            self._final_client = self._client_factory(self.region, self.endpoint_url, max_attempts=0,
                                                      connect_timeout=0.5, read_timeout=1.0)
        except Exception as exc:
            self._client = None
            self._error(*classify(exc), exc)
            return False
        return True

    def _run(self) -> None:
        try:
            self._setup()
            while True:
                now = self._wall()
                nxt = (math.floor(now / self.flush_interval) + 1) * self.flush_interval + self.grace
                if self._stop.wait(max(0.0, nxt - now)):
                    break
                self._flush(self._wall() - self.grace, final=False)
            self._flush(self._wall(), final=True)
        except Exception:
            log.exception("cloudwatch: publisher thread failed; CloudWatch publishing stopped")

    def _sample_services(self, t: float) -> None:
        """Checks and probes are read here, in the publisher thread, once per flush: their callables
        may take locks of their own, and the sampler thread must not wait on them."""
        samples: list[tuple[float, SeriesKey, float]] = []
        en = self._enabled
        if self._checks is not None and ({"FailedChecks", "WarnedChecks"} & en):
            try:
                statuses = [v.status for v in self._checks()]
            except Exception as exc:
                self._error("other", None, exc)
                statuses = None
            if statuses is not None:
                if "FailedChecks" in en:
                    samples.append((t, SeriesKey("FailedChecks", "Count"), float(statuses.count("fail"))))
                if "WarnedChecks" in en:
                    samples.append((t, SeriesKey("WarnedChecks", "Count"), float(statuses.count("warn"))))
        if self._probes is not None and ({"ProbeThroughputBitsPerSecond", "ProbeSuccess"} & en):
            try:
                results = list(self._probes())
            except Exception as exc:
                self._error("other", None, exc)
                results = []
            for r in results:
                dims = (("Peer", str(r.peer)), ("Direction", str(r.direction)))
                ran = getattr(r, "timestamp", None)
                when = t
                if ran is not None:
                    if self._probe_seen.get(dims) == ran:
                        continue                  # already published, in the period it ran
                    self._probe_seen[dims] = ran
                    when = float(ran)
                if "ProbeThroughputBitsPerSecond" in en:
                    samples.append((when, SeriesKey("ProbeThroughputBitsPerSecond", "Bits/Second", dims),
                                    probe_bits_per_second(r)))
                if "ProbeSuccess" in en:
                    samples.append((when, SeriesKey("ProbeSuccess", "None", dims), 1.0 if r.success else 0.0))
        if samples:
            with self._lock:
                for when, key, value in samples:
                    self._agg.add(when, key, value)

    def _flush(self, close_at: float, final: bool) -> None:
        # Service figures land in the newest period being closed (or the open one, at the end).
        t = close_at if final else period_start(close_at, self.period) - 1e-3
        self._sample_services(t)
        with self._lock:
            datums = self._agg.close(close_at, self.dims, force=final)
        with self._blk:
            dropped = self.backlog.extend(datums)
            expired = self.backlog.expire(self._wall())
        if dropped or expired:
            log.debug("cloudwatch: backlog dropped %d oldest datapoints (%d expired)", dropped, expired)
        self._send(final)
        if final:
            with self._blk:
                left = self.backlog.drop_all("shutdown")
            if left:
                log.warning("cloudwatch: %d datapoints not sent before the stop timeout", left)

    def _send(self, final: bool) -> None:
        if not self._clients():
            return
        while True:
            if final and time.monotonic() >= self._deadline:
                return
            if not final and self._stop.is_set():
                return  # the final flush takes over with its deadline
            with self._blk:
                batch = self.backlog.peek_batch(self.namespace, self.limits)
            if not batch:
                return
            client = self._final_client if final else self._client
            try:
                client.put_metric_data(Namespace=self.namespace, MetricData=[d.to_api() for d in batch])
            except Exception as exc:
                kind, limit = classify(exc)
                with self._blk:
                    self.failed += len(batch)
                    self.requests["error"] += 1
                self._error(kind, limit, exc)
                if kind == "too_large" and ((limit and self.limits.limit_datums(limit))
                                            or (not limit and self.limits.halve())):
                    log.warning("cloudwatch: endpoint takes at most %d datapoints / %d bytes per request",
                                self.limits.max_datums, self.limits.max_bytes)
                    continue
                if kind in ("rejected", "too_large"):
                    with self._blk:
                        self.backlog.drop(len(batch), "rejected")
                    continue
                return  # keep the backlog; the next flush tries again
            with self._blk:
                self.backlog.pop(len(batch))
                self.published += len(batch)
                self.requests["success"] += 1
                self.last_success = self._wall()
            if self._logged:
                log.info("cloudwatch: publishing works again (after %s errors)", ", ".join(sorted(self._logged)))
                self._logged.clear()

    def _error(self, kind: str, _limit: Optional[int], exc: BaseException) -> None:
        """Count every error; log the first of each kind until publishing works again (no log storm)."""
        with self._blk:
            self.errors[kind] = self.errors.get(kind, 0) + 1
        if kind in self._logged:
            log.debug("cloudwatch: %s error again: %s", kind, exc)
            return
        self._logged.add(kind)
        level = logging.ERROR if kind in ("rejected", "config", "other") else logging.WARNING
        log.log(level, "cloudwatch: %s error, datapoints kept in the backlog (%d); further %s errors "
                "are only counted until publishing works again: %s", kind, len(self.backlog), kind, exc)

    def stats(self) -> dict[str, Any]:
        """A consistent copy of the counters, for the Prometheus view and for tests."""
        with self._blk:
            return {
                "published": self.published, "failed": self.failed, "dropped": dict(self.backlog.dropped),
                "backlog": len(self.backlog), "backlog_capacity": self.backlog.capacity,
                "last_success": self.last_success, "requests": dict(self.requests),
                "errors": dict(self.errors), "refused": self._agg.refused + self._agg.invalid,
            }


class CloudWatchView:
    """burstwatch_cloudwatch_* on /metrics: how publishing goes (renders counters, no I/O)."""

    def __init__(self, publisher: CloudWatchPublisher) -> None:
        self._pub = publisher

    def collect(self) -> Iterable[Metric]:
        s = self._pub.stats()
        p = f"{NS}_cloudwatch"
        yield CounterMetricFamily(f"{p}_datapoints_published", "Datapoints (statistic sets) CloudWatch "
                                  "accepted.", value=s["published"])
        yield CounterMetricFamily(f"{p}_datapoints_failed", "Datapoints in PutMetricData calls that failed "
                                  "after retries (kept in the backlog and counted again on each try, "
                                  "unless rejected).", value=s["failed"])
        dropped = CounterMetricFamily(f"{p}_datapoints_dropped", "Datapoints given up: backlog_full (oldest "
                                      "dropped to keep the newest), expired (older than CloudWatch takes), "
                                      "rejected (invalid), shutdown (unsent at stop), aggregator_full.",
                                      labels=["reason"])
        for reason, n in sorted(s["dropped"].items()):
            dropped.add_metric([reason], n)
        dropped.add_metric(["aggregator_full"], s["refused"])
        yield dropped
        yield GaugeMetricFamily(f"{p}_backlog_datapoints", "Datapoints waiting to be sent.", value=s["backlog"])
        yield GaugeMetricFamily(f"{p}_backlog_capacity_datapoints", "Most datapoints the backlog keeps "
                                "([cloudwatch] backlog).", value=s["backlog_capacity"])
        yield GaugeMetricFamily(f"{p}_last_success_timestamp_seconds", "Unix time of the last accepted "
                                "PutMetricData call; 0 before the first.", value=s["last_success"])
        req = CounterMetricFamily(f"{p}_requests", "PutMetricData calls by result (botocore's retries "
                                  "inside one call are not counted).", labels=["result"])
        for result, n in sorted(s["requests"].items()):
            req.add_metric([result], n)
        yield req
        err = CounterMetricFamily(f"{p}_errors", "Failed PutMetricData calls (and client set-up) by kind.",
                                  labels=["kind"])
        for kind, n in sorted(s["errors"].items()):
            err.add_metric([kind], n)
        yield err
