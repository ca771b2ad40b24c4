"""The `cloudwatch` service: fold each snapshot into statistic sets (aggregation.py), keep closed periods in a
bounded backlog spooled to state_dir (backlog.py) and send it with PutMetricData (sender.py), off the
sampling path, on a thread of its own."""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

from agent import aws
from agent.cloudwatch.aggregation import Aggregation, VerdictLike
from agent.cloudwatch.backlog import SpooledBacklog
from agent.cloudwatch.dimensions import aggregation_sets, common_dimensions
from agent.cloudwatch.policy import PublishPolicy, next_steady, phase
from agent.cloudwatch.sender import ClientFactory, Sender
from agent.config import CloudWatchConfig
from agent.models.cw_aggregate import Dims, period_start
from agent.models.figures import CLOUDWATCH_METRICS, ProbeResultLike, selected_metrics
from agent.writers.spool import Spool

if TYPE_CHECKING:
    from agent.sampling.pipeline import Snapshot

log = logging.getLogger(__name__)

# While an alarm's condition holds, a flush at most this often when the period is shorter (high
# resolution): each flush is one request, and requests are billed ($0.01 per 1,000, docs/cloudwatch.md).
# A condition that starts or ends is sent at once whatever the period.
MIN_FLUSH_INTERVAL = 10.0

