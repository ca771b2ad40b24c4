"""packaging/burstwatch.toml, the config the packages install: every key of agent/config.py, commented,
with its real default, in the right table; accepted by `burstwatch check-config` as shipped and
with every line uncommented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent import config as configmod
from agent import config_loader
from tests.conftest import ROOT

EXAMPLE = ROOT / "packaging" / "burstwatch.toml"
KEY_LINE = re.compile(r"^#(?P<key>[A-Za-z_][A-Za-z0-9_]*) = (?P<value>.+)$")
TABLE_LINE = re.compile(r"^\[(?P<table>[A-Za-z0-9_.]+)\]\s*$")


def documented(with_comments: bool = False) -> dict[str, str]:
    """Full key ("metrics.listen") -> the value text of its commented-out line (or the prose
    comment block just above it)."""
    table, out, prose = "", {}, []  # type: tuple[str, dict[str, str], list[str]]
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        if m := TABLE_LINE.match(line):
            table, prose = m.group("table") + ".", []
        elif m := KEY_LINE.match(line):
            key = table + m.group("key")
            assert key not in out, f"{key} appears twice"
            out[key] = " ".join(prose) if with_comments else m.group("value")
            prose = []
        elif line.startswith("# "):
            prose.append(line[2:])
        elif not line.strip():
            pass
    return out


def uncommented() -> str:
    return "\n".join(re.sub(r"^#(?=[A-Za-z_][A-Za-z0-9_]* = )", "", line)
                     for line in EXAMPLE.read_text(encoding="utf-8").splitlines()) + "\n"


def test_every_key_is_documented_in_order_and_nothing_else() -> None:
    keys = [k for k, *_ in configmod.describe_keys()]
    shown = list(documented())
    assert sorted(shown) == sorted(keys), (f"missing: {sorted(set(keys) - set(shown))}; "
                                           f"unknown: {sorted(set(shown) - set(keys))}")
    assert shown == keys, "the example lists the keys in agent/config.py's order"


@pytest.mark.parametrize("key, default", [(k, d) for k, _t, d, _doc in configmod.describe_keys()])
def test_shown_value_is_the_default(key: str, default: object) -> None:
    """Keys with a fixed default show it; keys whose default is worked out at run time (None) or empty
    show an example, and the comment above says what happens when unset."""
    value = config_loader.tomllib.loads(f"v = {documented()[key]}")["v"]
    if default is None or (default in ([], {}) and value != default):
        prose = documented(with_comments=True)[key]
        assert re.search(r"\bdefault\b", prose, re.I), f"{key}: say what happens when it is unset: {prose!r}"
    else:
        assert value == default, f"{key}: the example shows {value!r}, the default is {default!r}"


def test_shipped_file_is_all_defaults() -> None:
    assert configmod.parse(EXAMPLE.read_text(encoding="utf-8"), str(EXAMPLE)) == configmod.Config()


def test_check_config_accepts_it_as_shipped_and_fully_uncommented(tmp_path: Path) -> None:
    full = tmp_path / "burstwatch.toml"
    full.write_text(uncommented(), encoding="utf-8")
    for path in (EXAMPLE, full):
        out = subprocess.run([sys.executable, "-m", "agent", "check-config", "--config", str(path)],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        assert f"{path}: ok" in out.stdout
    # Uncommented, every documented key is really set.
    assert set(config_loader.tomllib.loads(uncommented())) >= {"sample_interval", "metrics", "probe"}
