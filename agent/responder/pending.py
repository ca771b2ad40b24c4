"""The responder's connections that are not yet a test: those still owing their cookie, and those parked."""

from __future__ import annotations

import collections
import resource
import socket
from dataclasses import dataclass, field
from typing import Optional

# Descriptors the responder leaves to the rest of the daemon (sampling, credit saving, /metrics): it
# closes at once any connection whose descriptor lands in the top quarter of RLIMIT_NOFILE (at least 32).
# Linux hands out the lowest free descriptor, so a high number means the process is that full. systemd's
# default soft limit for a service is 1024: the responder stops at 768.
FD_RESERVE_FRACTION = 4
FD_RESERVE_MIN = 32


def fd_ceiling() -> int:
    """The lowest descriptor number the responder will not keep (see FD_RESERVE_FRACTION)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 1 << 30
    return max(0, soft - max(FD_RESERVE_MIN, soft // FD_RESERVE_FRACTION))


@dataclass(eq=False)
class Pending:
    """A connection that owes its 37-byte cookie: a client that wants a test, or (`stream`) one of the
    running test's data connections."""

    conn: socket.socket
    source: str
    deadline: float
    stream: bool
    buf: bytearray = field(default_factory=bytearray)


@dataclass(eq=False)
class Parked:
    """A client whose cookie came while the last test was showing its results: it waits for that test."""

    conn: socket.socket
    source: str
    cookie: bytes
    deadline: float


class PendingTable:
    """The connections owing their cookie, by descriptor, and how many each source holds (the
    `max_pending_per_source` share). Only the accept loop's thread touches it."""

    def __init__(self) -> None:
        self.by_fd: dict[int, Pending] = {}
        self.per_source: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        return len(self.by_fd)

    def add(self, pend: Pending) -> None:
        self.by_fd[pend.conn.fileno()] = pend
        self.per_source[pend.source] += 1

    def forget(self, pend: Pending) -> None:
        """A connection no longer owes its cookie."""
        self.by_fd.pop(pend.conn.fileno(), None)
        self.per_source[pend.source] -= 1
        if self.per_source[pend.source] <= 0:
            del self.per_source[pend.source]

    def expired(self, now: float) -> list[Pending]:
        return [x for x in self.by_fd.values() if x.deadline <= now]

    def nearest_deadline(self) -> Optional[float]:
        return min((x.deadline for x in self.by_fd.values()), default=None)
