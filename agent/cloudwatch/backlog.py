"""The CloudWatch publisher's second job: keep closed periods' datums in a bounded backlog until CloudWatch
takes them, mirrored to a spool under state_dir (one record per flush) so a restart loses none."""

from __future__ import annotations

import collections
import json
import logging
import threading
from typing import Callable, Iterable, Optional

from agent.models.cw_aggregate import Backlog, Datum
from agent.writers.spool import Spool

log = logging.getLogger(__name__)

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


class SpooledBacklog:
    """The backlog and its spool kept in agreement: the datums by flush (and spool record), oldest first; only
    the head may be partly sent. Changed by the publisher thread only, under `lock` (shared with the
    publisher's counters, which scrapes read); the file I/O happens outside the lock."""

    def __init__(self, namespace: str, capacity: int, spool: Optional[Spool], lock: threading.Lock) -> None:
        self.namespace = namespace
        self.backlog = Backlog(capacity)
        self.spool = spool
        self.lock = lock
        self._chunks: collections.deque[_Chunk] = collections.deque()

    def __len__(self) -> int:
        return len(self.backlog)

    def replay(self) -> int:
        """Put what an earlier run spooled at the head of the backlog, in order; returns how many flushes."""
        if self.spool is None:
            return 0
        spool = self.spool
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
            self.append(datums, rid)
        if foreign:
            log.warning("cloudwatch: spooled datapoints for namespace(s) %s dropped: the namespace is now %s",
                        ", ".join(sorted(foreign)), self.namespace)
        if n:
            log.info("cloudwatch: %d datapoints from %d spooled flushes to send first", kept, n)
        return n

    def add_flush(self, datums: list[Datum], now: float) -> tuple[int, int]:
        """One flush's datums: written to the spool before the first try (so a kill during the request loses
        nothing), appended, and what is too old expired. Returns (dropped by the bound, expired)."""
        rid: Optional[int] = None
        if datums and self.spool is not None:
            rid, evicted = self.spool.append(encode_batch(self.namespace, datums))
            self._evicted(evicted)
        dropped = self.append(datums, rid)
        with self.lock:
            expired = self.backlog.expire(now)
            work = self._consumed(expired)
        self._sync(work)
        return dropped, expired

    def append(self, datums: list[Datum], rid: Optional[int]) -> int:
        """Append one flush's datums (spool record `rid`); returns how many old ones the bound dropped."""
        if not datums:
            return 0
        with self.lock:
            self._chunks.append(_Chunk(rid, datums))
            dropped = self.backlog.extend(datums)
            work = self._consumed(dropped)
        self._sync(work)
        return dropped

    def settle(self, n: int, reason: Optional[str] = None, count: Optional[Callable[[], None]] = None) -> None:
        """The first `n` datums left the backlog: sent (`reason` None) or dropped for `reason`. `count`
        updates the caller's counters under the same lock, so a scrape sees both changes or neither."""
        with self.lock:
            if count is not None:
                count()
            if reason is None:
                self.backlog.pop(n)
            else:
                self.backlog.drop(n, reason)
            work = self._consumed(n)
        self._sync(work)

    def give_up(self) -> tuple[int, int]:
        """At the stop: the memory-only datums are dropped ("shutdown"); those in the spool wait for the
        next start. Returns (dropped, kept)."""
        with self.lock:
            kept = sum(c.left for c in self._chunks if c.rid is not None)
            if not kept:
                left = self.backlog.drop_all("shutdown")
                self._chunks.clear()
            else:
                left = len(self.backlog) - kept
                self.backlog.dropped["shutdown"] += left
        return left, kept

    def _consumed(self, n: int) -> _SpoolWork:
        """Under the lock, after `n` datums left the head of the backlog (sent, dropped or expired): the
        spool records now wholly gone, and the head record to rewrite with what is left of it (so a restart
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
            with self.lock:
                for c in self._chunks:
                    if c.rid == rewrite[0]:
                        c.rid = None           # replace() removed the file: memory only from now

    def _evicted(self, rids: list[int]) -> None:
        """The spool dropped its oldest records to stay in bounds: drop their datums (and any older
        memory-only ones) from the backlog too, so memory and disk hold the same datums."""
        if not rids:
            return
        with self.lock:
            wanted = set(rids)
            drop = {c.rid for c in self._chunks if c.rid is not None and c.rid in wanted}
            n = 0
            while drop and self._chunks:
                c = self._chunks.popleft()
                n += c.left
                if c.rid is not None:
                    drop.discard(c.rid)
            self.backlog.drop(n, "backlog_full")
