"""The layer contract (docs/architecture.md): imports only run down, services do not import each other, no
module imports itself back through others, and no module in agent/ is over MAX_LINES.

An import-linter "layers" + "independence" + "acyclic" contract, written as a test so it needs nothing beyond
the standard library's ast and runs in `make lint` and in every pytest run. Imports inside functions count
too: a late import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Mapping

import pytest

ROOT = Path(__file__).resolve().parent.parent / "agent"

# Bottom to top. A module may import from its own layer and from any layer below it. Every entry names a
# module or a package (and so everything under it), except the root package "agent": it names only
# agent/__init__.py (which holds __version__), so a new module at agent/'s top level is in no layer until
# someone decides where it belongs.
LAYERS: list[tuple[str, ...]] = [
    ("agent", "agent.config", "agent.config_checks", "agent.config_loader",
     "agent.isolate", "agent.notify", "agent.config_allowances",
     "agent.aws"),                                # foundation; aws: the boto3 client factory readers and writers share
    ("agent.readers", "agent.writers"),         # OS, IMDS, AWS: read and parse; state files, spools, uploads
    ("agent.models",),                                                   # pure: figures in, figures out
    ("agent.sampling", "agent.discovery", "agent.iperf3"),               # sampling steps, discovery, protocol
    ("agent.checks", "agent.probes", "agent.responder", "agent.cloudwatch", "agent.fleet"),  # services
    ("agent.exporters",),                                                # Prometheus views, status rendering
    ("agent.wiring", "agent.daemon", "agent.commands", "agent.cli", "agent.__main__"),         # entry points
]
ROOT_PACKAGE = "agent"
# Services run side by side and meet only through callables the wiring hands them.
INDEPENDENT = LAYERS[4]
# A module longer than this does more than one job (issue 19); split it by job, not by line count.
MAX_LINES = 450


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _entry_holds(entry: str, module: str) -> bool:
    return module == entry or (entry != ROOT_PACKAGE and module.startswith(entry + "."))


def _owner(module: str) -> tuple[int, str]:
    """(layer index, the layer entry the module belongs to): the longest entry that holds it."""
    best: tuple[int, str] = (-1, "")
    for i, layer in enumerate(LAYERS):
        for entry in layer:
            if _entry_holds(entry, module) and len(entry) >= len(best[1]):
                best = (i, entry)
    if best[0] < 0:
        raise AssertionError(f"module {module} is in no layer: add it to LAYERS in tests/test_layers.py")
    return best


def _modules(root: Path = ROOT) -> dict[str, Path]:
    return {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _imports(path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The agent modules `path` imports: `from agent.x import y` is agent.x.y when that is a module (a
    submodule import), else agent.x (a name defined in agent.x)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != ROOT_PACKAGE and not node.module.startswith(ROOT_PACKAGE + "."):
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if _entry_holds(ROOT_PACKAGE, a.name)
                       or a.name.startswith(ROOT_PACKAGE + "."))
    return out


def _edge_problem(module: str, dep: str) -> str | None:
    """Why `module` may not import `dep`, or None when it may."""
    layer, entry = _owner(module)
    dep_layer, dep_entry = _owner(dep)
    if dep_layer > layer:
        return f"{module} (layer {layer}) imports {dep} (layer {dep_layer}): runs back up"
    if dep_layer == layer and dep_entry != entry and entry in INDEPENDENT:
        return f"{module} imports {dep}: services are independent (hand over a callable instead)"
    return None


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    return {mod: {d for d in _imports(path, modules) if d != mod} for mod, path in modules.items()}


def _violations() -> list[str]:
    bad = []
    for mod, deps in _graph().items():
        bad.extend(p for p in (_edge_problem(mod, dep) for dep in sorted(deps)) if p is not None)
    return bad


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles: Tarjan's strongly connected components of more than one module (a module never
    imports itself here). A package's __init__ that its own submodule imports counts, as it does at run time."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _oversized(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        with path.open(encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > limit:
            out.append(f"{path.relative_to(root.parent)}: {lines} lines (at most {limit})")
    return out


def test_imports_only_run_down() -> None:
    bad = _violations()
    assert not bad, "layer contract broken:\n  " + "\n  ".join(bad)


def test_every_module_has_a_layer() -> None:
    missing = []
    for mod in _modules():
        try:
            _owner(mod)
        except AssertionError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


def test_no_module_over_the_size_limit() -> None:
    big = _oversized()
    assert not big, "modules over the size limit (split them by job):\n  " + "\n  ".join(big)


# -- the checker itself can fail: known-bad cases are reported, known-good ones are not ----------------------

@pytest.mark.parametrize("module,dep,ok", [
    ("agent.readers.ethtool", "agent.readers.errors", True),
    ("agent.writers.spool", "agent.readers.errors", True),              # writers sit at the readers' layer
    ("agent.writers.s3queue", "agent.aws", True),                       # the client factory is below both
    ("agent.aws", "agent.readers.errors", False),
    ("agent.config", "agent.config_checks", True),
    ("agent.iperf3.client", "agent", True),                             # __version__
    ("agent.readers.ethtool", "agent.sampling", False),
    ("agent.readers.imds", "agent.exporters.status", False),            # a reader imports an exporter
    ("agent.writers.statefile", "agent.exporters.prometheus", False),
    ("agent.models.counters", "agent.readers.netdev", True),
    ("agent.models.figures", "agent.exporters.prometheus", False),      # the figure table is a model
    ("agent.config", "agent.readers.errors", False),
    ("agent.probes.service", "agent.exporters.probes", False),
    ("agent.probes.service", "agent.responder.server", False),
    ("agent.exporters.probes", "agent.probes.service", True),
])
def test_the_contract_catches_what_it_should(module: str, dep: str, ok: bool) -> None:
    assert (_edge_problem(module, dep) is None) is ok


@pytest.mark.parametrize("module", ["agent.newthing", "agent.utils", "agent.helpers.misc", "agentx", "other"])
def test_a_module_in_no_layer_fails(module: str) -> None:
    # The root package names only itself: "agent" must not hold a new top-level module.
    with pytest.raises(AssertionError, match="is in no layer"):
        _owner(module)


def test_a_new_file_in_no_layer_fails_the_scan(tmp_path: Path) -> None:
    pkg = tmp_path / "agent"
    (pkg / "readers").mkdir(parents=True)
    for name in ("__init__.py", "config.py", "readers/__init__.py", "readers/netdev.py", "stray.py"):
        (pkg / name).write_text('"""x"""\n', encoding="utf-8")
    with pytest.raises(AssertionError, match="agent.stray is in no layer"):
        for mod in _modules(pkg):
            _owner(mod)


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_resolve_submodules(tmp_path: Path) -> None:
    pkg = tmp_path / "agent"
    (pkg / "readers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "readers" / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "readers" / "aws.py").write_text("", encoding="utf-8")
    user = pkg / "user.py"
    user.write_text("from agent.readers import aws, CONSTANT\nfrom agent import __version__\n"
                    "def late():\n    import agent.readers.aws\n", encoding="utf-8")
    assert _imports(user, _modules(pkg)) == {"agent.readers.aws", "agent.readers", "agent"}


def test_the_size_check_finds_a_long_module(tmp_path: Path) -> None:
    pkg = tmp_path / "agent"
    pkg.mkdir()
    (pkg / "short.py").write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    (pkg / "long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    assert _oversized(pkg) == [f"agent/long.py: {MAX_LINES + 1} lines (at most {MAX_LINES})"]
