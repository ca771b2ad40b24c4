"""Tests that cannot pass by accident (issue 29): four shapes, found in tests/ by reading the source (ast).

- a test function with no assertion at all (no `assert`, `pytest.raises`/`warns`, `pytest.fail`, and no call
  of a helper that asserts: one whose name starts with assert/check/expect/verify/wait, or a function of the
  same module that does);
- a test whose every `assert` sits under a block that may run zero times: an `if` without an asserting
  `else`, a `while`, or a `for` over anything but a non-empty literal (count what was checked, or assert the
  collection first);
- `time.sleep(...)` followed, within the next three statements, by an `assert` of the shape "nothing
  changed" (`not ...`, `not in`, `is`, `==`): a pause is no proof that the code under test had its turn. Wait
  for an event that proves it (N more samples, another save, a flush counted) or inject the clock;
- a wall-clock upper bound under 1 s: `assert time.monotonic() - t0 < 0.5`, or the same through a name
  assigned from such a difference. A loaded machine misses those; inject a clock, or bound it at 1 s or more
  and say the margin in a comment.

EXEMPT names the few left on purpose, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Union

TESTS = Path(__file__).resolve().parent
Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]

EXEMPT: Dict[str, str] = {
    # Measures the .deb daemon's RSS after it has run `settle` seconds; the assert is that it is still alive.
    "tests/kubernetes/test_cluster.py:_deb_daemon_rss": "a measurement's settling time, not a race",
}
ASSERTING_HELPERS = ("assert", "check", "expect", "verify", "wait", "must")
CLOCKS = {"monotonic", "time", "perf_counter"}


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(TESTS.rglob("*.py")):
        yield str(path.relative_to(TESTS.parent)), ast.parse(path.read_text(encoding="utf-8"))


def _functions(tree: ast.AST) -> Iterator[Function]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")


def _asserts(node: ast.AST, helpers: Dict[str, Function], depth: int = 0) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Assert):
            return True
        if isinstance(n, ast.Call):
            name = _call_name(n)
            if name in ("raises", "warns", "deprecated_call", "fail") or name.startswith(ASSERTING_HELPERS):
                return True
            if depth < 3 and name in helpers and helpers[name] is not node and \
                    _asserts(helpers[name], helpers, depth + 1):
                return True
    return False


def _may_skip(node: ast.AST) -> bool:
    """A block that may run zero times."""
    if isinstance(node, ast.If):
        return not any(isinstance(x, ast.Assert) for s in node.orelse for x in ast.walk(s))
    if isinstance(node, (ast.For, ast.AsyncFor)):
        it = node.iter
        if isinstance(it, ast.Dict):
            return not it.keys
        return not (isinstance(it, (ast.List, ast.Tuple, ast.Set)) and it.elts)
    return isinstance(node, ast.While)


def _parents(tree: ast.AST) -> Dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_sleep(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _call_name(stmt.value) == "sleep"


def _nothing_changed(test: ast.expr) -> bool:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return True
    if isinstance(test, ast.BoolOp):
        return any(_nothing_changed(v) for v in test.values)
    return isinstance(test, ast.Compare) and any(isinstance(o, (ast.NotIn, ast.Is, ast.Eq)) for o in test.ops)


def _elapsed(node: ast.expr, names: Set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and isinstance(node.left, ast.Call) \
        and isinstance(node.left.func, ast.Attribute) and node.left.func.attr in CLOCKS \
        and isinstance(node.left.func.value, ast.Name) and node.left.func.value.id == "time"


def _constant(node: ast.expr) -> Optional[float]:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _exempt(where: str, fn: Function) -> bool:
    return f"{where}:{fn.name}" in EXEMPT


def _guarded_only(fn: Function, parents: Dict[ast.AST, ast.AST]) -> Optional[int]:
    """The line of the first assert when every assert of `fn` sits under a block that may run zero times."""
    asserts = [n for n in ast.walk(fn) if isinstance(n, ast.Assert)]

    def guarded(a: ast.AST) -> bool:
        n = parents[a]
        while n is not fn:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return False
            if _may_skip(n):
                return True
            n = parents[n]
        return False
    return asserts[0].lineno if asserts and all(guarded(a) for a in asserts) else None


def _sleeps_then_no_change(fn: Function) -> Iterator[int]:
    for node in ast.walk(fn):
        for block in (getattr(node, "body", None), getattr(node, "orelse", None), getattr(node, "finalbody", None)):
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if not _is_sleep(stmt):
                    continue
                for nxt in block[i + 1:i + 4]:
                    if _is_sleep(nxt):
                        break
                    if isinstance(nxt, ast.Assert):
                        if _nothing_changed(nxt.test):
                            yield stmt.lineno
                        break


def _tight_bounds(fn: Function) -> Iterator[tuple[int, float]]:
    names = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and _elapsed(n.value, set())
             for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(fn):
        if not isinstance(node, ast.Assert):
            continue
        for c in ast.walk(node.test):
            if not isinstance(c, ast.Compare):
                continue
            seq = [c.left, *c.comparators]
            for i, op in enumerate(c.ops):
                bound = None
                if isinstance(op, (ast.Lt, ast.LtE)) and _elapsed(seq[i], names):
                    bound = _constant(seq[i + 1])
                elif isinstance(op, (ast.Gt, ast.GtE)) and _elapsed(seq[i + 1], names):
                    bound = _constant(seq[i])
                if bound is not None and bound < 1.0:
                    yield node.lineno, bound


def find() -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = {"no assert": [], "asserts only under if/for": [], "sleep then no change": [],
                                   "wall-clock bound under 1 s": []}
    for where, tree in _sources():
        helpers = {fn.name: fn for fn in _functions(tree)}
        parents = _parents(tree)
        for fn in _functions(tree):
            if _exempt(where, fn):
                continue
            if fn.name.startswith("test"):
                if not _asserts(fn, helpers):
                    found["no assert"].append(f"{where}:{fn.lineno} {fn.name}")
                line = _guarded_only(fn, parents)
                if line is not None:
                    found["asserts only under if/for"].append(f"{where}:{line} {fn.name}")
            found["sleep then no change"] += [f"{where}:{n} in {fn.name}" for n in _sleeps_then_no_change(fn)]
            found["wall-clock bound under 1 s"] += [f"{where}:{n} < {b:g} s" for n, b in _tight_bounds(fn)]
    return found


def test_no_test_can_pass_by_accident() -> None:
    found = find()
    bad = [f"{shape}: {row}" for shape, rows in found.items() for row in rows]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_each_shape(tmp_path: Path) -> None:
    tree = ast.parse('''
import time
def test_nothing():
    x = 1
def test_guarded(items):
    for i in items:
        assert i
def test_literal_loop():
    for i in (1, 2):
        assert i
def test_race(svc):
    time.sleep(0.3)
    assert svc.count == 0
def test_tight():
    t0 = time.monotonic()
    took = time.monotonic() - t0
    assert took < 0.2
''')
    helpers = {fn.name: fn for fn in _functions(tree)}
    byname = {fn.name: fn for fn in _functions(tree)}
    assert not _asserts(byname["test_nothing"], helpers)
    loop = next(n for n in ast.walk(byname["test_guarded"]) if isinstance(n, ast.For))
    literal = next(n for n in ast.walk(byname["test_literal_loop"]) if isinstance(n, ast.For))
    assert _may_skip(loop) and not _may_skip(literal)
    race = byname["test_race"].body
    assert _is_sleep(race[0]) and isinstance(race[1], ast.Assert) and _nothing_changed(race[1].test)
    tight = byname["test_tight"].body
    assert isinstance(tight[1], ast.Assign) and _elapsed(tight[1].value, set())
    assert isinstance(tight[2], ast.Assert) and isinstance(tight[2].test, ast.Compare)
    assert _elapsed(tight[2].test.left, {"took"}) and _constant(tight[2].test.comparators[0]) == 0.2
