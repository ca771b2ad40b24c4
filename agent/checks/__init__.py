"""Checks: one module each, listed in CHECKS; each module's run(ctx) returns a list of Verdicts."""

from __future__ import annotations

import importlib
import logging
import time
from typing import Callable, Iterable, Optional

from agent.models.checks import FAIL, Verdict

log = logging.getLogger(__name__)

# The registry: name -> module with `run(ctx) -> list[Verdict]`. Adding a check is one new module plus one
# line here (and one in INTERVALS if the daemon should run it less often); the order is the order of
# `burstwatch check`'s table.
CHECKS = {
    "driver": "agent.checks.driver",
    "driver_version": "agent.checks.driver_version",
    "queues": "agent.checks.queues",
    "rings": "agent.checks.rings",
    "mtu": "agent.checks.mtu",
    "path_mtu": "agent.checks.path_mtu",
    "imds": "agent.checks.imds",
    "conntrack": "agent.checks.conntrack",
    "fleet_access": "agent.checks.fleet",
}


# How often the daemon runs each check (docs/checks.md, "In the daemon"). Declared here, not in the check
# modules, so the daemon's runner reads them without importing the checks: their readers (netlink, S3) stay
# out of the resident process (tests/test_resident_imports.py).
DEFAULT_INTERVAL = 300.0    # seconds: a few ioctls and netlink reads
INTERVALS = {
    # Sends probes and waits for silence; the kernel keeps a learnt PMTU for 10 minutes anyway.
    "path_mtu": 3600.0,
    # Three S3 requests (LIST, PUT, GET), each billed, for a permission that changes when someone edits a
    # role: daily keeps it to 3 requests a day per instance (docs/fleet.md, "Fleet arithmetic"). A failed
    # round is retried after DEFAULT_INTERVAL, and `burstwatch check` runs it on demand.
    # Lab value: tests/checks/test_runner.py runs the cadences scaled down (0.05 s for the quick checks).
    "fleet_access": 86400.0,
}


def interval(name: str) -> float:
    """Seconds between the daemon's runs of check `name`."""
    return INTERVALS.get(name, DEFAULT_INTERVAL)


def is_slow(name: str) -> bool:
    """Left out by `burstwatch check --quick`: the daemon runs it less often than the quick checks."""
    return interval(name) > DEFAULT_INTERVAL


def parse_names(text: str) -> list[str]:
    """`--checks driver,mtu` as registry names in registry order; ValueError naming an unknown one."""
    asked = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(asked - set(CHECKS))
    if unknown or not asked:
        raise ValueError(f"unknown check {', '.join(unknown) or '(none given)'}: known are {', '.join(CHECKS)}")
    return [n for n in CHECKS if n in asked]


def check_function(name: str) -> Callable:
    return importlib.import_module(CHECKS[name]).run  # type: ignore[no-any-return]


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


def run_timed(ctx: object, names: Optional[Iterable[str]] = None) -> tuple[list[Verdict], dict[str, float]]:
    """Run the named checks (default: all, in registry order): every verdict, and each check's seconds."""
    out: list[Verdict] = []
    durations: dict[str, float] = {}
    for name in names if names is not None else CHECKS:
        verdicts, durations[name] = run_check(name, ctx)
        out.extend(verdicts)
    return out, durations


def run_checks(ctx: object, names: Optional[Iterable[str]] = None) -> list[Verdict]:
    """Run the named checks (default: all, in registry order) and return every verdict."""
    return run_timed(ctx, names)[0]
