"""call_in_child: results and errors cross the fork; heavy imports stay in the child; hangs are killed.
Spawned: output, exit status, timeouts and signals of a spawned command, as subprocess.Popen gives them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from agent.isolate import ChildFailed, Spawned, call_in_child


def test_result_and_error_cross_the_fork() -> None:
    assert call_in_child(lambda: {"answer": 42}, timeout=5) == {"answer": 42}
    with pytest.raises(ChildFailed, match="ZeroDivisionError"):
        call_in_child(lambda: 1 / 0, timeout=5)


def test_a_hanging_child_is_killed_at_the_timeout() -> None:
    t0 = time.monotonic()
    with pytest.raises(ChildFailed, match="timed out"):
        call_in_child(lambda: time.sleep(30), timeout=0.5)
    assert time.monotonic() - t0 < 5


def test_imports_in_the_child_do_not_reach_the_parent() -> None:
    # In a fresh interpreter so that nothing else in the test session has imported boto3 already.
    code = ("import sys; from agent.isolate import call_in_child;"
            "print(call_in_child(lambda: __import__('boto3').__name__, 20), 'boto3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["boto3", "False"], out.stderr


# -- Spawned: the check rounds' child ----------------------------------------------------------------------

def test_spawned_captures_both_streams_past_a_pipe_buffer() -> None:
    """1 MiB on stdout and on stderr (16 pipe buffers each): read side by side, never stuck on one."""
    code = "import sys; sys.stdout.write('o' * (1 << 20)); sys.stderr.write('e' * (1 << 20)); sys.exit(3)"
    child = Spawned([sys.executable, "-c", code])
    out, err = child.communicate(timeout=30)
    assert (len(out), set(out), len(err), set(err)) == (1 << 20, {"o"}, 1 << 20, {"e"})
    assert child.returncode == 3 and child.wait() == 3


def test_spawned_child_holds_only_stdio() -> None:
    """The daemon's sockets, the pipes' own ends and even a descriptor made inheritable stay out of the
    child (Popen's close_fds=True)."""
    with socket.socket() as private, socket.socket() as inheritable:
        inheritable.set_inheritable(True)
        held = {private.fileno(), inheritable.fileno()}
        child = Spawned([sys.executable, "-c", "import os; print(os.listdir('/proc/self/fd'))"])
        out, _ = child.communicate(timeout=30)
    fds = sorted(int(f) for f in json.loads(out.replace("'", '"')))
    assert fds[:3] == [0, 1, 2] and len(fds) == 4, fds          # stdio, and listdir's own descriptor
    assert not held & set(fds), (held, fds)


def test_spawned_times_out_and_is_killed_and_reaped() -> None:
    child = Spawned(["/bin/sleep", "30"])
    t = time.monotonic()
    with pytest.raises(TimeoutError):
        child.communicate(timeout=0.3)
    assert 0.3 <= time.monotonic() - t < 5 and child.returncode is None
    child.signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    child.signal(signal.SIGTERM)          # reaped: nothing is signalled (the pid may be another's by now)
    assert child.wait() == -signal.SIGKILL


def test_spawned_missing_program_raises_and_leaks_nothing() -> None:
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        Spawned(["/nonexistent/burstwatch-child"])
    assert len(os.listdir("/proc/self/fd")) == before
