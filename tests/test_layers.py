"""The layer contract (docs/architecture.md): imports only run down, and services do not import each other.

An import-linter "layers" + "independence" contract, written as a test so it needs nothing beyond
the standard library's ast and runs in `make lint` and in every pytest run. Imports inside
functions count too: a late import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "agent"

# Bottom to top. A module may import from its own layer's package and from any layer below it.
LAYERS: list[tuple[str, ...]] = [
    ("agent", "agent.config", "agent.isolate", "agent.notify"),          # foundation
    ("agent.readers", "agent.writers"),         # OS, IMDS, AWS: read and parse; state files, spools, uploads
    ("agent.models",),                                                   # pure: figures in, figures out
    ("agent.sampling", "agent.discovery", "agent.iperf3"),               # sampling steps, discovery, protocol
    ("agent.credits", "agent.checks", "agent.probes", "agent.responder", "agent.cloudwatch", "agent.fleet"),  # services
    ("agent.exporters",),                                                # Prometheus views, status rendering
    ("agent.wiring", "agent.daemon", "agent.commands", "agent.cli", "agent.__main__"),         # entry points
]
# Services run side by side and meet only through callables the wiring hands them.
INDEPENDENT = LAYERS[4]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _owner(module: str) -> tuple[int, str]:
    """(layer index, the layer entry the module belongs to): the longest entry that prefixes it."""
    best: tuple[int, str] = (-1, "")
    for i, layer in enumerate(LAYERS):
        for entry in layer:
            if (module == entry or module.startswith(entry + ".")) and len(entry) >= len(best[1]):
                best = (i, entry)
    if best[0] < 0:
        raise AssertionError(f"module {module} is in no layer: add it to LAYERS in tests/test_layers.py")
    return best


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "agent":
                out.update(f"agent.{a.name}" for a in node.names)   # from agent import config
            elif node.module.startswith("agent."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name == "agent" or a.name.startswith("agent."))
    return out


def _violations() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = _module_name(path)
        layer, entry = _owner(mod)
        for dep in sorted(_imports(path)):
            if dep == "agent.__version__":
                continue
            dep_layer, dep_entry = _owner(dep)
            if dep_layer > layer:
                bad.append(f"{mod} (layer {layer}) imports {dep} (layer {dep_layer}): runs back up")
            elif dep_layer == layer and dep_entry != entry and entry in INDEPENDENT:
                bad.append(f"{mod} imports {dep}: services are independent (hand over a callable instead)")
    return bad


def test_imports_only_run_down() -> None:
    bad = _violations()
    assert not bad, "layer contract broken:\n  " + "\n  ".join(bad)


def test_every_module_has_a_layer() -> None:
    for path in ROOT.rglob("*.py"):
        _owner(_module_name(path))


@pytest.mark.parametrize("module,dep,ok", [
    ("agent.readers.ethtool", "agent.readers.errors", True),
    ("agent.readers.ethtool", "agent.sampling", False),
    ("agent.probes.service", "agent.exporters.probes", False),
    ("agent.probes.service", "agent.responder.server", False),
    ("agent.exporters.probes", "agent.probes.service", True),
])
def test_the_contract_catches_what_it_should(module: str, dep: str, ok: bool) -> None:
    # The checker itself can fail: a known-bad edge is reported, a known-good one is not.
    layer, entry = _owner(module)
    dep_layer, dep_entry = _owner(dep)
    broken = dep_layer > layer or (dep_layer == layer and dep_entry != entry and entry in INDEPENDENT)
    assert broken is not ok
