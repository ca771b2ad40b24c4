"""The daemon's TOML for a test: lab defaults that a test overrides key by key, written by a small TOML writer.

`daemon_config(tmp_path, sample_interval=0.5, instance={"type": "m5.large"})` writes tmp_path/burstwatch.toml
from `lab_config`'s defaults (state under tmp_path, the interfaces ["lo"], /metrics on a free loopback port,
no IMDS, no responder) with the given keys set. A table given replaces the default table whole (it is not
merged into it), and None leaves a key out, at any depth. The writer covers what the daemon's config uses:
strings (and paths), integers, floats, booleans, lists of those, and nested tables (written as [a.b]).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Mapping

from tests.conftest import free_port

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def lab_config(tmp: Path, **sections: Any) -> dict[str, Any]:
    """The lab defaults with `sections` set over them (top-level keys; a table replaces the default one)."""
    doc: dict[str, Any] = {
        "state_dir": tmp / "state",
        "interfaces": ["lo"],
        "metrics": None if "metrics" in sections else {"listen": f"127.0.0.1:{free_port()}"},
        "imds": {"enabled": False},          # the lab has no IMDS unless a test starts one
        "responder": {"enabled": False},
    }
    doc.update(sections)
    return doc


def daemon_config(tmp: Path, name: str = "burstwatch", **sections: Any) -> Path:
    """Write `lab_config(tmp, **sections)` to tmp/<name>.toml and return its path."""
    path = tmp / f"{name}.toml"
    path.write_text(toml_text(lab_config(tmp, **sections)), encoding="utf-8")
    return path


def toml_text(doc: Mapping[str, Any]) -> str:
    """`doc` as TOML (tomllib/tomli read it back equal, paths as strings); None values are left out."""
    lines: list[str] = []
    _table(lines, (), doc)
    return "\n".join(lines) + "\n"


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    items = [(k, v) for k, v in table.items() if v is not None]
    plain = [(k, v) for k, v in items if not isinstance(v, Mapping)]
    if path and (plain or not items):
        if lines:
            lines.append("")
        lines.append("[" + ".".join(_key(k) for k in path) + "]")
    lines.extend(f"{_key(k)} = {_value(v)}" for k, v in plain)
    for k, v in items:
        if isinstance(v, Mapping):
            _table(lines, (*path, k), v)


def _key(key: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"TOML keys are strings, not {key!r}")
    return key if _BARE_KEY.match(key) else _string(key)


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " " or ch == "\x7f":     # control characters: escaped (a tab too, for simplicity)
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)                      # 0.5, 10.0, 1e-05, 1e+16: all TOML floats
    if isinstance(v, (str, os.PathLike)):
        return _string(os.fspath(v))
    if isinstance(v, (list, tuple)):
        if any(isinstance(x, Mapping) for x in v):
            raise TypeError("arrays of tables are not needed by the daemon's config, so not written")
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")
