"""Hypothesis profiles for the fuzz tests: bounded and derandomized, so `make test` is quick and reproducible.

`ci` (the default) runs a fixed number of examples per test from a seed derived from the test itself, so
every run (and every CI machine) tries the same inputs and a failure reproduces. `long` searches deeper,
with fresh randomness, for a local bug hunt: BURSTWATCH_FUZZ_PROFILE=long pytest tests/fuzz."""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

# The example database is off: a run must not depend on (or write) state left by an earlier one.
settings.register_profile(
    "ci", max_examples=150, derandomize=True, database=None, print_blob=True,
    # Per example; generous because the machine running `make test` may be busy with other jobs.
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long", max_examples=5000, derandomize=False, database=None, print_blob=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("BURSTWATCH_FUZZ_PROFILE", "ci"))
