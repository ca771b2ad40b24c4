"""Run a one-off call in a forked child so its heavy imports (boto3, pyroute2) never stay resident."""

from __future__ import annotations

import logging
import os
import select
import time
from typing import Callable, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class ChildFailed(RuntimeError):
    pass


def call_in_child(fn: Callable[[], T], timeout: float) -> T:
    """fn() in a forked child; its pickled result (or exception) comes back through a pipe.

    Only for a process that has no other threads yet (start-up): fork copies just the calling thread,
    so locks held by others would stay held in the child. The child is killed after `timeout`."""
    import pickle  # here, not at module level: most starts never fork a child (~0.2 MiB kept out)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into the caller's code
        os.close(r)
        try:
            try:
                payload = pickle.dumps(("ok", fn()))
            except BaseException as exc:  # carried to the parent
                payload = pickle.dumps(("error", ChildFailed(f"{type(exc).__name__}: {exc}")))
            with os.fdopen(w, "wb") as f:
                f.write(payload)
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        with os.fdopen(r, "rb") as f:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([f], [], [], left)[0]:
                    raise ChildFailed(f"timed out after {timeout:g}s")
                chunk = os.read(f.fileno(), 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    if not chunks:
        raise ChildFailed("the child died without an answer")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        raise value
    return value  # type: ignore[no-any-return]
