"""How the responder turns a client away: a drop for protocol trouble, and a refusal that never blocks."""

from __future__ import annotations

import socket
from typing import Optional

from agent.iperf3 import protocol as p


class Dropped(Exception):
    """A client dropped for protocol trouble: `reason` is a stats.DROP_REASONS label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def deny(conn: socket.socket, reason_text: Optional[str], state: int = p.ACCESS_DENIED) -> None:
    """Answer a connection we will not serve without ever blocking: take whatever the client already
    sent (so closing does not turn into a reset), send ACCESS_DENIED and, for burstwatch clients, why."""
    try:
        conn.setblocking(False)
        try:
            conn.recv(256)
        except OSError:
            pass
        data = p.encode_state(state)
        if reason_text:
            data += p.encode_message({p.REASON_KEY: reason_text})
        conn.send(data)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()
