"""Archive each probe's iperf3 JSON to S3, gzipped and partitioned by day for Athena ([seed-001]'s layout)."""

from __future__ import annotations

import collections
import copy
import datetime
import gzip
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple, Optional

from agent.readers import aws
from agent.readers.spool import Spool

log = logging.getLogger(__name__)

# Objects waiting while S3 is unreachable; a 5 s probe's document is ~5-20 kB gzipped, so the default
# costs a few MB at most. When full the oldest is dropped: the newest results matter most.
DEFAULT_BACKLOG = 500
# Pause after a failed upload (botocore's standard mode has already retried it), doubling up to the cap.
RETRY_PAUSE = 2.0
RETRY_PAUSE_MAX = 300.0
# Keys are built from these; anything else in an instance type or id is replaced (S3 keys stay plain).
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class ArchiveStats:
    """The archive's self-metrics at one instant."""

    uploaded: int
    failed: int            # upload attempts that failed after botocore's retries
    dropped: int           # objects dropped because the backlog was full
    backlog: int           # objects waiting
    last_success_timestamp: float


def object_key(prefix: str, instance_type: str, timestamp: float, instance_id: Optional[str] = None) -> str:
    """`<prefix>d=YYYY-MM-DD/<instance-type>-<unix-ts>.json.gz` (seed 001), UTC date of the probe's start.

    With `instance_id` the name becomes `<instance-type>-<unix-ts>-<instance-id>.json.gz`: seed 001 ran
    one instance per type, but in a fleet many instances of one type finish probes in the same second
    (1000 instances x 8 probes an hour is two a second) and would overwrite each other's objects. The
    Athena table reads every object under the partition, so the query is the same either way. ([seed-001]
    is in docs/ec2-network-facts.md, "Sources".)"""
    ts = int(timestamp)
    day = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%d")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    name = f"{_SAFE.sub('_', instance_type) or 'unknown'}-{ts}"
    if instance_id:
        name += f"-{_SAFE.sub('_', instance_id)}"
    return f"{prefix}d={day}/{name}.json.gz"


def archive_document(doc: dict[str, Any], instance_type: str, region: str) -> dict[str, Any]:
    """The iperf3 document with top-level `instanceType` and `region` added, as seed 001 uploads it."""
    out = copy.copy(doc)
    out["instanceType"] = instance_type
    out["region"] = region
    return out


def encode(doc: dict[str, Any]) -> bytes:
    """One JSON object on one line, gzipped: the OpenX JsonSerDe reads one record per line, and Athena
    picks the codec from the .gz suffix."""
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8") + b"\n", mtime=0)


def spool_record(key: str, body: bytes) -> bytes:
    """One spool record: the object's key on the first line, then its gzipped body."""
    return key.encode("utf-8") + b"\n" + body


def parse_spool_record(payload: bytes) -> tuple[str, bytes]:
    key, sep, body = payload.partition(b"\n")
    if not sep or not key:
        raise ValueError("not a probe-archive spool record")
    return key.decode("utf-8"), body


class _Item(NamedTuple):
    key: str
    body: bytes
    rid: Optional[int]          # its spool record; None: memory only


def probe_timestamp(doc: dict[str, Any], default: float) -> float:
    """The test's start (`start.timestamp.timesecs`, which iperf3 and our engine both write)."""
    try:
        return float(doc["start"]["timestamp"]["timesecs"])
    except (KeyError, TypeError, ValueError):
        return default


