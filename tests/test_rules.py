"""The shipped Prometheus rules: valid, unit-tested with promtool, and naming only metrics we export."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

RULES_DIR = Path(__file__).resolve().parent.parent / "packaging" / "prometheus"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool missing: `make test-deps` installs Debian's prometheus package")
    return path


def test_promtool_check_rules() -> None:
    out = subprocess.run([_promtool(), "check", "rules", str(RULES_DIR / "burstwatch.rules.yml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_test_rules() -> None:
    out = subprocess.run([_promtool(), "test", "rules", "tests.yml"], cwd=RULES_DIR, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_rules_reference_only_documented_metrics() -> None:
    text = (RULES_DIR / "burstwatch.rules.yml").read_text()
    docs = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    used = set(re.findall(r"\b(burstwatch_[a-z_]+)", text))
    assert used
    missing = sorted(m for m in used if m not in docs)
    assert not missing, f"rules use metrics that docs/metrics.md does not describe: {missing}"
