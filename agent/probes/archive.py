"""Archive each probe's iperf3 JSON to S3, gzipped and partitioned by day for Athena ([seed-001]'s layout)."""

from __future__ import annotations

import copy
import datetime
import gzip
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from agent import aws
from agent.writers import s3queue
from agent.writers.s3queue import RETRY_PAUSE, RETRY_PAUSE_MAX, UploadQueue
from agent.writers.spool import Spool

log = logging.getLogger(__name__)

# Objects waiting while S3 is unreachable; a 5 s probe's document is ~5-20 kB gzipped, so the default
# costs a few MB at most. When full the oldest is dropped: the newest results matter most.
DEFAULT_BACKLOG = 500
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
    return s3queue.spool_record(key, body)


def parse_spool_record(payload: bytes) -> tuple[str, bytes]:
    return s3queue.parse_spool_record(payload, "probe-archive")


def probe_timestamp(doc: dict[str, Any], default: float) -> float:
    """The test's start (`start.timestamp.timesecs`, which iperf3 and our engine both write)."""
    try:
        return float(doc["start"]["timestamp"]["timesecs"])
    except (KeyError, TypeError, ValueError):
        return default


class S3Archive:
    """Uploads on its own thread (agent.writers.s3queue.UploadQueue), so a slow or unreachable S3 never
    delays a probe. `submit()` only encodes and queues; a failed upload stays at the head of the backlog
    and is retried after a pause.

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
        self.wall = wall
        # `region` is the instance's (written into each document); the bucket may live elsewhere.
        factory = client_factory or (lambda: aws.client("s3", bucket_region or region, endpoint_url))
        self.queue = UploadQueue(bucket, self._put_object, label="probe archive", log=log,
                                 thread_name="probe-archive", capacity=backlog, client=client,
                                 client_factory=factory, retry_pause=retry_pause, retry_pause_max=retry_pause_max,
                                 wall=wall)
        self.capacity = self.queue.capacity
        self._lock = threading.Lock()
        self._last_key: Optional[str] = None

    @property
    def spool(self) -> Optional[Spool]:
        return self.queue.spool

    # -- the probe thread's side -------------------------------------------------------------------------
    def submit(self, doc: dict[str, Any], timestamp: Optional[float] = None) -> str:
        """Queue one probe's document; returns its key. Never blocks on S3."""
        ts = probe_timestamp(doc, timestamp if timestamp is not None else self.wall())
        key = object_key(self.prefix, self.instance_type, ts, self.instance_id)
        body = encode(archive_document(doc, self.instance_type, self.region))
        with self._lock:
            if key == self._last_key:
                # Two probes in one second from this instance: keep both (the later one a second on).
                key = object_key(self.prefix, self.instance_type, ts + 1, self.instance_id)
            self._last_key = key
        self.queue.submit(key, body)
        return key

    def use_spool(self, spool: Spool) -> int:
        """Keep the backlog in `spool` too, and queue what an earlier run left there (oldest first, ahead
        of anything submitted later); returns how many objects that was. Call before start()."""
        return len(self.queue.use_spool(spool))

    def snapshot(self) -> ArchiveStats:
        q = self.queue.snapshot()
        return ArchiveStats(q.uploaded, q.failed, q.dropped, q.backlog, q.last_success_timestamp)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.queue.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop after the upload in progress (objects still queued are lost unless spooled: the next start
        uploads those)."""
        self.queue.stop(timeout)

    def flush(self, timeout: float) -> bool:
        """Wait until the backlog is empty (tests, and a clean shutdown with time to spare)."""
        return self.queue.flush(timeout)

    # -- the uploader ------------------------------------------------------------------------------------
    def _put_object(self, client: Any, key: str, body: bytes) -> None:
        client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/gzip")
        log.debug("probe archived: s3://%s/%s (%d bytes)", self.bucket, key, len(body))
