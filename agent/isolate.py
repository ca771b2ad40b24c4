"""Child processes for what must not stay resident: a one-off call in a forked child (its heavy imports,
boto3, pyroute2, never load into the daemon) and a spawned command with its output captured."""

from __future__ import annotations

import fcntl
import logging
import os
import select
import threading
import time
from typing import Callable, Optional, TypeVar

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


class Spawned:
    """A command run with its stdout and stderr captured: what the check rounds need of subprocess.Popen
    (spawn, read both pipes to the end under a deadline, signal, reap), through os.posix_spawn, which is
    safe from a threaded process. subprocess itself would stay resident at ~0.2 MiB for this one use
    (docs/architecture.md, "What stays out of the resident process")."""

    def __init__(self, argv: list[str]) -> None:
        out_r, out_w = _pipe()
        err_r, err_w = _pipe()
        try:
            # The pipes are close-on-exec (PEP 446) and above fd 2: the child keeps only its dup2'ed copies.
            # Any other descriptor someone made inheritable is closed too (Popen's close_fds=True).
            actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
            actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds()]
            self.pid = os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=actions)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        self._pipes = {out_r: bytearray(), err_r: bytearray()}
        self._out, self._err = out_r, err_r
        self._lock = threading.Lock()            # returncode against signal(): never signal a reaped pid
        self._reaping = threading.Lock()         # one waitpid at a time: a second waiter reads returncode
        self.returncode: Optional[int] = None    # as Popen's: -N when signal N ended it

    def communicate(self, timeout: float) -> tuple[str, str]:
        """(stdout, stderr) once the child has closed both and exited. TimeoutError after `timeout` seconds:
        the child is left running (kill() and wait() it)."""
        deadline = time.monotonic() + timeout
        poller = select.poll()                   # not select(): the daemon's descriptors may pass FD_SETSIZE
        for fd in self._pipes:
            poller.register(fd, select.POLLIN)
        open_fds = set(self._pipes)
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{timeout:g}s")
            for fd, _event in poller.poll(left * 1000):
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    self._pipes[fd] += chunk
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
        self.wait()
        return (self._pipes[self._out].decode("utf-8", "replace"), self._pipes[self._err].decode("utf-8", "replace"))

    def wait(self) -> int:
        """Reap the child (blocking) and close the pipes; its returncode."""
        with self._reaping:
            if self.returncode is None:
                _pid, status = os.waitpid(self.pid, 0)
                with self._lock:
                    self.returncode = os.waitstatus_to_exitcode(status)
            for fd in self._pipes:
                try:
                    os.close(fd)
                except OSError:                  # closed by an earlier wait()
                    pass
            return self.returncode

    def signal(self, signum: int) -> None:
        """Send `signum` unless the child is already reaped (its pid may be another process's by then)."""
        with self._lock:
            if self.returncode is None:
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    pass


def _inheritable_fds() -> list[int]:
    """This process's inheritable descriptors above stderr."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                found.append(fd)
        except OSError:                          # listdir's own descriptor, or one closed meanwhile
            pass
    return found


def _pipe() -> tuple[int, int]:
    """os.pipe() with both ends above fd 2, so the child's dup2 onto 1 and 2 never lands on a pipe itself."""
    r, w = os.pipe()
    return _above_stdio(r), _above_stdio(w)


def _above_stdio(fd: int) -> int:
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved
