"""The daemon started as the packages start it: packaging/bin/burstwatch itself (its shebang's interpreter and
flags) with the agent from another directory, in the unit's environment (its Environment= lines). The bench and
the pod test measure the daemon this way, so what they measure is what an install runs."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import ROOT

LAUNCHER = ROOT / "packaging" / "bin" / "burstwatch"
UNIT = ROOT / "systemd" / "burstwatch.service"


def launcher_argv(libdir: Path, launcher: Path = LAUNCHER) -> list[str]:
    """argv that runs `launcher` with `libdir` in place of /usr/lib/burstwatch; the subcommand follows."""
    text = launcher.read_text(encoding="utf-8")
    interpreter = text.splitlines()[0][2:].split()
    code = text.replace('LIBDIR = "/usr/lib/burstwatch"', f"LIBDIR = {str(libdir)!r}")
    if code == text:
        raise AssertionError(f"{launcher} no longer sets LIBDIR as tests/support/launch.py expects")
    return [*interpreter, "-c", code]


def unit_env(unit: Path = UNIT) -> dict[str, str]:
    """This process's environment plus the unit's Environment= settings."""
    pairs = [line[len("Environment="):].split("=", 1) for line in unit.read_text(encoding="utf-8").splitlines()
             if line.startswith("Environment=")]
    return dict(os.environ, **dict(pairs))
