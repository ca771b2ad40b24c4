"""The responder's counters and the snapshot its Prometheus view and `burstwatch status` read."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from agent.models.serving_budget import ServingBudget
from agent.models.units import DIRECTIONS

log = logging.getLogger(__name__)

# credit_floor, would_cross_floor and budget are the credit guard's (docs/probes.md, "Credit guard"):
# the client is told "busy", as when a test is running.
REFUSAL_REASONS = ("not_allowed", "busy", "rate_limited", "duration", "streams", "bytes", "unsupported",
                   "credit_floor", "would_cross_floor", "budget")
DROP_REASONS = ("timeout", "garbage", "closed", "terminated", "stream_error", "overload")


@dataclass(frozen=True)
class ResponderSnapshot:
    """The responder's counters at one instant, for the Prometheus view and `burstwatch status`."""

    listening: bool
    busy: bool
    connections: int
    tests: dict[str, int]          # result ("completed", "aborted") -> tests
    refused: dict[str, int]        # REFUSAL_REASONS -> refusals
    dropped: dict[str, int]        # DROP_REASONS -> connections or tests dropped
    bytes: dict[str, int]          # "in" (received by the responder), "out" (sent by it)
    last_test_timestamp: float     # Unix time the last test ended; 0 before the first
    allowed_networks: tuple[str, ...] = ()
    # Bytes served per direction in the last sliding hour (a running test included): what the budget counts.
    served_last_hour: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DIRECTIONS, 0))
    # The hourly budget in force (agent/models/serving_budget.py): per direction, all sources and each
    # source, and what it was sized from (one of serving_budget.BASES); None without a responder config.
    hourly_budget_bytes: Optional[int] = None
    hourly_budget_per_source_bytes: Optional[int] = None
    hourly_budget_basis: Optional[str] = None


# The sliding window of the serving budget.
BUDGET_WINDOW = 3600.0


class ServedLedger:
    """Bytes served per direction over the last sliding hour, in total and per source (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._entries: collections.deque[tuple[float, str, int, int]] = collections.deque()
        self._lock = threading.Lock()

    def record(self, source: str, bytes_in: int, bytes_out: int) -> None:
        if bytes_in <= 0 and bytes_out <= 0:
            return
        with self._lock:
            self._entries.append((self.clock(), source, bytes_in, bytes_out))

    def used(self, source: Optional[str] = None) -> dict[str, int]:
        """direction -> bytes of the last hour, from `source` only when given."""
        now = self.clock()
        with self._lock:
            while self._entries and self._entries[0][0] <= now - BUDGET_WINDOW:
                self._entries.popleft()
            out = dict.fromkeys(DIRECTIONS, 0)
            for _, src, bytes_in, bytes_out in self._entries:
                if source is None or src == source:
                    out["in"] += bytes_in
                    out["out"] += bytes_out
            return out


class ResponderStats:
    """Thread-safe counters; `snapshot()` includes the bytes of a test still running."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self.served = ServedLedger(clock)
        # The budget in force, asked at each snapshot: it follows the profile (the responder sets it).
        self.budget: Optional[Callable[[], ServingBudget]] = None
        self.listening = False
        self.connections = 0
        self.tests = {"completed": 0, "aborted": 0}
        self.refused = {r: 0 for r in REFUSAL_REASONS}
        self.dropped = {r: 0 for r in DROP_REASONS}
        self.bytes = {"in": 0, "out": 0}
        self.last_test = 0.0
        self.allowed: tuple[str, ...] = ()
        self._live: Optional[Callable[[], tuple[int, int]]] = None

    def count(self, table: str, key: str) -> None:
        with self._lock:
            getattr(self, table)[key] += 1

    def connection(self) -> None:
        with self._lock:
            self.connections += 1

    def set_live(self, live: Optional[Callable[[], tuple[int, int]]]) -> None:
        with self._lock:
            self._live = live

    def finish(self, result: str, bytes_in: int, bytes_out: int, source: str = "") -> None:
        with self._lock:
            # Under the lock, with _live cleared below: a snapshot never counts this test twice.
            self.served.record(source, bytes_in, bytes_out)
            self.tests[result] += 1
            self.bytes["in"] += bytes_in
            self.bytes["out"] += bytes_out
            self.last_test = time.time()
            self._live = None

    def current_budget(self) -> Optional[ServingBudget]:
        """The budget in force, or None when there is none to ask (or asking failed: logged)."""
        if self.budget is None:
            return None
        try:
            return self.budget()
        except Exception:
            log.exception("responder: cannot size the hourly budget")
            return None

    def snapshot(self) -> ResponderSnapshot:
        budget = self.current_budget()  # outside the lock: it reads the profile through the wiring
        with self._lock:
            live_in = live_out = 0
            if self._live is not None:
                live_in, live_out = self._live()
            hour = self.served.used()
            return ResponderSnapshot(
                listening=self.listening, busy=self._live is not None, connections=self.connections,
                tests=dict(self.tests), refused=dict(self.refused), dropped=dict(self.dropped),
                bytes={"in": self.bytes["in"] + live_in, "out": self.bytes["out"] + live_out},
                last_test_timestamp=self.last_test, allowed_networks=self.allowed,
                served_last_hour={"in": hour["in"] + live_in, "out": hour["out"] + live_out},
                hourly_budget_bytes=budget.total if budget is not None else None,
                hourly_budget_per_source_bytes=budget.per_source if budget is not None else None,
                hourly_budget_basis=budget.basis if budget is not None else None)
