"""The project's image, built once per session for the image tier (test_image.py) and the cluster tier
(test_cluster.py): from packaging/container/Containerfile on the .deb, as a user builds it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

from tests.conftest import ROOT, require_root_tools
from tests.packaging.debroot import build, copy_tree
from tests.support.podman import build_image, ensure_base_image, podman, require_podman

CONTAINERFILE = ROOT / "packaging" / "container" / "Containerfile"
# The Containerfile names the real registry's image; here the debootstrap base stands in for it.
FROM_NAME = "docker.io/library/debian:12-slim"


class Image(NamedTuple):
    tag: str
    deb: Path


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    require_podman()
    require_root_tools("dpkg-buildpackage", "dh", "fakeroot", "dpkg-deb")
    base = ensure_base_image()
    tag = f"localhost/burstwatch-k8s-test:{os.getpid()}"
    work = tmp_path_factory.mktemp("image")
    deb = build("deb", copy_tree(work / "tree"), work / "out")
    context = work / "context"
    context.mkdir()
    shutil.copy(deb, context / deb.name)
    podman("tag", base, FROM_NAME)
    try:
        # layers=False: no cached image of the build stage is left behind (podman keeps one otherwise).
        build_image(CONTAINERFILE, context, tag, layers=False)
        yield Image(tag, deb)
    finally:
        podman("rmi", "-f", tag, check=False)
        # Only the stand-in name: `podman untag IMAGE` alone would strip every name of the shared base.
        podman("untag", FROM_NAME, FROM_NAME, check=False)
