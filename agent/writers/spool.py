"""A bounded on-disk queue under state_dir: one checksummed file per record, written by temp file and rename."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from agent.writers.statefile import WRITE_ERRORS

log = logging.getLogger(__name__)

# Each record file: one header line, then the payload. The CRC and the length catch a file cut short or
# damaged by the filesystem (a rename is atomic, but after a power loss an un-synced file can be empty).
MAGIC = b"BWSPOOL1"
_NAME = re.compile(r"^(\d{16})\.rec$")
TEMP_PREFIX = ".tmp-"
DROP_REASONS = ("full", "corrupt")


@dataclass(frozen=True)
class SpoolStats:
    """One spool at one instant, for the state view."""

    name: str
    records: int
    bytes: int
    max_records: int
    max_bytes: int
    dropped: dict[str, int]          # by reason: full (evicted to stay in bounds, or too big), corrupt
    replayed: int                    # records found on disk at start


def frame(payload: bytes) -> bytes:
    """The bytes of one record file."""
    head = b"%s %08x %d\n" % (MAGIC, zlib.crc32(payload) & 0xFFFFFFFF, len(payload))
    return head + payload


def unframe(data: bytes) -> Optional[bytes]:
    """The payload of a record file, or None when it is not whole."""
    head, sep, payload = data.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 3 or parts[0] != MAGIC:
        return None
    try:
        crc, length = int(parts[1], 16), int(parts[2])
    except ValueError:
        return None
    if len(payload) != length or zlib.crc32(payload) & 0xFFFFFFFF != crc:
        return None
    return payload


class Spool:
    """Records (opaque bytes) kept in order in `directory`, at most `max_records` files and `max_bytes`
    bytes; when a new record would not fit, the oldest are evicted (the newest matter most, as in the
    in-memory backlogs). Each record is one file `<seq>.rec`, written to a temp file, fsynced and renamed,
    so a kill -9 or a crash leaves either the whole record or none (stray temp files are removed at
    load()). A write that fails (read-only or full state_dir) is counted in WRITE_ERRORS under
    `spool/<name>` and the record stays memory-only: append() then returns None.

    Call load() once, before the first append(): it returns what an earlier process left, oldest first."""

    def __init__(self, directory: Path, name: str, max_records: int, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.name = name
        self.label = f"spool/{name}"
        self.max_records = max(1, int(max_records))
        self.max_bytes = max(1, int(max_bytes))
        self._lock = threading.Lock()
        self._sizes: OrderedDict[int, int] = OrderedDict()   # seq -> file size, oldest first
        self._bytes = 0
        self._next = 1
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.replayed = 0
        WRITE_ERRORS.register(self.label)

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:016d}.rec"

    # -- start-up ---------------------------------------------------------------------------------------
    def load(self) -> list[tuple[int, bytes]]:
        """(id, payload) of every whole record on disk, oldest first; torn or corrupt files are removed
        (and counted), and what exceeds the bounds is evicted oldest first."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            names = os.listdir(self.directory)
        except OSError as exc:
            WRITE_ERRORS.failed(self.label, self.directory, exc)
            return []
        found: list[tuple[int, bytes]] = []
        corrupt = 0
        for fname in sorted(names):
            path = self.directory / fname
            if fname.startswith(TEMP_PREFIX):
                self._unlink(path)         # a write that never reached its rename: not a record
                continue
            m = _NAME.match(fname)
            if m is None:
                continue
            try:
                payload = unframe(path.read_bytes())
            except OSError as exc:
                log.warning("spool %s: cannot read %s: %s", self.name, path, exc)
                continue
            if payload is None:
                corrupt += 1
                self._unlink(path)
                continue
            found.append((int(m.group(1)), payload))
        if corrupt:
            log.warning("spool %s: removed %d damaged record file(s) in %s", self.name, corrupt, self.directory)
        out: list[tuple[int, bytes]] = []
        with self._lock:
            self.dropped["corrupt"] += corrupt
            for seq, payload in found:
                self._sizes[seq] = len(frame(payload))
                self._bytes += self._sizes[seq]
                self._next = max(self._next, seq + 1)
            evicted = self._evict()
            keep = set(self._sizes)
            out = [(seq, p) for seq, p in found if seq in keep]
            self.replayed = len(out)
        for seq in evicted:
            self._unlink(self._path(seq))
        return out

    # -- records ----------------------------------------------------------------------------------------
    def append(self, payload: bytes) -> tuple[Optional[int], list[int]]:
        """Write one record after the others: (its id, or None when it could not be written; the ids
        evicted to make room, oldest first). The caller forgets the evicted records too."""
        data = frame(payload)
        if len(data) > self.max_bytes:
            with self._lock:
                self.dropped["full"] += 1
            log.warning("spool %s: a %d-byte record is larger than the spool (%d bytes); kept in memory only",
                        self.name, len(data), self.max_bytes)
            return None, []
        with self._lock:
            seq = self._next
            self._next += 1
        if not self._write(self._path(seq), data):
            return None, []
        with self._lock:
            self._sizes[seq] = len(data)
            self._bytes += len(data)
            evicted = self._evict()
        for old in evicted:
            self._unlink(self._path(old))
        if evicted:
            log.debug("spool %s: evicted %d oldest record(s) to stay within %d records / %d bytes", self.name,
                      len(evicted), self.max_records, self.max_bytes)
        return seq, evicted

    def replace(self, seq: int, payload: bytes) -> bool:
        """Rewrite a record in place (what is left of it after part was delivered), atomically. When that
        fails the record is removed instead, so a restart never delivers its delivered part twice."""
        with self._lock:
            if seq not in self._sizes:
                return False
        data = frame(payload)
        if self._write(self._path(seq), data):
            with self._lock:
                if seq in self._sizes:
                    self._bytes += len(data) - self._sizes[seq]
                    self._sizes[seq] = len(data)
            return True
        self.remove(seq)
        return False

    def remove(self, seq: int) -> None:
        """Forget a record (delivered, or dropped by the caller)."""
        with self._lock:
            size = self._sizes.pop(seq, None)
            if size is None:
                return
            self._bytes -= size
        self._unlink(self._path(seq))

    def __contains__(self, seq: object) -> bool:
        with self._lock:
            return seq in self._sizes

    def snapshot(self) -> SpoolStats:
        with self._lock:
            return SpoolStats(self.name, len(self._sizes), self._bytes, self.max_records, self.max_bytes,
                              dict(self.dropped), self.replayed)

    # -- the file side ----------------------------------------------------------------------------------
    def _evict(self) -> list[int]:
        """Under the lock: drop the oldest records until the bounds hold."""
        out = []
        while self._sizes and (len(self._sizes) > self.max_records or self._bytes > self.max_bytes):
            seq, size = self._sizes.popitem(last=False)
            self._bytes -= size
            out.append(seq)
        self.dropped["full"] += len(out)
        return out

    def _write(self, path: Path, data: bytes) -> bool:
        tmp: Optional[str] = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=str(self.directory), prefix=TEMP_PREFIX)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
            # The rename itself reaches the disk only with the directory (a power loss could otherwise
            # undo it); a kill -9 needs neither fsync, the page cache survives it.
            dfd = os.open(str(self.directory), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            WRITE_ERRORS.failed(self.label, path, exc)
            return False
        WRITE_ERRORS.succeeded(self.label, self.directory)
        return True

    def _unlink(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            WRITE_ERRORS.failed(self.label, path, exc)
