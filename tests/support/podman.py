"""podman for the container tests: one config, one cached Debian 12 base image, and image builds."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import pytest

CONTAINERS_CONF = Path(__file__).resolve().parent / "containers.conf"
BASE_IMAGE = "localhost/debian:12-slim"
# Two pytest sessions (this tier and the Kubernetes tests) may both need the base image at once.
_LOCK = Path("/var/tmp/burstwatch-podman.lock")
_APT_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))
_FALLBACK_MIRROR = "http://deb.debian.org/debian"


def podman(*args: str, check: bool = True, timeout: float = 600,
           input: Optional[bytes] = None) -> subprocess.CompletedProcess:
    """Run `podman ARGS` with our containers.conf; output captured as bytes. check=True raises
    with podman's stderr in the message, so a failed test says why."""
    env = dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))
    proc = subprocess.run(["podman", *args], env=env, input=input, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: "
                             f"{proc.stderr.decode(errors='replace')[-2000:]}")
    return proc


def require_podman() -> None:
    """Skip only where containers cannot run at all (not root, or podman not installed);
    `make test` installs podman, runc, catatonit and debootstrap, so CI never skips."""
    if os.geteuid() != 0:
        pytest.skip("needs root for privileged podman containers (CI runs as root)")
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: `make test-deps` installs it")


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 `URIs:` or one-line `deb URI bookworm`):
    the only package source reachable here."""
    files: list[Path] = []
    for src in _APT_SOURCES:
        if src.is_dir():
            files += sorted(p for p in src.iterdir() if p.suffix in (".sources", ".list"))
        elif src.is_file():
            files.append(src)
    for f in files:
        text = f.read_text(errors="replace")
        for m in re.finditer(r"^URIs:\s*(\S+)\s*\nSuites:[^\n]*\bbookworm\b", text, re.M):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
        for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s", text, re.M):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
    return _FALLBACK_MIRROR


def ensure_base_image() -> str:
    """BASE_IMAGE, built once per machine with debootstrap (about 35 s) when podman lacks it;
    no registry image can be pulled here."""
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    if shutil.which("debootstrap") is None:
        pytest.fail("debootstrap missing: `make test-deps` installs it")
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Another session may have built it while we waited for the lock.
        if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
            return BASE_IMAGE
        rootfs = Path(tempfile.mkdtemp(prefix="burstwatch-rootfs-", dir="/var/tmp"))
        try:
            subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), debian_mirror()],
                           check=True, capture_output=True, timeout=900)
            tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], check=True,
                                 capture_output=True, timeout=300)
            podman("import", "-", BASE_IMAGE, input=tar.stdout)
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)
    return BASE_IMAGE


def build_image(containerfile: Path, context: Path, tag: str, layers: bool = True) -> None:
    """`podman build` with host networking, so RUN apt-get reaches this machine's Debian mirror.
    The caller removes `tag` when done (`podman("rmi", "-f", tag)`). layers=False keeps no cached
    image of intermediate steps or build stages (a multi-stage build otherwise leaves one behind)."""
    podman("build", f"--layers={str(layers).lower()}", "--network", "host", "-f", str(containerfile),
           "-t", tag, str(context), timeout=1200)
