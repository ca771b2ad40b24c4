"""The `cloudwatch` service: fold each snapshot into statistic sets, send them with PutMetricData off the
sampling path, and ride out an outage with a bounded backlog, spooled to state_dir across restarts."""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Protocol, TypedDict, Union

from agent.cloudwatch.catalogue import (
    EXHAUSTION_CAP_SECONDS,
    SPECS,
    common_dimensions,
    probe_bits_per_second,
    selected_metrics,
)
from agent.config import CloudWatchConfig
from agent.models.cw_aggregate import Backlog, BatchLimits, Datum, Dims, PeriodAggregator, SeriesKey, period_start
from agent.models.units import DIRECTIONS
from agent.readers import aws
from agent.readers.aws import ERROR_KINDS, classify
from agent.writers.spool import Spool

if TYPE_CHECKING:
    from agent.sampling.pipeline import Snapshot

log = logging.getLogger(__name__)

# A flush at most this often when the period is shorter (high resolution): each flush is one request,
# and requests are billed ($0.01 per 1,000, docs/cloudwatch.md).
MIN_FLUSH_INTERVAL = 10.0
SPOOL_FORMAT = "burstwatch-cloudwatch-spool/1"


def encode_batch(namespace: str, datums: Iterable[Datum]) -> bytes:
    """One spool record: the datums one flush closed, with the namespace they were meant for."""
    rows = [[d.name, d.unit, [list(p) for p in d.dims], d.timestamp, d.sample_count, d.total, d.minimum,
             d.maximum, d.storage_resolution] for d in datums]
    return json.dumps({"format": SPOOL_FORMAT, "namespace": namespace, "datums": rows},
                      separators=(",", ":")).encode("utf-8")


