"""Atomic JSON state files under state_dir; corrupt or foreign files are set aside, never fatal."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)


class WriteErrors:
    """Failed writes under state_dir, per file (a state file's name, or a spool's `spool/<name>`), for
    burstwatch_state_write_errors_total{file}. A read-only or full state directory must not stop the
    daemon, nor fill the journal: the first failure of a file is logged, later ones only counted, until
    a write of that file works again (which is logged once too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._failing: set[str] = set()

    def register(self, name: str) -> None:
        """Export the file's counter at 0 before any error (a series that appears only on the first
        error makes increase() miss that error)."""
        with self._lock:
            self._counts.setdefault(name, 0)

    def failed(self, name: str, path: object, exc: BaseException) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1
            first = name not in self._failing
            self._failing.add(name)
        if first:
            log.error("cannot write %s: %s; the daemon keeps running without it, and further errors for this "
                      "file are only counted in burstwatch_state_write_errors_total{file=%r} until a write "
                      "works again", path, exc, name)
        else:
            log.debug("cannot write %s again: %s", path, exc)

    def succeeded(self, name: str, path: object) -> None:
        with self._lock:
            if name not in self._failing:
                return
            self._failing.discard(name)
        log.info("writing %s works again", path)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


# One per process, like prometheus_client's REGISTRY: every writer under state_dir counts here (JsonStore
# and writers/spool.py), so callers in other layers need not pass anything along.
WRITE_ERRORS = WriteErrors()


def read_boot_id(procfs: str = "/proc") -> str:
    try:
        with open(os.path.join(procfs, "sys/kernel/random/boot_id"), encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def boottime() -> float:
    """Seconds since boot, counting suspend: the clock that spans an agent restart within one boot."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class JsonStore:
    """One JSON document in a file, written atomically (temp file, fsync, rename)."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path = path
        self.fmt = fmt
        WRITE_ERRORS.register(path.name)

    def load(self, accept: Callable[[dict[str, Any]], Optional[str]] = lambda _d: None) -> Optional[dict[str, Any]]:
        """The document, or None when absent. A file that is not ours (wrong format, fails `accept`,
        which returns a reason) is renamed aside with a warning."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("state file %s unreadable, ignoring it: %s", self.path, exc)
            return None
        try:
            doc = json.loads(text)
            reason = None if isinstance(doc, dict) and doc.get("format") == self.fmt else "not a " + self.fmt
            if reason is None:
                reason = accept(doc)
        except ValueError as exc:
            reason = f"not valid JSON ({exc})"
        if reason:
            aside = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}")
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = self.path
            log.warning("state file %s set aside as %s: %s", self.path, aside.name, reason)
            return None
        return doc  # type: ignore[no-any-return]

    def save(self, doc: dict[str, Any]) -> bool:
        """Write the document; False when it could not be written (read-only or full state_dir, ...).

        A failure is counted and logged by WRITE_ERRORS (once until writes work again) and never raised:
        the daemon keeps sampling without its state, and the previous file stays whole."""
        doc = {"format": self.fmt, **doc}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=str(self.path.parent), prefix=f".{self.path.name}.")
        except OSError as exc:
            WRITE_ERRORS.failed(self.path.name, self.path, exc)
            return False
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            _unlink_quietly(tmp)
            WRITE_ERRORS.failed(self.path.name, self.path, exc)
            return False
        except BaseException:
            _unlink_quietly(tmp)
            raise
        WRITE_ERRORS.succeeded(self.path.name, self.path)
        return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
