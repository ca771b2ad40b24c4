"""The project's container image, built as a user builds it (packaging/container/Containerfile on the .deb),
once per test session for every tier that runs it: the image checks and the cluster (tests/kubernetes) and
the ECS task (tests/packaging/test_ecs_task.py). The fixture is `image` in tests/conftest.py."""

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


def built_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    require_podman()
    require_root_tools("dpkg-buildpackage", "dh", "fakeroot", "dpkg-deb")
    base = ensure_base_image()
    tag = f"localhost/burstwatch-test:{os.getpid()}"
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