def decode_batch(payload: bytes) -> tuple[str, list[Datum]]:
    """(namespace, datums) of a spool record; ValueError when it is not one."""
    try:
        doc = json.loads(payload.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != SPOOL_FORMAT:
            raise ValueError(f"not a {SPOOL_FORMAT} record")
        datums = [Datum(str(name), str(unit), tuple((str(k), str(v)) for k, v in dims), float(ts), float(n),
                        float(total), float(lo), float(hi), int(res))
                  for name, unit, dims, ts, n, total, lo, hi, res in doc["datums"]]
        return str(doc["namespace"]), datums
    except (KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed spool record: {exc}") from exc


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

    The rate is `bits_per_second`, or else `throughput_bytes_per_second` (catalogue.probe_bits_per_second);
    a result with a `timestamp` (Unix time the probe ran) is published once, in the period it ran, and one
    without is published as the latest value at every flush."""

    @property
    def peer(self) -> str: ...

    @property
    def direction(self) -> str: ...     # in | out

    @property
    def success(self) -> bool: ...


class PublisherStats(TypedDict):
    """How publishing goes, copied under the publisher's lock (what the Prometheus view renders)."""

    published: int
    failed: int
    dropped: dict[str, int]
    backlog: int
    backlog_capacity: int
    last_success: float
    requests: dict[str, int]
    errors: dict[str, int]
    refused: int


ClientFactory = Callable[..., Any]
# _consumed()'s answer: spool records to delete, and the head record to rewrite with its datums left.
_SpoolWork = tuple[list[int], Optional[tuple[int, list[Datum]]]]


class _Chunk:
    """One flush's datums in the backlog: its spool record (None: memory only), the datums, how many of
    them are still waiting (the last `left`), and how many the record file holds."""

    __slots__ = ("datums", "left", "rid", "written")

    def __init__(self, rid: Optional[int], datums: list[Datum]) -> None:
        self.rid = rid
        self.datums = datums
        self.left = self.written = len(datums)


def _default_client(region: Optional[str], endpoint_url: Optional[str], **kw: Any) -> Any:
    return aws.client("cloudwatch", region, endpoint_url, **kw)


class CloudWatchPublisher:
    """The `cloudwatch` service: the sampler hands each snapshot to observe(), which only aggregates
    in memory; a thread of its own closes each period, keeps a bounded backlog and sends it with
    PutMetricData, so neither a slow nor a dead endpoint ever holds up sampling.

    `cfg` is the [cloudwatch] section. It has no reconfigure(): the section is marked `restart` in
    agent/config.py (the clients, the period, the series and their dimensions are set up once, and a period
    half aggregated under old settings must not be sent under new ones). `region` is the instance's (from
    IMDS), used when the section names none; `autoscaling_group` is the group's name or a callable that
    looks it up (agent.readers.autoscaling), called once in the publisher's thread; `checks` and `probes`
    return the latest verdicts and probe results, read once per flush.

    With `spool_dir` (and [cloudwatch] spool on), every flush's datums are written there before they are
    sent (one file per flush: agent/writers/spool.py) and deleted once CloudWatch accepted them, so a
    restart or a kill during an outage loses no closed period: the next start sends them first, in order.
    Only the period still open at a kill -9 (at most one period and the grace) is lost."""

    name = "cloudwatch"

    def __init__(self, cfg: CloudWatchConfig, *, region: Optional[str] = None, instance_id: Optional[str] = None,
                 instance_type: Optional[str] = None,
                 autoscaling_group: Union[None, str, Callable[[], Optional[str]]] = None,
                 checks: Optional[Callable[[], Iterable[VerdictLike]]] = None,
                 probes: Optional[Callable[[], Iterable[ProbeResultLike]]] = None,
                 client_factory: ClientFactory = _default_client,
                 max_attempts: int = 3, wall: Callable[[], float] = time.time,
                 spool_dir: Union[None, str, Path] = None) -> None:
        self.cfg = cfg
        self.namespace: str = cfg.namespace
        self.period: int = int(cfg.period)
        self.region = cfg.region or region
        self.endpoint_url: Optional[str] = cfg.endpoint_url
        self.flush_interval = float(cfg.flush_interval if cfg.flush_interval is not None
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

        self.backlog = Backlog(int(cfg.backlog))
        self.limits = BatchLimits()
        self._blk = threading.Lock()             # backlog and counters: publisher thread vs scrapes
        self.published = 0
        self.failed = 0
        self.requests = {"success": 0, "error": 0}
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.last_success = 0.0
        self._logged: set[str] = set()
        # The backlog's datums by flush (and spool record), oldest first; only the head may be partly sent.
        # Changed by the publisher thread only, under _blk like the backlog.
        self.spool: Optional[Spool] = None
        if spool_dir is not None and cfg.spool:
            self.spool = Spool(Path(spool_dir), "cloudwatch", cfg.spool_max_batches, cfg.spool_max_bytes)
        self._chunks: collections.deque[_Chunk] = collections.deque()

        self._client: Any = None
        self._final_client: Any = None
        self._stop = threading.Event()
        self._deadline = math.inf
        self._thread: Optional[threading.Thread] = None

    # -- sampler side: cheap, never blocks on I/O --------------------------------------------------
    def observe(self, snap: Snapshot) -> None:
        """Fold one snapshot into the open periods (called by the sampler thread after each step).

        ShapingEvents is the shaping reading's `increase`, the one the sampler computed for the credit
        model too (none on the first reading, which only sets the baseline)."""
        if self._stop.is_set():
            return
        t = float(snap.wall_time)
        en = self._enabled
        keys = self._keys
        samples: list[tuple[SeriesKey, float]] = []
        credits = snap.credits or {}
        rates = snap.instance_rates
        shaping = snap.shaping.increase if snap.shaping is not None else {}
        for d in DIRECTIONS:
            r = credits.get(d)
            if r is not None:
                if r.ratio is not None and "CreditRemainingRatio" in en:
                    samples.append((keys["CreditRemainingRatio", d], r.ratio))
                if "CreditExhaustionSeconds" in en:
                    samples.append((keys["CreditExhaustionSeconds", d],
                                    min(r.exhaustion_seconds, EXHAUSTION_CAP_SECONDS)))
                if "CreditExhaustionTrendSeconds" in en:
                    samples.append((keys["CreditExhaustionTrendSeconds", d],
                                    min(r.exhaustion_trend_seconds, EXHAUSTION_CAP_SECONDS)))
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
                    samples.append((keys["CreditExhausted", d], 1.0 if r.exhausted else 0.0))
            if "ThroughputBytesPerSecond" in en:
                if rates is not None and d in rates:
                    samples.append((keys["ThroughputBytesPerSecond", d], rates[d]))
                elif r is not None:
                    samples.append((keys["ThroughputBytesPerSecond", d], r.rate_bytes_per_second))
            if d in shaping and "ShapingEvents" in en:
                samples.append((keys["ShapingEvents", d], float(shaping[d])))
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
            if self.spool is not None:
                log.warning("cloudwatch: stopped with a request in flight; about %d datapoints not sent (those "
                            "in the spool go out after the next start)", left)
            else:
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
        if self.spool is not None:
            self._replay(self.spool)

    def _replay(self, spool: Spool) -> None:
        """Put what an earlier run spooled at the head of the backlog, in order, and send it at once."""
        n = kept = 0
        foreign: set[str] = set()
        for rid, payload in spool.load():
            try:
                namespace, datums = decode_batch(payload)
            except ValueError as exc:
                log.warning("cloudwatch: spool record %d unreadable, removed: %s", rid, exc)
                spool.remove(rid)
                continue
            if namespace != self.namespace:
                # Sent under another namespace they would be series nobody asked for.
                foreign.add(namespace)
                spool.remove(rid)
                continue
            n += 1
            kept += len(datums)
            self._enqueue(datums, rid)
        if foreign:
            log.warning("cloudwatch: spooled datapoints for namespace(s) %s dropped: the namespace is now %s",
                        ", ".join(sorted(foreign)), self.namespace)
        if n:
            log.info("cloudwatch: %d datapoints from %d spooled flushes to send first", kept, n)
            self._send(False)

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
            self._error(classify(exc).kind, exc)
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
                self._error("other", exc)
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
                self._error("other", exc)
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
        rid: Optional[int] = None
        if datums and self.spool is not None:
            # Written before the first try, so a kill during the request loses nothing.
            rid, evicted = self.spool.append(encode_batch(self.namespace, datums))
            self._evicted(evicted)
        dropped = self._enqueue(datums, rid)
        with self._blk:
            expired = self.backlog.expire(self._wall())
            work = self._consumed(expired)
        self._sync(work)
        if dropped or expired:
            log.debug("cloudwatch: backlog dropped %d oldest datapoints (%d expired)", dropped, expired)
        self._send(final)
        if final:
            with self._blk:
                # Datums in the spool wait for the next start; only the memory-only ones are given up.
                kept = sum(c.left for c in self._chunks if c.rid is not None)
                if not kept:
                    left = self.backlog.drop_all("shutdown")
                    self._chunks.clear()
                else:
                    left = len(self.backlog) - kept
                    self.backlog.dropped["shutdown"] += left
            if left:
                log.warning("cloudwatch: %d datapoints not sent before the stop timeout", left)
            if kept:
                log.info("cloudwatch: %d datapoints not sent yet are kept in the spool for the next start", kept)

    # -- backlog and spool, kept in step (publisher thread) -------------------------------------------
    def _enqueue(self, datums: list[Datum], rid: Optional[int]) -> int:
        """Append one flush's datums (spool record `rid`); returns how many old ones the bound dropped."""
        if not datums:
            return 0
        with self._blk:
            self._chunks.append(_Chunk(rid, datums))
            dropped = self.backlog.extend(datums)
            files = self._consumed(dropped)
        self._sync(files)
        return dropped

    def _consumed(self, n: int) -> _SpoolWork:
        """Under _blk, after `n` datums left the head of the backlog (sent, dropped or expired): the spool
        records now wholly gone, and the head record to rewrite with what is left of it (so a restart
        never sends its sent part again)."""
        gone: list[int] = []
        while n > 0 and self._chunks:
            head = self._chunks[0]
            take = min(n, head.left)
            head.left -= take
            n -= take
            if head.left == 0:
                self._chunks.popleft()
                if head.rid is not None:
                    gone.append(head.rid)
        rewrite = None
        if self._chunks and self._chunks[0].rid is not None and self._chunks[0].left < self._chunks[0].written:
            head = self._chunks[0]
            rid = head.rid
            assert rid is not None
            rewrite = (rid, head.datums[len(head.datums) - head.left:])
            head.written = head.left
        return gone, rewrite

    def _sync(self, work: _SpoolWork) -> None:
        """Apply _consumed()'s answer to the spool (file I/O, outside the lock)."""
        if self.spool is None:
            return
        gone, rewrite = work
        for rid in gone:
            self.spool.remove(rid)
        if rewrite is not None and not self.spool.replace(rewrite[0], encode_batch(self.namespace, rewrite[1])):
            with self._blk:
                for c in self._chunks:
                    if c.rid == rewrite[0]:
                        c.rid = None           # replace() removed the file: memory only from now

    def _evicted(self, rids: list[int]) -> None:
        """The spool dropped its oldest records to stay in bounds: drop their datums (and any older
        memory-only ones) from the backlog too, so memory and disk hold the same datums."""
        if not rids:
            return
        with self._blk:
            wanted = set(rids)
            drop = {c.rid for c in self._chunks if c.rid is not None and c.rid in wanted}
            n = 0
            while drop and self._chunks:
                c = self._chunks.popleft()
                n += c.left
                if c.rid is not None:
                    drop.discard(c.rid)
            self.backlog.drop(n, "backlog_full")

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
                err = classify(exc)
                kind, limit = err.kind, err.limit
                with self._blk:
                    self.failed += len(batch)
                    self.requests["error"] += 1
                self._error(kind, exc)
                if kind == "too_large" and ((limit and self.limits.limit_datums(limit))
                                            or (not limit and self.limits.halve())):
                    log.warning("cloudwatch: endpoint takes at most %d datapoints / %d bytes per request",
                                self.limits.max_datums, self.limits.max_bytes)
                    continue
                if kind in ("rejected", "too_large"):
                    with self._blk:
                        self.backlog.drop(len(batch), "rejected")
                        work = self._consumed(len(batch))
                    self._sync(work)
                    continue
                return  # keep the backlog; the next flush tries again
            with self._blk:
                self.backlog.pop(len(batch))
                self.published += len(batch)
                self.requests["success"] += 1
                self.last_success = self._wall()
                work = self._consumed(len(batch))
            self._sync(work)
            if self._logged:
                log.info("cloudwatch: publishing works again (after %s errors)", ", ".join(sorted(self._logged)))
                self._logged.clear()

    def _error(self, kind: str, exc: BaseException) -> None:
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

    def stats(self) -> PublisherStats:
        """A consistent copy of the counters, for the Prometheus view and for tests."""
        with self._blk:
            return {
                "published": self.published, "failed": self.failed, "dropped": dict(self.backlog.dropped),
                "backlog": len(self.backlog), "backlog_capacity": self.backlog.capacity,
                "last_success": self.last_success, "requests": dict(self.requests),
                "errors": dict(self.errors), "refused": self._agg.refused + self._agg.invalid,
            }
