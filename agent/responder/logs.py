"""Rate-limited log lines for the responder: a flood of bad connections makes a few lines, not one each."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from agent.iperf3.protocol import clip

# Every logged value a peer chose (an error text, a reason) is cut to this many characters.
MAX_LOGGED = 200


@dataclass
class _Window:
    start: float
    logged: int = 0
    suppressed: int = 0
    level: int = logging.INFO
    last: str = ""


class LogLimiter:
    """Per kind of event (`key`, e.g. "dropped overload"), at most `burst` lines per `interval` seconds;
    the rest are counted, and one summary line per key and interval says how many were left out and the
    last of them. Without it a flood of bad connections writes one WARNING per connection
    (docs/security.md, "Responder limits"). Thread-safe."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0, burst: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval = interval
        self.burst = burst
        self.clock = clock
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: bool = False) -> None:
        """Log `msg % args` unless `key` has had `burst` lines this interval; string arguments are cut
        to MAX_LOGGED characters."""
        args = tuple(clip(a, MAX_LOGGED) if isinstance(a, str) else a for a in args)
        now = self.clock()
        with self._lock:
            w = self._windows.get(key)
            summary = None
            if w is not None and now - w.start >= self.interval:
                summary = self._summary(key, w, now)
                w = None
            if w is None:
                w = self._windows[key] = _Window(start=now)
            if w.logged < self.burst:
                w.logged += 1
                emit = True
            else:
                w.suppressed += 1
                w.level = max(w.level, level)
                w.last = msg % args if args else msg
                emit = False
        if summary is not None:
            self.logger.log(*summary)
        if emit:
            self.logger.log(level, msg, *args, exc_info=exc_info)

    def flush(self, force: bool = False) -> None:
        """Write the summary of every interval that is over (all of them with `force`); call it now and
        then, so a flood that stopped is still reported."""
        now = self.clock()
        out = []
        with self._lock:
            for key, w in list(self._windows.items()):
                if force or now - w.start >= self.interval:
                    summary = self._summary(key, w, now)
                    if summary is not None:
                        out.append(summary)
                    del self._windows[key]
        for summary in out:
            self.logger.log(*summary)

    @staticmethod
    def _summary(key: str, w: _Window, now: float) -> Optional[tuple[Any, ...]]:
        if not w.suppressed:
            return None
        return (w.level, "responder: %d more '%s' lines left out in the last %.0f s; the last: %s", w.suppressed,
                key, now - w.start, clip(w.last, MAX_LOGGED))
