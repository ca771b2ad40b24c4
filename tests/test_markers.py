"""`make unit` runs `-m "not netns and not slow"`: what needs root and namespaces or a real daemon must say so.

Read from the source (ast), not from a collection run: every module under tests/e2e/ carries a module-level
`pytestmark` with `netns` or `slow`, and elsewhere a test function that builds a namespace lab or starts
`python -m agent run` is marked so, on itself or on its module.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import pytest

TESTS = Path(__file__).resolve().parent
E2E = TESTS / "e2e"
MARKS = {"netns", "slow"}
# What a test body says when it needs a namespace lab (root) or the real daemon.
NEEDS = ("Lab(", '"-m", "agent", "run"', "'-m', 'agent', 'run'")


def marks_in(node: Optional[ast.AST]) -> set[str]:
    """The names of the `pytest.mark.<name>` attributes in an expression (a mark, a list of marks, a call)."""
    if node is None:
        return set()
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}


def module_marks(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
                found |= marks_in(node.value)
    return found


def unmarked(path: Path) -> list[str]:
    """Test functions in `path` whose body needs a namespace lab or the daemon, and that carry neither
    mark themselves nor through their module."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    if module_marks(tree) & MARKS:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            body = ast.get_source_segment(source, node) or ""
            decorated = set().union(*(marks_in(d) for d in node.decorator_list))
            if any(n in body for n in NEEDS) and not decorated & MARKS:
                out.append(node.name)
    return out


def e2e_modules() -> list[Path]:
    return sorted(E2E.glob("test_*.py"))


def test_there_are_e2e_modules() -> None:
    assert len(e2e_modules()) >= 10


@pytest.mark.parametrize("path", e2e_modules(), ids=lambda p: p.name)
def test_every_e2e_module_is_marked_netns_or_slow(path: Path) -> None:
    marks = module_marks(ast.parse(path.read_text(encoding="utf-8")))
    assert marks & MARKS, f"{path.relative_to(TESTS.parent)}: no module-level pytestmark with netns or slow"


def test_tests_elsewhere_that_need_a_lab_or_the_daemon_are_marked() -> None:
    offenders = {str(p.relative_to(TESTS.parent)): names for p in sorted(TESTS.rglob("test_*.py"))
                 if E2E not in p.parents and p != Path(__file__).resolve() and (names := unmarked(p))}
    assert offenders == {}


def test_the_check_can_fail(tmp_path: Path) -> None:
    bare = tmp_path / "test_bare.py"
    bare.write_text("def test_lab():\n    with Lab() as lab:\n        pass\n\ndef test_pure():\n    assert 1\n")
    assert unmarked(bare) == ["test_lab"]
    assert module_marks(ast.parse(bare.read_text())) == set()
    bare.write_text("import pytest\n\n@pytest.mark.netns\ndef test_lab():\n    Lab()\n")
    assert unmarked(bare) == []
    bare.write_text("import pytest\npytestmark = [pytest.mark.netns, pytest.mark.slow]\n")
    assert module_marks(ast.parse(bare.read_text())) == {"netns", "slow"}