@dataclass(frozen=True)
class PublisherSnapshot:
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
        # Steady flushes at this instance's phase of the interval; periods close (and urgent ones go out)
        # every `tick` (docs/cloudwatch.md, "Requests at fleet scale").
        self.flush_interval = cfg.steady_flush_interval
        self.tick = min(float(self.period), self.flush_interval)
        # Periods close (and alarm periods go out) this long after they end, different for each instance: a
        # group draining together must not call all in the same second (500 TPS is per account and Region).
        self._tick_offset = phase(instance_id, min(MIN_FLUSH_INTERVAL, self.tick / 4))
        self._last_send = -math.inf
        self._phase = phase(instance_id, self.flush_interval)
        self._backoff = 0.0                      # after throttling: seconds to wait before the next call
        self._not_before = 0.0
        self._next_steady = next_steady(wall(), self.flush_interval, self._phase)
        # A sample may arrive just after its period ended (the sampler stamps a snapshot when the sample
        # is taken); a period is closed this long after its end. A later sample still counts: CloudWatch
        # merges two statistic sets with the same timestamp.
        self.grace = min(1.0, self.period / 4)
        self.metrics, unknown = selected_metrics(cfg.include)
        if unknown:
            log.warning("cloudwatch: unknown metric names in include, ignored: %s (known: %s)",
                        ", ".join(unknown), ", ".join(CLOUDWATCH_METRICS))
        self._instance = (instance_id, instance_type)
        self._asg_source = autoscaling_group
        self._extra: dict[str, str] = dict(cfg.dimensions)
        self.dims: Dims = common_dimensions(instance_id, instance_type,
                                            autoscaling_group if isinstance(autoscaling_group, str) else None,
                                            self._extra)
        self._wall = wall
        spool = None
        if spool_dir is not None and cfg.spool:
            spool = Spool(Path(spool_dir), "cloudwatch", cfg.spool_max_batches, cfg.spool_max_bytes)
        self.spool: Optional[Spool] = spool
        self._lock = threading.Lock()            # backlog and counters: publisher thread vs scrapes
        self.backlog = SpooledBacklog(self.namespace, int(cfg.backlog), spool, self._lock)
        self.sender = Sender(self.namespace, self.region, cfg.endpoint_url, self.backlog, client_factory,
                             max_attempts, wall)
        self.limits = self.sender.limits
        self._agg = Aggregation(self.period, self.metrics, checks, probes, on_error=self.sender.error)
        self.policy = self._policy()
        self._stop = threading.Event()
        self._deadline = math.inf
        self._thread: Optional[threading.Thread] = None

    # -- sampler side: cheap, never blocks on I/O --------------------------------------------------
    def observe(self, snap: Snapshot) -> None:
        """Fold one snapshot into the open periods (called by the sampler thread after each sample)."""
        if not self._stop.is_set():
            self._agg.observe(snap)

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
            with self._lock:
                left = len(self.backlog)
            left += len(self._agg)
            if self.spool is not None:
                log.warning("cloudwatch: stopped with a request in flight; about %d datapoints not sent (those "
                            "in the spool go out after the next start)", left)
            else:
                log.warning("cloudwatch: stopped with a request in flight; about %d datapoints not sent", left)

    def snapshot(self) -> PublisherSnapshot:
        """A consistent copy of the counters, for the Prometheus view and for tests."""
        s = self.sender
        with self._lock:
            return PublisherSnapshot(
                published=s.published, failed=s.failed, dropped=dict(self.backlog.backlog.dropped),
                backlog=len(self.backlog), backlog_capacity=self.backlog.backlog.capacity,
                last_success=s.last_success, requests=dict(s.requests), errors=dict(s.errors),
                refused=self._agg.refused)

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
            self.policy = self._policy()
        log.info("cloudwatch: publishing %s to namespace %s every %ss (region=%s, per group: %s; per instance "
                 "%s: %s; steady flush every %gs)", ",".join(self.metrics), self.namespace, self.period,
                 self.region or "default",
                 "; ".join(",".join(f"{n}={v}" for n, v in s) or "(all)" for s in self.policy.group_sets) or "none",
                 self.cfg.per_instance, ",".join(f"{n}={v}" for n, v in self.dims), self.flush_interval)
        if self.backlog.replay():
            self._send(False)

    def _policy(self) -> PublishPolicy:
        sets = aggregation_sets(self.cfg.aggregation_dimensions, self.dims)
        return PublishPolicy(self.cfg.per_instance, self.dims, sets, 1 if self.period < 60 else 60,
                             self.cfg.alarm_horizon)

    def _run(self) -> None:
        try:
            self._setup()
            self._next_steady = next_steady(self._wall(), self.flush_interval, self._phase)
            while True:
                now = self._wall()
                nxt = next_steady(now - self.grace, self.tick, self._tick_offset) + self.grace
                if self._stop.wait(max(0.0, nxt - now)):
                    break
                self._flush(self._wall() - self.grace, final=False)
            self._flush(self._wall(), final=True)
        except Exception:
            log.exception("cloudwatch: publisher thread failed; CloudWatch publishing stopped")

    def _send(self, final: bool) -> None:
        kind = self.sender.send(final, self._stop.is_set, self._deadline)
        if kind == "throttling":
            # CloudWatch's request quota is the account's, shared with every other publisher: botocore's
            # retries already backed off within the call; now wait longer, doubling up to the steady
            # interval, with full jitter (nothing is lost: the backlog and its spool keep the datums).
            self._backoff = min(self.flush_interval, max(float(self.period), 2.0 * self._backoff))
            self._not_before = self._wall() + random.uniform(0.5, 1.0) * self._backoff
            log.debug("cloudwatch: throttled, next call in %.0fs at the earliest", self._not_before - self._wall())
        elif kind is None:
            self._backoff = 0.0

    def _flush(self, close_at: float, final: bool) -> None:
        # Service figures land in the newest period being closed (or the open one, at the end).
        t = close_at if final else period_start(close_at, self.period) - 1e-3
        self._agg.sample_services(t)
        datums: list[Any] = []
        urgent = False
        for start, bucket in self._agg.close_periods(close_at, force=final):
            mine, hurry = self.policy.take(start, bucket)
            datums += mine
            urgent = urgent or hurry
        dropped, expired = self.backlog.add_flush(datums, self._wall())
        if dropped or expired:
            log.debug("cloudwatch: backlog dropped %d oldest datapoints (%d expired)", dropped, expired)
        now = self._wall()
        steady = now >= self._next_steady
        if steady:
            self._next_steady = next_steady(now, self.flush_interval, self._phase)
        holding = bool(self.policy.alarming) and now - self._last_send >= MIN_FLUSH_INTERVAL - self.grace
        if final or ((urgent or holding or steady) and now >= self._not_before):
            self._last_send = now
            self._send(final)
        if final:
            left, kept = self.backlog.give_up()
            if left:
                log.warning("cloudwatch: %d datapoints not sent before the stop timeout", left)
            if kept:
                log.info("cloudwatch: %d datapoints not sent yet are kept in the spool for the next start", kept)
