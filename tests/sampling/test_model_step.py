"""keep(): the one save-then-publish block both model steps run after a sample."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import pytest

from agent.sampling import keep


class Step:
    name = "model"
    section = "model"

    def __init__(self, on_learned: Optional[Callable[[], None]] = None) -> None:
        self.saves = 0
        self.on_learned = on_learned

    def run(self, *args: Any) -> None: ...

    def save(self) -> None:
        self.saves += 1

    def reconfigure(self, section: Any) -> None: ...

    def learned(self) -> None: ...


# (learned, save due) -> (saves, publishes)
CASES = [((False, False), (0, 0)), ((False, True), (1, 0)), ((True, False), (1, 1)), ((True, True), (1, 1))]


@pytest.mark.parametrize(("args", "want"), CASES, ids=[f"learned={a[0]},due={a[1]}" for a, _ in CASES])
def test_saves_when_learned_or_due_and_publishes_only_what_was_learned(args: tuple[bool, bool],
                                                                       want: tuple[int, int]) -> None:
    published: list[int] = []
    step = Step(lambda: published.append(1))
    keep(step, *args)
    assert (step.saves, len(published)) == want


def test_a_publisher_fault_is_logged_and_never_stops_the_sampling(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("S3 queue full")

    step = Step(broken)
    with caplog.at_level(logging.ERROR, logger="agent.sampling"):
        keep(step, True, False)
    assert step.saves == 1
    assert [r.getMessage() for r in caplog.records] == ["step=model: publishing what it learned failed"]
