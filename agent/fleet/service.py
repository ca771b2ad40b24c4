"""The fleet service: publishes what this agent learns to S3 and adopts the fleet's consensus for its type."""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from agent import aws
from agent.config import FleetConfig
from agent.fleet.reader import PartitionReader, ReadResult
from agent.models.fleet import (
    ALLOWANCE_FIELDS,
    MAX_OBJECT_BYTES,
    REJECT_REASONS,
    AllowanceConsensus,
    Consensus,
    allowance_consensus,
    consensus,
    encode,
    is_allowance_line,
    object_key,
    worth_publishing,
)
from agent.models.units import bytes_to_gbit
from agent.writers.s3queue import RETRY_PAUSE, RETRY_PAUSE_MAX, UploadQueue
from agent.writers.spool import Spool
from agent.writers.statefile import JsonStore

log = logging.getLogger(__name__)

STATE_FILE = "fleet-published.json"
STATE_FORMAT = "burstwatch-fleet-published/1"
# Objects waiting in memory; the spool ([fleet] spool_max_objects) bounds what survives a restart.
BACKLOG = 100
# Where the IAM policy for these actions is documented (named in access-denied logs).
IAM_DOC = "docs/fleet.md#iam"


@dataclass(frozen=True)
class FleetStats:
    """The fleet service's counters at one instant."""

    published: int                      # objects S3 took
    publish_failures: int               # upload attempts that failed after botocore's retries
    backlog: int                        # objects waiting to be uploaded
    dropped: int                        # objects given up (backlog or spool full)
    objects_read: int                   # objects fetched (GET) and parsed, this run
    rejected: dict[str, int]            # objects ignored, by reason: garbage, foreign
    refresh_errors: dict[str, int]      # failed LIST/GET by kind (agent.aws.ERROR_KINDS)
    refreshes: int                      # reads of the partition that completed
    last_refresh_timestamp: float       # when the last one completed; 0 before the first
    consensus: Optional[Consensus]      # the consensus handed to on_consensus last
    requests: dict[str, int]            # S3 requests by action: list, get, put (put counts attempts)
    allowances: Optional[AllowanceConsensus] = None     # the one handed to on_allowances last


