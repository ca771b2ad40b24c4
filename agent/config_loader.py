"""TOML into config dataclasses: types, ranges and checks, each problem named by file and key; key docs."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # Amazon Linux 2023 ships Python 3.9, which has no tomllib
    import tomli as tomllib


class ConfigError(ValueError):
    """A configuration problem; the message names the file and the key."""


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def describe_type(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Union:
        return " or ".join(describe_type(a) for a in get_args(tp) if a is not type(None))
    if origin is list:
        inner = describe_type(get_args(tp)[0]).split(' ', 1)[1]      # "a list of strings" -> "list of strings"
        return f"a list of lists of {inner.split(' of ', 1)[1]}" if inner.startswith("list of ") else \
            f"a list of {inner}s"
    if origin is dict:
        return "a table of strings"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return _TYPE_NAMES.get(tp, str(tp))


def _coerce_union(tp: Any, value: Any) -> tuple[bool, Any]:
    for arg in get_args(tp):
        if arg is type(None):
            continue
        ok, out = _coerce(arg, value)
        if ok:
            return True, out
    return False, value


def _coerce_list(tp: Any, value: Any) -> tuple[bool, Any]:
    if not isinstance(value, list):
        return False, value
    (item_tp,) = get_args(tp)
    items = [_coerce(item_tp, v) for v in value]
    return all(ok for ok, _ in items), [v for _, v in items]


def _coerce_dict(_tp: Any, value: Any) -> tuple[bool, Any]:
    ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return ok, dict(value) if ok else value


def _coerce_float(value: Any) -> tuple[bool, Any]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return True, float(value)
        except OverflowError:  # an integer beyond a float's range: the range check refuses it by value
            return True, value
    return False, value


_BY_ORIGIN = {Union: _coerce_union, list: _coerce_list, dict: _coerce_dict}


def _coerce(tp: Any, value: Any) -> tuple[bool, Any]:
    """Returns (ok, value) for a TOML value against a field type; ints are accepted as floats."""
    by_origin = _BY_ORIGIN.get(get_origin(tp))
    if by_origin is not None:
        return by_origin(tp, value)
    if tp is float:
        return _coerce_float(value)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    return isinstance(value, tp), value


def show_value(value: Any) -> str:
    """repr() for a message; an integer past Python's 4300-digit limit (which TOML's hex, octal and binary
    forms can write in 3600 characters) makes repr() raise ValueError, so it is described instead."""
    try:
        return repr(value)
    except ValueError:
        if isinstance(value, int):
            return f"an integer of {value.bit_length()} bits"
        return f"a {type(value).__name__} holding an integer too large to show"


def _check_value(key: str, value: Any, meta: Any, where: str) -> None:
    """The key's range and custom check; ConfigError naming the key when the value fails either."""
    lo, hi = meta.get("lo"), meta.get("hi")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # Written as "not inside" so that nan (TOML's `nan`), for which every comparison is false, is out.
        if (lo is not None and not value >= lo) or (hi is not None and not value <= hi):
            raise ConfigError(f"{where}: key {key!r} = {show_value(value)} is out of range {lo:g} .. {hi:g}")
    check = meta.get("check")
    try:
        problem = check(value) if check and value is not None else None
    except ValueError as exc:  # a check that tripped over a value it did not foresee is still the key's fault
        problem = f"{show_value(value)} is not valid: {exc}"
    if problem:
        raise ConfigError(f"{where}: key {key!r}: {problem}")


def build(cls: type, table: dict[str, Any], prefix: str, where: str) -> Any:
    """An instance of the dataclass `cls` from a TOML table: unknown keys, wrong types, values out of range
    and values a key's check refuses are ConfigErrors naming `where` and the key."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key {prefix + unknown[0]!r}"
                          f" (known: {', '.join(sorted(fields))})")
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: [{key}] must be a table, got {show_value(value)}")
            kwargs[name] = build(tp, value, f"{key}.", where)  # type: ignore[arg-type]
            continue
        ok, coerced = _coerce(tp, value)
        if not ok:
            raise ConfigError(f"{where}: key {key!r} must be {describe_type(tp)}, got {show_value(value)}")
        _check_value(key, coerced, fields[name].metadata, where)
        kwargs[name] = coerced  # the validated form replaces the raw TOML value
    return cls(**kwargs)


def read_toml(text: str, where: str) -> dict[str, Any]:
    """TOML text as a table; anything tomllib refuses is a ConfigError naming `where`."""
    try:
        return tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or int() of more than 4300 decimal digits
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per level of nested arrays and inline tables
        raise ConfigError(f"{where}: not valid TOML: arrays or inline tables nested too deeply") from None


def describe_fields(cls: type, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(key, type description, default, doc) for every key of the dataclass `cls`, in declaration order."""
    out: list[tuple[str, str, Any, str]] = []
    hints = get_type_hints(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(describe_fields(tp, f"{prefix}{f.name}."))  # type: ignore[arg-type]
        else:
            out.append((f"{prefix}{f.name}", describe_type(tp), getattr(instance, f.name), f.metadata["doc"]))
    return out


# -- reloads: the one place that decides, per key, whether SIGHUP applies it or it waits for a restart --------
# A key (or a whole section) declared with `restart=True` keeps its running value until the next start; every
# other key is applied live by its section's handler (agent/wiring.py). docs/configuration.md's "on SIGHUP"
# column is generated from reload_decisions(), and tests/test_reload_keys.py changes every key one at a time
# against a running agent and holds each to its decision.

def reload_decisions(cls: type, prefix: str = "", restart: bool = False) -> dict[str, bool]:
    """Every key of `cls` (sections flattened, in declaration order) -> True when a change waits for a restart
    (the key or a section around it is marked `restart`), False when a reload applies it."""
    out: dict[str, bool] = {}
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        waits = restart or bool(f.metadata.get("restart"))
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(reload_decisions(hints[f.name], f"{prefix}{f.name}.", waits))
        else:
            out[prefix + f.name] = waits
    return out


def restart_keys_changed(running: Any, new: Any, prefix: str = "", restart: bool = False) -> list[str]:
    """The keys that wait for a restart whose value in `new` differs from the running one: what a SIGHUP
    cannot apply, named one by one (a section marked `restart` names each of its keys that changed)."""
    out: list[str] = []
    for f in dataclasses.fields(running):
        a, b = getattr(running, f.name), getattr(new, f.name)
        if a == b:
            continue
        waits = restart or bool(f.metadata.get("restart"))
        if dataclasses.is_dataclass(a):
            out.extend(restart_keys_changed(a, b, f"{prefix}{f.name}.", waits))
        elif waits:
            out.append(prefix + f.name)
    return out


def keep_restart_keys(running: Any, new: Any) -> Any:
    """`new` with every key that waits for a restart at its value in `running`: the config that runs after
    a reload, which each section's handler is given."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(running):
        a, b = getattr(running, f.name), getattr(new, f.name)
        if a == b:
            continue
        if f.metadata.get("restart"):
            changes[f.name] = a
        elif dataclasses.is_dataclass(a):
            changes[f.name] = keep_restart_keys(a, b)
    return dataclasses.replace(new, **changes) if changes else new
