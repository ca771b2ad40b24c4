"""Atomic JSON state files under state_dir; corrupt or foreign files are set aside, never fatal."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)


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

    def save(self, doc: dict[str, Any]) -> None:
        doc = {"format": self.fmt, **doc}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=str(self.path.parent), prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
