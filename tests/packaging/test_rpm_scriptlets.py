"""The .rpm's scriptlets, run for real in the order rpm runs them for install, upgrade and erase, in a
throwaway root set up like Amazon Linux 2023 where it matters (a `disable *` preset, systemd not running)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import require_root_tools
from tests.packaging.debroot import DebianRoot, build, copy_tree, sh

pytestmark = pytest.mark.slow

UNIT = "/usr/lib/systemd/system/burstwatch.service"
ENABLE_LINK = "/etc/systemd/system/multi-user.target.wants/burstwatch.service"
# AL2023's 99-default-disable.preset: every unit no other preset names stays disabled.
DEFAULT_DISABLE = "disable *\n"


@pytest.fixture(scope="module")
def rpm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_root_tools("rpmbuild", "rpm", "rpm2cpio", "cpio")
    base = tmp_path_factory.mktemp("rpm-scriptlets")
    return build("rpm", copy_tree(base / "tree"), base / "out")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebianRoot]:
    require_root_tools("debootstrap", "unshare", "chroot", "tar")
    r = DebianRoot.fresh(tmp_path_factory.mktemp("rpmroot") / "root")
    try:
        # What the scriptlets call: sh, getent/groupadd/useradd, python3, systemctl (no rpm database:
        # the payload is unpacked with rpm2cpio, the scriptlets run with rpm's arguments).
        r.apt("install", "-y", "--no-install-recommends", "python3", "systemd")
        preset = r.file("/usr/lib/systemd/system-preset/99-default-disable.preset")
        preset.write_text(DEFAULT_DISABLE, encoding="utf-8")
        yield r
    finally:
        r.close()


def scriptlet(rpm: Path, tag: str) -> str:
    return sh("rpm", "-qp", "--qf", f"%{{{tag}}}", str(rpm)).stdout


def run(root: DebianRoot, rpm: Path, tag: str, arg: int) -> None:
    """One scriptlet with rpm's $1 (instances of the package left after the transaction)."""
    script = scriptlet(rpm, tag)
    assert script and script != "(none)", tag
    root.run("sh", "-e", "-c", script, tag.lower(), str(arg))


def unpack(root: DebianRoot, rpm: Path) -> None:
    sh("sh", "-c", f"rpm2cpio {rpm} | cpio -idmu --quiet", cwd=root.path)


def test_install_upgrade_erase(root: DebianRoot, rpm: Path) -> None:
    # -- install: %pre 1, files, %post 1
    run(root, rpm, "PREIN", 1)
    uid, gid = root.ids("burstwatch")
    assert 0 < uid < 1000 and 0 < gid < 1000
    unpack(root, rpm)
    run(root, rpm, "POSTIN", 1)
    link = root.file(ENABLE_LINK)
    # (Debian's /lib is /usr/lib; systemctl names the unit by the path it found first.)
    assert link.is_symlink() and os.readlink(link) in (UNIT, UNIT[4:]), "the preset enables it"
    # ... and it is our preset that does: a unit without one stays disabled here, as on AL2023.
    control = root.file("/usr/lib/systemd/system/bwcontrol.service")
    control.write_text("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n", encoding="utf-8")
    root.run("systemctl", "--no-reload", "preset", "bwcontrol.service")
    assert not root.file("/etc/systemd/system/multi-user.target.wants/bwcontrol.service").exists()
    assert list(root.file("/usr/lib/burstwatch/agent/__pycache__").glob("cli.cpython-3*.pyc"))
    assert list(root.file("/usr/lib/burstwatch/vendor/prometheus_client/__pycache__").glob("*.pyc"))
    out = root.run("burstwatch", "check-config")
    assert "/etc/burstwatch/burstwatch.toml: ok" in out.stdout  # with the bundled tomli/prometheus_client
    state = root.file("/var/lib/burstwatch")
    state.mkdir()
    (state / "credits.json").write_text("{}", encoding="utf-8")

    # -- upgrade: new %pre 2, new files, new %post 2, old %preun 1, old %postun 1
    run(root, rpm, "PREIN", 2)
    unpack(root, rpm)
    run(root, rpm, "POSTIN", 2)
    run(root, rpm, "PREUN", 1)
    run(root, rpm, "POSTUN", 1)
    assert root.ids("burstwatch") == (uid, gid)
    assert link.is_symlink()
    assert root.file("/usr/bin/burstwatch").exists() and root.file("/usr/lib/burstwatch/agent/cli.py").exists()

    # -- erase: %preun 0, files removed, %postun 0
    run(root, rpm, "PREUN", 0)
    assert not link.is_symlink(), "erase disables the unit"
    files = sh("rpm", "-qlp", str(rpm)).stdout.split()
    for f in sorted(files, reverse=True):  # what rpm does with the file list: files, then empty dirs
        p = root.file(f)
        if p.is_file() or p.is_symlink():
            p.unlink()
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()
    run(root, rpm, "POSTUN", 0)
    assert not root.file("/usr/lib/burstwatch").exists(), "byte-code left by %post is cleaned up"
    assert (state / "credits.json").exists(), "rpm has no purge: the state stays"
