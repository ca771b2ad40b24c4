"""The tests' TOML writer and lab config: what it writes reads back the same through tomllib (tomli on 3.9)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agent import config
from tests.support.daemon_config import daemon_config, lab_config, toml_text

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


@pytest.mark.parametrize("doc", [
    {},
    {"a": 1, "b": -2, "c": 0.5, "d": 10.0, "e": 1e-05, "f": 1e16, "g": True, "h": False},
    {"s": 'quote " backslash \\ tab \t newline \n nul \x00 del \x7f é 雪 🌊', "empty": ""},
    {"list": [1, 2, 3], "strs": ["10.0.0.0/8", "::1"], "none": [], "floats": [0.1, 2.0], "nested": [[1], ["x"]]},
    {"top": 1, "t": {"x": 1, "sub": {"y": "z", "deeper": {"w": [True]}}}, "u": {"only": {"k": 2}}},
    {"odd key": 1, "dotted.key": {"a b": "c"}, "": 3, "tbl": {}},
], ids=["empty", "scalars", "strings", "lists", "tables", "keys"])
def test_round_trip(doc: dict[str, Any]) -> None:
    assert tomllib.loads(toml_text(doc)) == doc


def test_special_floats_paths_and_none() -> None:
    back = tomllib.loads(toml_text({"p": Path("/tmp/x y"), "inf": float("inf"), "ninf": float("-inf"),
                                    "nan": float("nan"), "gone": None, "t": {"gone": None, "kept": 1}}))
    assert back["p"] == "/tmp/x y" and back["inf"] == float("inf") and back["ninf"] == float("-inf")
    assert back["nan"] != back["nan"]
    assert "gone" not in back and back["t"] == {"kept": 1}


def test_what_it_cannot_write_it_refuses() -> None:
    for bad in ({"a": [{"x": 1}]}, {"a": object()}, {1: 2}):
        with pytest.raises(TypeError):
            toml_text(bad)


def test_tables_read_as_the_daemon_expects(tmp_path: Path) -> None:
    """The layout a few tests edit as text: a scalar first, then [table] headers with their keys."""
    text = toml_text({"sample_interval": 0.5, "responder": {"enabled": False},
                      "instance": {"type": "m5.large", "bandwidth": {"peak_gbps": 0.2}}})
    assert text.startswith("sample_interval = 0.5\n")
    assert "[responder]\nenabled = false\n" in text
    assert '[instance]\ntype = "m5.large"\n\n[instance.bandwidth]\npeak_gbps = 0.2\n' in text


def test_lab_defaults_overridden_key_by_key_and_loadable(tmp_path: Path) -> None:
    doc = lab_config(tmp_path)
    assert doc["state_dir"] == tmp_path / "state" and doc["interfaces"] == ["lo"]
    assert doc["imds"] == {"enabled": False} and doc["responder"] == {"enabled": False}
    assert doc["metrics"]["listen"].startswith("127.0.0.1:")
    path = daemon_config(tmp_path, "lab", sample_interval=0.25, interfaces=None,
                         responder={"listen": "127.0.0.1:5201", "allow": ["127.0.0.0/8"]})
    assert path == tmp_path / "lab.toml"
    back = tomllib.loads(path.read_text())
    assert "interfaces" not in back and back["sample_interval"] == 0.25
    assert back["responder"] == {"listen": "127.0.0.1:5201", "allow": ["127.0.0.0/8"]}   # replaced, not merged
    cfg = config.parse(path.read_text())                  # the daemon's own loader takes it
    assert cfg.sample_interval == 0.25 and cfg.state_dir == str(tmp_path / "state")