class FleetService:
    """One thread reads the type's partition at start and every refresh_interval and hands the consensus
    to `on_consensus` (None when there is none, or no longer one) and the allowances' consensus to
    `on_allowances` (each when it changed); it also turns what publish() and publish_allowances() queued
    into objects, at most one per publish_interval. Uploads go through an UploadQueue (its own retry
    thread, spooled under state_dir/spool/fleet), so neither job ever blocks the caller."""

    name = "fleet"

    def __init__(self, cfg: FleetConfig, *, instance_type: str, instance_id: Optional[str],
                 region: Optional[str], state_dir: str,
                 on_consensus: Callable[[Optional[Consensus]], None],
                 on_allowances: Optional[Callable[[AllowanceConsensus], None]] = None,
                 client_factory: Optional[Callable[[], Any]] = None, wall: Callable[[], float] = time.time,
                 retry_pause: Optional[float] = None, retry_pause_max: Optional[float] = None,
                 rng: Optional[random.Random] = None) -> None:
        self.cfg = cfg
        self.bucket = cfg.bucket or ""
        self.prefix = cfg.prefix
        self.instance_type = instance_type
        self.instance_id = instance_id
        self.on_consensus = on_consensus
        self.on_allowances = on_allowances
        self.wall = wall
        # Failed uploads and reads are retried at least as often as the fleet is read (lab: every 2 s).
        self.retry_pause_max = retry_pause_max if retry_pause_max is not None else \
            min(RETRY_PAUSE_MAX, cfg.refresh_interval)
        self.retry_pause = min(retry_pause if retry_pause is not None else RETRY_PAUSE, self.retry_pause_max)
        self._factory = client_factory or (lambda: aws.client("s3", region, cfg.endpoint_url))
        self._client: Any = None
        self._client_lock = threading.Lock()
        self.max_age_seconds = cfg.max_age_days * 86400.0
        self.reader = PartitionReader(self.bucket, cfg.prefix, instance_type, cfg.max_objects,
                                      self.max_age_seconds, rng)
        self.queue = UploadQueue(self.bucket, self._put_object, label="fleet publish", log=log,
                                 thread_name="fleet-upload", capacity=BACKLOG, client_factory=self._get_client,
                                 retry_pause=self.retry_pause, retry_pause_max=self.retry_pause_max, wall=wall)
        self.queue.on_uploaded = self._uploaded
        self.queue.on_failed = lambda key, exc: self._failed("s3:PutObject", f"s3://{self.bucket}/{key}", exc)
        self.spool = Spool(Path(state_dir) / "spool" / "fleet", "fleet", cfg.spool_max_objects,
                           cfg.spool_max_objects * MAX_OBJECT_BYTES)
        self.store = JsonStore(Path(state_dir) / STATE_FILE, STATE_FORMAT)
        self._cond = threading.Condition()
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._pending: dict[str, dict[str, Any]] = {}          # direction -> the latest learned record
        self._last: dict[str, dict[str, float]] = {}           # direction -> {"bucket_bytes", "at"} published
        self._pending_allowances: Optional[dict[str, Any]] = None   # the latest allowance_record()
        self._last_allowances: dict[str, dict[str, float]] = {}     # field -> {"value", "at"} published
        self._last_publish = 0.0                               # wall time of the last object queued
        self._dirty = False
        self._consensus: Optional[Consensus] = None
        self._allowances = AllowanceConsensus(None, 0, None, 0)
        self._objects_read = 0
        self._rejected = dict.fromkeys(REJECT_REASONS, 0)
        self._errors: dict[str, int] = {}
        self._requests = {"list": 0, "get": 0, "put": 0}
        self._refreshes = 0
        self._last_refresh = 0.0
        self._denied_logged: set[tuple[str, str]] = set()

    # -- the caller's side (the sampling thread) -----------------------------------------------------------
    def publish(self, records: list[dict[str, Any]]) -> None:
        """Queue learned_record() dicts for publication; returns at once (no S3, no disk here). The latest
        record per direction wins while publish_interval holds the next object back."""
        with self._cond:
            for r in records:
                self._pending[str(r["direction"])] = dict(r)
            self._dirty = True
            self._cond.notify_all()

    def publish_allowances(self, record: dict[str, Any]) -> None:
        """Queue an allowance_record() (learned PPS ceiling / conntrack size, no bucket); returns at once. It
        rides on the next bucket object when one goes out, else goes alone when a figure is worth it."""
        with self._cond:
            self._pending_allowances = dict(record)
            self._dirty = True
            self._cond.notify_all()

    def snapshot(self) -> FleetStats:
        q = self.queue.snapshot()
        with self._cond:
            return FleetStats(q.uploaded, q.failed, q.backlog, q.dropped, self._objects_read, dict(self._rejected),
                              dict(self._errors), self._refreshes, self._last_refresh, self._consensus,
                              dict(self._requests), self._allowances)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self._load_state()
        self.queue.use_spool(self.spool)
        self.queue.start()
        self._thread = threading.Thread(target=self._run, name="fleet", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop both threads; what is queued stays in the spool (and pending records in the state file)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.queue.stop(max(0.05, timeout / 2))
        if self._thread is not None:
            self._thread.join(max(0.05, deadline - time.monotonic()))

    def flush(self, timeout: float) -> bool:
        """Wait until nothing publishable is pending and the upload backlog is empty (tests)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._has_pending() and self._publish_wait() <= 0:
                if time.monotonic() >= deadline:
                    return False
                self._cond.wait(0.05)
        return self.queue.flush(max(0.0, deadline - time.monotonic()))

    # -- the thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        next_refresh = time.monotonic()
        pause = self.retry_pause
        while True:
            with self._cond:
                if self._stop:
                    break
            self._publish_due()
            if time.monotonic() >= next_refresh:
                if self.refresh():
                    pause = self.retry_pause
                    next_refresh = time.monotonic() + self.cfg.refresh_interval
                else:
                    # A failed read (S3 down at boot) is retried sooner than the next refresh, backing off.
                    next_refresh = time.monotonic() + min(pause, self.cfg.refresh_interval)
                    pause = min(pause * 2, self.retry_pause_max)
            with self._cond:
                wait = next_refresh - time.monotonic()
                if self._has_pending():
                    wait = min(wait, self._publish_wait())
                if not self._stop and wait > 0:
                    self._cond.wait(wait)
        self._save_state()

    def _has_pending(self) -> bool:
        return bool(self._pending) or self._pending_allowances is not None

    def _publish_wait(self) -> float:
        """Seconds until publish_interval lets the next object go (under the lock)."""
        if self._last_publish <= 0:
            return 0.0
        return max(0.0, self._last_publish + self.cfg.publish_interval - self.wall())

    def _publish_due(self) -> None:
        """Turn the pending records worth publishing into one object, when publish_interval allows; keep
        the state file current (pending records held back are in it, so a restart does not lose them)."""
        item: Optional[tuple[str, bytes]] = None
        with self._cond:
            if self._has_pending() and self._publish_wait() <= 0:
                now = self.wall()
                records = self._take_due(now)
                self._dirty = True
                if records:
                    # Never the second of the last object (kept across restarts): with publish_interval 0
                    # (lab) two objects in one second would otherwise overwrite each other.
                    epoch = max(int(now), int(self._last_publish) + 1)
                    key = object_key(self.prefix, self.instance_type, self.instance_id, epoch)
                    for r in records:
                        if not is_allowance_line(r):
                            self._last[str(r["direction"])] = {"bucket_bytes": float(r["bucket_bytes"]), "at": now}
                        for f in ALLOWANCE_FIELDS:
                            if r.get(f) is not None:
                                self._last_allowances[f] = {"value": float(r[f]), "at": now}
                    # The epoch used, when ahead of the clock: the next key must follow it, not `now`.
                    self._last_publish = max(now, float(epoch))
                    item = (key, encode(records))
            save, self._dirty = self._dirty, False
        if item is not None:
            # Spooled before the state file says "published": a kill in between publishes twice, never
            # not at all.
            self.queue.submit(*item)
            log.info("fleet: publishing s3://%s/%s", self.bucket, item[0])
        if save:
            self._save_state()

    def _take_due(self, now: float) -> list[dict[str, Any]]:
        """Empty the pending records into what one object carries (under the lock): the bucket lines worth
        publishing, with the pending allowances riding on them; else the allowance line alone when one of
        its figures is worth it. Never both kinds in one object: a reader of before allowance lines rejects
        an object whole, and must not lose the bucket lines with it (docs/fleet.md, "The object")."""
        records = [r for d, r in sorted(self._pending.items())
                   if worth_publishing(self._last.get(d, {}).get("bucket_bytes"),
                                       self._last.get(d, {}).get("at"), float(r["bucket_bytes"]), now)]
        allow, self._pending_allowances = self._pending_allowances, None
        self._pending.clear()
        if allow is None:
            return records
        if records:
            return [{**r, **{f: allow[f] for f in ALLOWANCE_FIELDS if r.get(f) is None}} for r in records]
        due = any(allow.get(f) is not None and
                  worth_publishing(self._last_allowances.get(f, {}).get("value"),
                                   self._last_allowances.get(f, {}).get("at"), float(allow[f]), now)
                  for f in ALLOWANCE_FIELDS)
        return [allow] if due else []

    # -- reading -----------------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read the partition once and hand a changed consensus to on_consensus; False when S3 failed
        (the consensus in force is kept: an outage is no evidence against it)."""
        now = self.wall()
        res: Optional[ReadResult] = None
        client = self._get_client_counted("s3:ListBucket")
        if client is not None:
            res = self.reader.read(client, now)
        with self._cond:
            if res is not None:
                self._objects_read += res.fetched
                for reason, n in res.rejected.items():
                    self._rejected[reason] = self._rejected.get(reason, 0) + n
                for action, n in res.requests.items():
                    self._requests[action] = self._requests.get(action, 0) + n
        if res is None:
            return False
        if res.error is not None:
            self._failed(res.error.action, res.error.target, res.error.cause)
            if res.keys == 0:
                return False                   # the LIST failed: nothing to judge by
        found = consensus(res.records, min_instances=self.cfg.min_instances, now=now,
                          max_age_seconds=self.max_age_seconds)
        allowances = allowance_consensus(res.records, min_instances=self.cfg.min_instances, now=now,
                                         max_age_seconds=self.max_age_seconds)
        with self._cond:
            changed = found != self._consensus
            self._consensus = found
            allowances_changed = allowances != self._allowances
            self._allowances = allowances
            if res.error is None:
                self._refreshes += 1
                self._last_refresh = self.wall()
        log.debug("fleet: read s3://%s/%s: %d keys, %d fetched, consensus %s", self.bucket,
                  self.reader.partition, res.keys, res.fetched, found)
        if changed:
            if found is not None:
                log.info("fleet: consensus for %s: %.0f bytes (%.1f Gbit) from %d instances (%d outliers, "
                         "spread %.2f)", self.instance_type, found.bucket_bytes, bytes_to_gbit(found.bucket_bytes),
                         found.instances, found.outliers, found.spread)
            else:
                log.info("fleet: no consensus for %s (fewer than %d instances agree)", self.instance_type,
                         self.cfg.min_instances)
            try:
                self.on_consensus(found)
            except Exception:  # the wiring's fault must not end the thread
                log.exception("fleet: on_consensus failed")
        if allowances_changed:
            log.info("fleet: allowances for %s: PPS ceiling %s (%d instances), conntrack size %s (%d instances)",
                     self.instance_type, allowances.pps_ceiling, allowances.pps_instances,
                     allowances.conntrack_size, allowances.conntrack_instances)
            try:
                if self.on_allowances is not None:
                    self.on_allowances(allowances)
            except Exception:  # the wiring's fault must not end the thread
                log.exception("fleet: on_allowances failed")
        return res.error is None

    # -- S3 ----------------------------------------------------------------------------------------------
    def _get_client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    def _get_client_counted(self, action: str) -> Any:
        try:
            return self._get_client()
        except Exception as exc:  # no boto3, no region, ...: counted like a failed request
            self._failed(action, f"s3://{self.bucket}/{self.reader.partition}", exc)
            return None

    def _put_object(self, client: Any, key: str, body: bytes) -> None:
        with self._cond:
            self._requests["put"] += 1
        client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/x-ndjson")

    def _uploaded(self, key: str) -> None:
        log.debug("fleet: published s3://%s/%s", self.bucket, key)

    def _failed(self, action: str, target: str, exc: BaseException) -> None:
        err = aws.classify(exc)
        with self._cond:
            if action != "s3:PutObject":        # uploads count in publish_failures
                self._errors[err.kind] = self._errors.get(err.kind, 0) + 1
            first = (action, err.kind) not in self._denied_logged
            self._denied_logged.add((action, err.kind))
        if err.kind == "credentials" and first:
            log.error("fleet: access denied: %s on %s (%s): the instance role needs the policy in %s", action,
                      target, err.code or exc, IAM_DOC)
        elif first:
            log.warning("fleet: %s on %s failed (%s error): %s; retrying with backoff", action, target,
                        err.kind, exc)
        else:
            log.debug("fleet: %s on %s failed again (%s error): %s", action, target, err.kind, exc)

    # -- state -------------------------------------------------------------------------------------------
    def _load_state(self) -> None:
        doc = self.store.load()
        if doc is None:
            return
        with self._cond:
            try:
                for d, v in (doc.get("published") or {}).items():
                    self._last[str(d)] = {"bucket_bytes": float(v["bucket_bytes"]), "at": float(v["at"])}
                self._last_publish = float(doc.get("last_publish") or 0.0)
                for d, r in (doc.get("pending") or {}).items():
                    self._pending.setdefault(str(d), dict(r))
                # Absent from the state of agents before allowance lines: nothing published yet.
                for f, v in (doc.get("published_allowances") or {}).items():
                    self._last_allowances[str(f)] = {"value": float(v["value"]), "at": float(v["at"])}
                if self._pending_allowances is None and isinstance(doc.get("pending_allowances"), dict):
                    self._pending_allowances = dict(doc["pending_allowances"])
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                log.warning("fleet: %s unreadable, starting afresh: %s", self.store.path, exc)
                self._last.clear()
                self._last_allowances.clear()
                self._last_publish = 0.0

    def _save_state(self) -> None:
        with self._cond:
            doc = {"published": {d: dict(v) for d, v in self._last.items()}, "last_publish": self._last_publish,
                   "pending": {d: dict(r) for d, r in self._pending.items()},
                   "published_allowances": {f: dict(v) for f, v in self._last_allowances.items()},
                   "pending_allowances": self._pending_allowances}
        self.store.save(doc)
