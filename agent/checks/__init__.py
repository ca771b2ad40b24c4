"""Checks: one module each, listed in CHECKS; each module's run(ctx) returns a list of Verdicts."""

from __future__ import annotations

import importlib
import logging
import time
from typing import Callable, Iterable, Optional

from agent.models.checks import FAIL, Verdict

log = logging.getLogger(__name__)

# The registry: name -> module with `run(ctx) -> list[Verdict]` (and SLOW = True for the ones the
# daemon runs less often). Adding a check is one new module plus one line here; the order is the
# order of `burstwatch check`'s table.
CHECKS = {
    "driver": "agent.checks.driver",
    "driver_version": "agent.checks.driver_version",
    "queues": "agent.checks.queues",
    "rings": "agent.checks.rings",
    "mtu": "agent.checks.mtu",
    "path_mtu": "agent.checks.path_mtu",
    "imds": "agent.checks.imds",
    "fleet_access": "agent.checks.fleet",
}


def check_function(name: str) -> Callable:
    return importlib.import_module(CHECKS[name]).run  # type: ignore[no-any-return]


def is_slow(name: str) -> bool:
    return bool(getattr(importlib.import_module(CHECKS[name]), "SLOW", False))


def run_check(name: str, ctx: object) -> tuple[list[Verdict], float]:
    """Run one check; a bug in it becomes its `fail` verdict, never an exception. Returns (verdicts, seconds)."""
    start = time.monotonic()
    try:
        verdicts = list(check_function(name)(ctx))
    except Exception as exc:
        log.exception("check=%s crashed", name)
        verdicts = [Verdict(name, "", FAIL, f"the check itself failed: {type(exc).__name__}: {exc}",
                            {"error": repr(exc)}, "# a burstwatch bug: please report it with the log")]
    return verdicts, time.monotonic() - start


def run_checks(ctx: object, names: Optional[Iterable[str]] = None) -> list[Verdict]:
    """Run the named checks (default: all, in registry order) and return every verdict."""
    out: list[Verdict] = []
    for name in names if names is not None else CHECKS:
        out.extend(run_check(name, ctx)[0])
    return out
