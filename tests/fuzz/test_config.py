"""Fuzzing the config loader: whatever the file holds, only ConfigError escapes, and it names the file and key.

`burstwatch check-config`, start-up and SIGHUP reload all go through config.load/parse and catch ConfigError
alone (a bad reload keeps the old config and says so); any other exception there is a crash or a reload
that dies. A config that is accepted must hold only values its keys allow (ranges, checks)."""

from __future__ import annotations

import dataclasses
import datetime
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent import config as c

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = [(ROOT / f).read_text(encoding="utf-8") for f in ("agent/data/default.toml", "packaging/burstwatch.toml")
            if (ROOT / f).exists()]
WHERE = "fuzz.toml"
KEYS = {key: tp for key, tp, _default, _doc in c.describe_keys()}
SECTIONS = sorted({key.rpartition(".")[0] for key in KEYS} - {""})


# -- TOML writing (for well-formed documents with arbitrary keys and values) ------------------------------------

def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{toml_str(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_doc(doc: dict[str, Any], path: tuple[str, ...] = ()) -> str:
    """Values first, then each sub-table under its own [a.b] header (so dict values are tables)."""
    plain = [f"{toml_str(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    text = ("[" + ".".join(toml_str(p) for p in path) + "]\n" if path else "") + "".join(x + "\n" for x in plain)
    for k, v in doc.items():
        if isinstance(v, dict):
            text += toml_doc(v, (*path, k))
    return text


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def set_path(doc: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        doc = doc.setdefault(part, {})
    doc[leaf] = value


def paths(doc: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in doc.items():
        out.append(prefix + k)
        if isinstance(v, dict):
            out.extend(paths(v, f"{prefix}{k}."))
    return out


# -- values: anything TOML can hold, and values close to what each key expects ---------------------------------

toml_scalars = (st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
                | st.dates() | st.datetimes() | st.times())
toml_values = st.recursive(
    toml_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
near_strings = st.sampled_from([
    "", "0.0.0.0:9786", "[::]:9786", "[::1:9786", "127.0.0.1:0", "host:65536", "host:²", "host:\u0661\u0662", "x:",
    "http://127.0.0.1:5000", "ftp://x", "/etc/burstwatch/x.pem", "relative.pem", "auto", "ethtool", "tc", "none",
    "debug", "INFO", "loud", "TLS12", "TLS13", "TLS11", "NoClientCert", "RequireAndVerifyClientCert",
    "10.0.0.0/8", "fe80::%eth0/64", "10.0.0.0/33", "out", "in", "burstwatch:peer=true", "=x", "AWS/EC2",
    "$2y$10$" + "a" * 53, "$2y$²²$" + "a" * 53, "$2y$99$" + "a" * 53, "eth0",
]) | st.text(max_size=20)
near_numbers = (st.floats() | st.integers(-10, 10**7) | st.sampled_from([0, 1, 2**50, 2**63, 0.0999, 1e-300])
                | st.integers())


def near(type_desc: str) -> st.SearchStrategy[Any]:
    """Values of (mostly) the type describe_keys() says the key has, in and out of its range."""
    if type_desc in ("a number", "an integer"):
        return near_numbers
    if type_desc == "a boolean":
        return st.booleans()
    if type_desc == "a string":
        return near_strings
    if type_desc == "a list of strings":
        return st.lists(near_strings, max_size=3)
    if type_desc == "a table of strings":
        return st.dictionaries(near_strings, near_strings, max_size=2)
    return toml_values


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A TOML document: some known keys with near or arbitrary values, perhaps an unknown key or table."""
    doc: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(KEYS)), max_size=6, unique=True)):
        set_path(doc, key, draw(near(KEYS[key]) | toml_values if draw(st.booleans()) else near(KEYS[key])))
    if draw(st.integers(0, 3)) == 0:
        table = doc
        for part in draw(st.sampled_from(["", *SECTIONS])).split("."):
            if part:
                table = table.setdefault(part, {})
        table[draw(st.text(min_size=1, max_size=8))] = draw(toml_values)
    return doc


def in_range(cfg: Any, prefix: str = "") -> list[str]:
    """Keys of an accepted config whose value its own range or check would refuse."""
    bad = []
    for f in dataclasses.fields(cfg):
        v, key = getattr(cfg, f.name), prefix + f.name
        if dataclasses.is_dataclass(v):
            bad.extend(in_range(v, key + "."))
            continue
        lo, hi, check = f.metadata.get("lo"), f.metadata.get("hi"), f.metadata.get("check")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (
                (lo is None or lo <= v) and (hi is None or v <= hi)):
            bad.append(f"{key} = {v!r}")
        if check is not None and v is not None and check(v) is not None:
            bad.append(f"{key}: {check(v)}")
    return bad


def outcome(text: str) -> tuple[c.Config | None, str]:
    try:
        return c.parse(text, WHERE), ""
    except c.ConfigError as exc:
        msg = str(exc)
        assert msg.startswith(f"{WHERE}: "), msg
        return None, msg


# -- the properties ------------------------------------------------------------------------------------------

@given(documents())
@example({"sample_interval": math.nan})
@example({"metrics": {"listen": "x:²"}})
@example({"rate_window": 0.5, "sample_interval": 2})
@example({"probe": {"archive": {"enabled": True}}})
@example({"instance": {"bandwidth": {"baseline_gbps": 5, "peak_gbps": 1}}})
def test_well_formed_toml_is_a_config_or_an_error_naming_a_key(doc: dict[str, Any]) -> None:
    text = toml_doc(doc)
    assert same(tomllib.loads(text), doc), text  # the writer above is right
    cfg, msg = outcome(text)
    if cfg is None:
        named = [k for k in [*paths(doc), *KEYS] if repr(k) in msg or f"[{k}]" in msg]
        assert named, f"no key named in {msg!r}"
    else:
        assert in_range(cfg) == []


@given(st.sampled_from(sorted(KEYS)), st.data())
def test_one_bad_value_is_refused_with_its_key(key: str, data: st.DataObject) -> None:
    value = data.draw(near(KEYS[key]) | toml_values, label="value")
    doc: dict[str, Any] = {}
    set_path(doc, key, value)
    cfg, msg = outcome(toml_doc(doc))
    if cfg is None:
        assert key in msg, msg  # quoted when the value is wrong; cross-checks name it as the reason
    else:
        assert in_range(cfg) == []


FRAGMENTS = ["\n", " ", "=", "[", "]", "[[", "]]", "{", "}", ",", ".", '"', "'", '"""', "'''", "#", "\\", "\\u",
             "true", "false", "nan", "inf", "-", "+", "_", "0x", "0o", "1", "1.5", "1e9", "1979-05-27T07:32:00Z",
             "\t", "\r\n", "\x00", "\x7f", "é", *(k.rpartition(".")[2] for k in KEYS), *SECTIONS]
tomlish = (st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=40).map("".join)
           | st.text(max_size=80))


@st.composite
def damaged_examples(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(EXAMPLES)) if EXAMPLES else ""
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 8))
        text = text[:at] + draw(st.sampled_from(FRAGMENTS) | st.text(max_size=3)) + text[at + cut:]
    return text


@given(tomlish | damaged_examples())
@example("a = " + "[" * 60_000)
@example("a = " + "{b = " * 20_000)
@example("interfaces = " + "[" * 200 + "]" * 200)
@example("sample_interval = " + "1" * 5000)  # past Python's 4300-digit limit: int() raises ValueError
@example("sample_interval = 0x" + "f" * 4000)  # parsed, but repr() of it raises ValueError
@example(f"sample_interval = {10**400}")  # float() of it raises OverflowError
def test_any_text_is_a_config_or_a_config_error(text: str) -> None:
    cfg, msg = outcome(text)
    if cfg is not None:
        assert in_range(cfg) == []
    else:
        assert msg.startswith(f"{WHERE}: ") and len(msg) > len(f"{WHERE}: "), msg   # a refusal says why


@given(st.binary(max_size=200) | tomlish.map(lambda s: s.encode("utf-8")))
def test_load_reads_any_file_into_a_config_or_a_config_error(tmp_path_factory: pytest.TempPathFactory,
                                                              raw: bytes) -> None:
    path = tmp_path_factory.mktemp("cfg") / "burstwatch.toml"
    path.write_bytes(raw)
    try:
        c.load(path)
    except c.ConfigError as exc:
        assert str(exc).startswith(str(path)), exc


# -- found by the properties above, kept as plain examples ----------------------------------------------------

@pytest.mark.parametrize("text", ["a = " + "[" * 60_000, "interfaces = " + "{a = " * 20_000,
                                  "sample_interval = " + "1" * 5000],
                         ids=["arrays", "inline-tables", "long-integer"])
def test_toml_the_parser_chokes_on_is_a_config_error(text: str) -> None:
    """tomllib recurses once per nesting level (RecursionError), and int() refuses more than 4300 digits
    (ValueError, not TOMLDecodeError): both escaped parse()."""
    with pytest.raises(c.ConfigError, match=r"^fuzz\.toml: not valid TOML"):
        c.parse(text, WHERE)


HUGE = 10**400  # beyond a float's range: float() of it raises OverflowError
HUGER = "0x" + "f" * 4000  # TOML's hex form of an integer whose repr() passes Python's 4300-digit limit


@pytest.mark.parametrize(("key", "value"), [
    ("sample_interval", str(HUGE)), ("sample_interval", f"-{HUGE}"), ("responder.max_bytes", str(HUGE)),
    ("sample_interval", HUGER), ("responder.max_bytes", HUGER), ("state_dir", HUGER), ("interfaces", f"[{HUGER}]"),
    ("metrics", HUGER)], ids=["float", "negative-float", "int", "hex-float", "hex-int", "hex-str", "hex-in-list",
                             "hex-table"])
def test_huge_integers_are_a_config_error_naming_the_key(key: str, value: str) -> None:
    section, _, leaf = key.rpartition(".")
    text = (f"[{section}]\n" if section else "") + f"{leaf} = {value}\n"
    with pytest.raises(c.ConfigError, match=rf"^fuzz\.toml: (key '{key}'|\[{key}\])") as info:
        c.parse(text, WHERE)
    assert len(str(info.value)) < 1000 or value == str(HUGE) or value == f"-{HUGE}"


@pytest.mark.parametrize("key", ["sample_interval", "metrics.header_timeout", "probe.credit_floor"])
@pytest.mark.parametrize("value", ["nan", "-nan", "inf", "-inf"])
def test_nan_and_infinity_are_out_of_range(key: str, value: str) -> None:
    """`nan < lo` and `nan > hi` are both false, so a nan slipped through every range check."""
    section, _, leaf = key.rpartition(".")
    text = (f"[{section}]\n" if section else "") + f"{leaf} = {value}\n"
    with pytest.raises(c.ConfigError, match=rf"^fuzz\.toml: key '{key}' = .* is out of range"):
        c.parse(text, WHERE)


@pytest.mark.parametrize(("key", "value"), [("metrics.listen", "host:²"), ("responder.listen", "[::]:¹"),
                                            ("probe.peers", ["peer:³"]),
                                            ("metrics.basic_auth_users", {"u": "$2y$²²$" + "a" * 53})])
def test_a_checker_tripping_over_a_value_is_a_config_error(key: str, value: Any) -> None:
    """str.isdigit() is true for superscript digits, which int() refuses: the checkers raised ValueError."""
    doc: dict[str, Any] = {}
    set_path(doc, key, value)
    with pytest.raises(c.ConfigError, match=rf"^fuzz\.toml: key '{key}'"):
        c.parse(toml_doc(doc), WHERE)
