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


@pytest.mark.parametrize("name, builder", [("burstwatch-dashboard.json", "build"),
                                           ("burstwatch-fleet-dashboard.json", "build_fleet")])
def test_dashboard_is_generated_and_uses_documented_metrics(name: str, builder: str) -> None:
    import json
    import sys

    root = Path(__file__).resolve().parent.parent
    path = root / "packaging" / "grafana" / name
    out = subprocess.run([sys.executable, "-c", "import sys;sys.path.insert(0,'scripts');"
                          f"import gen_dashboard,json;print(json.dumps(gen_dashboard.{builder}(),indent=1))"],
                         cwd=root, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == json.loads(path.read_text()), "run scripts/gen_dashboard.py"
    exprs = [t["expr"] for p in json.loads(path.read_text())["panels"] for t in p["targets"]]
    docs = (root / "docs" / "metrics.md").read_text()
    used = {m for e in exprs for m in re.findall(r"\b(burstwatch_[a-z_]+)", e)}
    missing = sorted(m for m in used if m not in docs)
    assert not missing, f"dashboard uses metrics that docs/metrics.md does not describe: {missing}"
