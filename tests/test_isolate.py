"""call_in_child: results and errors cross the fork; heavy imports stay in the child; hangs are killed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from agent.isolate import ChildFailed, call_in_child


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
