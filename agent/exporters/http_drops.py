"""The /metrics server's tally of connections and the one WARNING a minute about the ones it dropped."""

from __future__ import annotations

import collections
import logging
import time

from agent.exporters.http_request import Limits

log = logging.getLogger("agent.exporters.http")    # the server's own logger: operators grep for it

SUMMARY_EVERY = 60.0        # seconds between two log lines about dropped connections
# What counts as a drop in the summary (the rest of the tally is ordinary: accepted, responses, idle-closed).
DROPS = ("timeout-header", "timeout-write", "evicted-cap", "evicted-fd-exhausted", "refused", "accept-paused",
         "too-large", "tls-failed")


class Tally:
    """Counts by kind (`counts`, read by tests and the summary) and the peer of the last drop."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._reported: collections.Counter[str] = collections.Counter()
        self._last_report = time.monotonic()
        self.last_peer = "-"

    def drop(self, kind: str, peer: str) -> None:
        self.counts[kind] += 1
        self.last_peer = peer

    def report(self, now: float, name: str, limits: Limits) -> None:
        """One WARNING a minute at most, however many connections an attacker makes us drop."""
        if now - self._last_report < SUMMARY_EVERY:
            return
        self._last_report = now
        new = {k: self.counts[k] - self._reported[k] for k in DROPS if self.counts[k] != self._reported[k]}
        if new:
            self._reported.update(new)
            log.warning("%s: dropped connections in the last %.0f s: %s (last peer=%s; limits: header_timeout=%gs "
                        "max_connections=%d)", name, SUMMARY_EVERY,
                        ", ".join(f"{k}={v}" for k, v in sorted(new.items())), self.last_peer,
                        limits.header_timeout, limits.max_connections)
