"""Fixtures for the packaging tests: the .deb built twice (this version and a bumped one)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import require_root_tools
from tests.packaging.debroot import build, bumped, copy_tree, read_version


class Debs(NamedTuple):
    v1: Path
    v2: Path
    version1: str
    version2: str


@pytest.fixture(scope="session")
def debs(tmp_path_factory: pytest.TempPathFactory) -> Debs:
    """v1 from a copy of this tree; v2 the same tree with a bumped __version__, as a release would be."""
    require_root_tools("dpkg-buildpackage", "dh", "fakeroot")
    version1 = read_version()
    version2 = bumped(version1)
    base = tmp_path_factory.mktemp("debs")
    v1 = copy_tree(base / "tree1")
    v2 = copy_tree(base / "tree2", version2)
    return Debs(build("deb", v1, base / "out1"), build("deb", v2, base / "out2"), version1, version2)


@pytest.fixture(scope="session")
def ubuntu2204_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Ubuntu 22.04 flavour (pyroute2 and prometheus_client bundled)."""
    require_root_tools("dpkg-buildpackage", "dh", "fakeroot")
    base = tmp_path_factory.mktemp("deb-ubuntu2204")
    return build("deb-ubuntu22.04", copy_tree(base / "tree"), base / "out")
