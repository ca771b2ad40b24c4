"""docs/fleet.md's fleet arithmetic is generated from the code's defaults (scripts/gen_fleet_arithmetic.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gen_fleet_arithmetic as gen  # noqa: E402

from agent.models.figures import CLOUDWATCH_METRICS, DEFAULT_METRICS  # noqa: E402
from agent.models.units import DIRECTIONS  # noqa: E402


def test_fleet_arithmetic_in_the_docs_is_generated_from_the_defaults() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_fleet_arithmetic.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("cls", "change"), [
    ("FleetConfig", {"refresh_interval": 3600.0}),
    ("FleetConfig", {"max_objects": 500}),
    ("ProbeConfig", {"interval": 600.0}),
    ("ProbeConfig", {"rate": "peak"}),
    ("CloudWatchConfig", {"period": 300}),
    ("ResponderConfig", {"max_tests_per_hour": 6}),
])
def test_a_changed_default_changes_the_region(monkeypatch: pytest.MonkeyPatch, cls: str,
                                               change: dict[str, Any]) -> None:
    """So the --check above fails when a default moves and the docs stay behind."""
    before = gen.region()
    original = getattr(gen, cls)
    monkeypatch.setattr(gen, cls, lambda: dataclasses.replace(original(), **change))
    assert gen.region() != before


def test_the_figures_follow_from_the_defaults() -> None:
    f = gen.Figures()
    assert f.checks == 730                                   # the hourly fleet_access check, 730-hour month
    assert f.refreshes == pytest.approx(730 * 3600 / 10800)
    assert f.calls == 43_800                                 # PutMetricData once a minute
    # The default set's metrics that do not depend on the peers: one per direction or one per instance
    # (docs/cloudwatch.md, "Cost", says 11: 5 per direction + FailedChecks).
    assert f.fixed_metrics == sum(len(DIRECTIONS) if c.per == "direction" else 1
                                  for c in (CLOUDWATCH_METRICS[m] for m in DEFAULT_METRICS) if c.per != "peer")
    assert f.probes_per_hour == 8
    # A partition smaller than one window: every new object is read by every instance of the type.
    assert f.learned_gets(10, 1.0) == pytest.approx(10.0)
    # A bigger one: a window's share of the new objects, max_objects x 730 h / max_age, whatever the fleet.
    level = 1000 / (90 * 24 / 730)
    assert f.learned_gets(1_000, 1.0) == pytest.approx(level)
    assert f.learned_gets(100_000, 30.0) == pytest.approx(level)
    assert f.probe_metric_hours(3) == 2 * 2                  # two peers only
    assert f.probe_metric_hours(1_000) == 4 * 2