class S3Archive:
    """Uploads on its own thread, so a slow or unreachable S3 never delays a probe. `submit()` only
    encodes and queues; a failed upload stays at the head of the backlog and is retried after a pause.

    With a spool (`use_spool()`, before `start()`), each object is also written to state_dir before its
    first upload and deleted once S3 took it, so a restart or a kill -9 during an outage loses none: the
    next start uploads them first, in order."""

    name = "probe-archive"

    def __init__(self, bucket: str, *, prefix: str = "", instance_type: Optional[str] = None,
                 region: Optional[str] = None, instance_id: Optional[str] = None,
                 bucket_region: Optional[str] = None, endpoint_url: Optional[str] = None,
                 backlog: int = DEFAULT_BACKLOG,
                 client: Any = None, client_factory: Optional[Callable[[], Any]] = None,
                 retry_pause: float = RETRY_PAUSE, retry_pause_max: float = RETRY_PAUSE_MAX,
                 wall: Callable[[], float] = time.time) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.instance_type = instance_type or "unknown"
        self.region = region or "unknown"
        self.instance_id = instance_id
        self.retry_pause = retry_pause
        self.retry_pause_max = retry_pause_max
        self.wall = wall
        self._client = client
        # `region` is the instance's (written into each document); the bucket may live elsewhere.
        self._factory = client_factory or (lambda: aws.client("s3", bucket_region or region, endpoint_url))
        self.capacity = max(1, backlog)
        self._queue: collections.deque[_Item] = collections.deque()
        self.spool: Optional[Spool] = None
        self._cond = threading.Condition()
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._uploading = False
        self._last_key: Optional[str] = None
        self.uploaded = 0
        self.failed = 0
        self.dropped = 0
        self.last_success = 0.0

    # -- the probe thread's side -------------------------------------------------------------------------
    def submit(self, doc: dict[str, Any], timestamp: Optional[float] = None) -> str:
        """Queue one probe's document; returns its key. Never blocks on S3."""
        ts = probe_timestamp(doc, timestamp if timestamp is not None else self.wall())
        key = object_key(self.prefix, self.instance_type, ts, self.instance_id)
        body = encode(archive_document(doc, self.instance_type, self.region))
        with self._cond:
            if key == self._last_key:
                # Two probes in one second from this instance: keep both (the later one a second on).
                key = object_key(self.prefix, self.instance_type, ts + 1, self.instance_id)
            self._last_key = key
        rid: Optional[int] = None
        evicted: list[int] = []
        if self.spool is not None:
            # Written before the first upload, so a kill during it loses nothing.
            rid, evicted = self.spool.append(spool_record(key, body))
        self._add(_Item(key, body, rid), evicted)
        return key

    def _add(self, item: _Item, evicted: list[int]) -> None:
        """Queue an object after the others, dropping the oldest when the backlog or the spool is full."""
        gone: list[int] = []
        with self._cond:
            if evicted:
                # The spool made room by dropping its oldest records: memory drops the same objects.
                drop = set(evicted)
                kept = collections.deque(i for i in self._queue if i.rid is None or i.rid not in drop)
                self.dropped += len(self._queue) - len(kept)
                self._queue = kept
            while len(self._queue) >= self.capacity:
                old = self._queue.popleft()
                self.dropped += 1
                if old.rid is not None:
                    gone.append(old.rid)
                log.warning("probe archive backlog full (%d); dropping the oldest object", self.capacity)
            self._queue.append(item)
            self._cond.notify()
        self._forget(gone)

    def _forget(self, rids: Iterable[Optional[int]]) -> None:
        if self.spool is not None:
            for rid in rids:
                if rid is not None:
                    self.spool.remove(rid)

    def use_spool(self, spool: Spool) -> int:
        """Keep the backlog in `spool` too, and queue what an earlier run left there (oldest first, ahead
        of anything submitted later); returns how many objects that was. Call before start()."""
        self.spool = spool
        n = 0
        for rid, payload in spool.load():
            try:
                key, body = parse_spool_record(payload)
            except (ValueError, UnicodeDecodeError) as exc:
                log.warning("probe archive: spool record %d unreadable, removed: %s", rid, exc)
                spool.remove(rid)
                continue
            self._add(_Item(key, body, rid), [])
            n += 1
        if n:
            log.info("probe archive: %d objects spooled by an earlier run to upload first (bucket=%s)", n,
                     self.bucket)
        return n

    def stats(self) -> ArchiveStats:
        with self._cond:
            pending = len(self._queue) + (1 if self._uploading else 0)
            return ArchiveStats(self.uploaded, self.failed, self.dropped, pending, self.last_success)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="probe-archive", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop after the upload in progress (objects still queued are lost unless spooled: the next start
        uploads those)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def flush(self, timeout: float) -> bool:
        """Wait until the backlog is empty (tests, and a clean shutdown with time to spare)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._uploading:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    # -- the uploader ------------------------------------------------------------------------------------
    def _run(self) -> None:
        pause = self.retry_pause
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                item = self._queue.popleft()
                self._uploading = True
            ok = self._put(item.key, item.body)
            done = False
            with self._cond:
                self._uploading = False
                if ok:
                    self.uploaded += 1
                    self.last_success = self.wall()
                    pause = self.retry_pause
                    done = True
                else:
                    self.failed += 1
                    evicted = item.rid is not None and self.spool is not None and item.rid not in self.spool
                    if len(self._queue) >= self.capacity or evicted:
                        self.dropped += 1          # newer objects filled the backlog meanwhile
                        done = True
                    else:
                        self._queue.appendleft(item)
                self._cond.notify_all()
            if done:
                self._forget([item.rid])
            if not ok:
                with self._cond:
                    # New submissions do not cut the pause short; stop() does.
                    resume = time.monotonic() + pause
                    while not self._stop and time.monotonic() < resume:
                        self._cond.wait(resume - time.monotonic())
                pause = min(pause * 2, self.retry_pause_max)

    def _put(self, key: str, body: bytes) -> bool:
        try:
            if self._client is None:
                self._client = self._factory()
            self._client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/gzip")
        except Exception as exc:  # botocore raises many kinds; every one means "try again later"
            log.warning("probe archive upload failed (%s error): bucket=%s key=%s: %s", aws.classify(exc).kind,
                        self.bucket, key, exc)
            return False
        log.debug("probe archived: s3://%s/%s (%d bytes)", self.bucket, key, len(body))
        return True
