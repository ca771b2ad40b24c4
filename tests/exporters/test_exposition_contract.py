"""The exposition contract: every family the daemon can expose keeps its name, type, help text and label
names, and the same readings render to the same bytes. BURSTWATCH_UPDATE_GOLDEN=1 rewrites the golden file
(as node_exporter's end-to-end-test.sh -u); review its diff like code."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from tests.exporters import exposition

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "metrics" / "exposition_contract.txt"
SEPARATOR = "# ---- text exposition of the fixture readings ----"


def current() -> str:
    contract = exposition.contract(exposition.registry(process=True))
    # The Python version in burstwatch_build_info is the machine's, not the contract's.
    text = exposition.exposition().decode().replace(f'python="{platform.python_version()}"', 'python="X.Y.Z"')
    return "\n".join([*contract, SEPARATOR, text])


def test_exposition_matches_the_golden_file() -> None:
    got = current()
    if os.environ.get("BURSTWATCH_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(got)
    want = GOLDEN.read_text()
    want_contract, _, want_text = want.partition(SEPARATOR)
    got_contract, _, got_text = got.partition(SEPARATOR)
    assert got_contract.splitlines() == want_contract.splitlines(), "families, types, help or labels changed"
    assert got_text == want_text, "the same readings render to different bytes"


def test_the_golden_file_covers_every_declared_family() -> None:
    """The fixture readings fill every family a view declares, so the golden file holds them all."""
    families = {line.split()[0] for line in GOLDEN.read_text().partition(SEPARATOR)[0].splitlines()}
    declared = {m.name for v in exposition.views() for m in v.describe()}
    assert declared <= families, declared - families
