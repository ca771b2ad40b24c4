"""The responder's table of connections owing their cookie: per-source shares, deadlines, the fd reserve."""

from __future__ import annotations

import resource
import socket

import pytest

from agent.responder import pending as pm
from agent.responder.pending import Pending, PendingTable


def test_table_counts_each_source_and_forgets() -> None:
    a, b, c = socket.socket(), socket.socket(), socket.socket()
    with a, b, c:
        table = PendingTable()
        pa, pb, pc = Pending(a, "10.0.0.1", 5.0, False), Pending(b, "10.0.0.1", 3.0, True), \
            Pending(c, "10.0.0.2", 9.0, False)
        for p in (pa, pb, pc):
            table.add(p)
        assert len(table) == 3 and table.per_source == {"10.0.0.1": 2, "10.0.0.2": 1}
        assert table.nearest_deadline() == 3.0
        assert table.expired(5.0) == [pa, pb]
        table.forget(pb)
        table.forget(pc)
        # A source with nothing pending leaves the counter, so the table does not grow with every source seen.
        assert len(table) == 1 and table.per_source == {"10.0.0.1": 1}
        table.forget(pa)
        assert table.nearest_deadline() is None and not table.per_source


@pytest.mark.parametrize("soft,ceiling", [(1024, 768), (64, 32), (100, 68), (16, 0)])
def test_fd_ceiling_keeps_a_quarter_and_at_least_32(monkeypatch: pytest.MonkeyPatch, soft: int,
                                                    ceiling: int) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (soft, soft))
    assert pm.fd_ceiling() == ceiling


def test_fd_ceiling_unlimited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert pm.fd_ceiling() == 1 << 30
