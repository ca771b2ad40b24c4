"""A bounded S3 upload queue: objects kept in memory (and optionally a Spool), uploaded by one retry thread."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple, Optional

from agent import aws
from agent.writers.spool import Spool

# Pause after a failed upload (botocore's standard mode has already retried it), doubling up to the cap.
RETRY_PAUSE = 2.0
RETRY_PAUSE_MAX = 300.0


@dataclass(frozen=True)
class QueueStats:
    """The queue's counters at one instant."""

    uploaded: int
    failed: int            # upload attempts that failed after botocore's retries
    dropped: int           # objects dropped because the backlog (or the spool) was full
    backlog: int           # objects waiting, the one being uploaded included
    last_success_timestamp: float


def spool_record(key: str, body: bytes) -> bytes:
    """One spool record: the object's key on the first line, then its body."""
    return key.encode("utf-8") + b"\n" + body


def parse_spool_record(payload: bytes, what: str = "S3 queue") -> tuple[str, bytes]:
    key, sep, body = payload.partition(b"\n")
    if not sep or not key:
        raise ValueError(f"not a {what} spool record")
    return key.decode("utf-8"), body


class _Item(NamedTuple):
    key: str
    body: bytes
    rid: Optional[int]          # its spool record; None: memory only


# put(client, key, body): one upload; raises on failure (any exception means "try again later").
PutFn = Callable[[Any, str, bytes], None]


class UploadQueue:
    """Uploads on its own thread, so a slow or unreachable S3 never delays the caller. `submit()` only
    queues; a failed upload stays at the head of the backlog and is retried after a pause that doubles
    up to `retry_pause_max` (stop() cuts it short, new submissions do not).

    With a spool (`use_spool()`, before `start()`), each object is also written to state_dir before its
    first upload and deleted once S3 took it, so a restart or a kill -9 during an outage loses none: the
    next start uploads them first, in order.

    `label` starts every log line ("probe archive"), `log` is the owner's logger, `thread_name` names
    the thread; `put` does the upload with the client `client_factory` makes on first use."""

    def __init__(self, bucket: str, put: PutFn, *, label: str, log: logging.Logger, thread_name: str,
                 capacity: int, client: Any = None, client_factory: Optional[Callable[[], Any]] = None,
                 retry_pause: float = RETRY_PAUSE, retry_pause_max: float = RETRY_PAUSE_MAX,
                 wall: Callable[[], float] = time.time) -> None:
        self.bucket = bucket
        self.label = label
        self.log = log
        self.thread_name = thread_name
        self.retry_pause = retry_pause
        self.retry_pause_max = retry_pause_max
        self.wall = wall
        self._put_fn = put
        self._client = client
        self._factory = client_factory
        self.capacity = max(1, capacity)
        self._queue: collections.deque[_Item] = collections.deque()
        self.spool: Optional[Spool] = None
        self._cond = threading.Condition()
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._uploading = False
        self.uploaded = 0
        self.failed = 0
        self.dropped = 0
        self.last_success = 0.0
        # Called on the upload thread after S3 took an object (its key), or after a failed attempt (the
        # key and the exception): owners keep their own bookkeeping (the fleet publisher's last values).
        self.on_uploaded: Optional[Callable[[str], None]] = None
        self.on_failed: Optional[Callable[[str, BaseException], None]] = None

    # -- the caller's side -------------------------------------------------------------------------------
    def submit(self, key: str, body: bytes) -> None:
        """Queue one object (spooled first when a spool is in use). Never blocks on S3."""
        rid: Optional[int] = None
        evicted: list[int] = []
        if self.spool is not None:
            # Written before the first upload, so a kill during it loses nothing.
            rid, evicted = self.spool.append(spool_record(key, body))
        self._add(_Item(key, body, rid), evicted)

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
                self.log.warning("%s backlog full (%d); dropping the oldest object", self.label, self.capacity)
            self._queue.append(item)
            self._cond.notify()
        self._forget(gone)

    def _forget(self, rids: Iterable[Optional[int]]) -> None:
        if self.spool is not None:
            for rid in rids:
                if rid is not None:
                    self.spool.remove(rid)

    def use_spool(self, spool: Spool) -> list[str]:
        """Keep the backlog in `spool` too, and queue what an earlier run left there (oldest first, ahead
        of anything submitted later); returns those objects' keys. Call before start()."""
        self.spool = spool
        keys: list[str] = []
        for rid, payload in spool.load():
            try:
                key, body = parse_spool_record(payload, self.label)
            except (ValueError, UnicodeDecodeError) as exc:
                self.log.warning("%s: spool record %d unreadable, removed: %s", self.label, rid, exc)
                spool.remove(rid)
                continue
            self._add(_Item(key, body, rid), [])
            keys.append(key)
        if keys:
            self.log.info("%s: %d objects spooled by an earlier run to upload first (bucket=%s)", self.label,
                          len(keys), self.bucket)
        return keys

    def pending_keys(self) -> list[str]:
        with self._cond:
            return [i.key for i in self._queue]

    def snapshot(self) -> QueueStats:
        with self._cond:
            pending = len(self._queue) + (1 if self._uploading else 0)
            return QueueStats(self.uploaded, self.failed, self.dropped, pending, self.last_success)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
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
            if ok and self.on_uploaded is not None:
                self.on_uploaded(item.key)
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
                if self._factory is None:
                    raise RuntimeError("no S3 client and no client factory")
                self._client = self._factory()
            self._put_fn(self._client, key, body)
        except Exception as exc:  # botocore raises many kinds; every one means "try again later"
            self.log.warning("%s upload failed (%s error): bucket=%s key=%s: %s", self.label,
                             aws.classify(exc).kind, self.bucket, key, exc)
            if self.on_failed is not None:
                self.on_failed(key, exc)
            return False
        return True
