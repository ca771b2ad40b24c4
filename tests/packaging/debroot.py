"""Package builds and a throwaway Debian 12 root (debootstrap chroot) to install them in, never touching /usr."""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("BURSTWATCH_CACHE", ROOT / ".cache" / "packaging"))
SUITE = "bookworm"
# The .deb's Depends (packaging/debian/control) plus what pulls them in: downloaded once into the
# cached root's apt archive, so every test run installs them for real but without the network.
DEPENDENCIES = ["python3", "python3-pyroute2", "python3-prometheus-client", "python3-boto3",
                "python3-systemd", "python3-bcrypt", "systemd", "procps"]
# What the Debian installer writes and debootstrap does not: without it, lookups of local names
# (wsgiref's getfqdn("0.0.0.0") at bind time) go to DNS and stall start-up for the resolver timeout.
ETC_HOSTS = "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n"
POLICY_RC_D = "#!/bin/sh\n# burstwatch tests: no service may start inside this chroot (policy-rc.d(8)).\nexit 101\n"


def sh(*cmd: str, check: bool = True, timeout: float = 300.0, env: Optional[dict[str, str]] = None,
       cwd: Optional[Path] = None, input: Optional[str] = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


# -- building -------------------------------------------------------------------------------------

def read_version(tree: Path = ROOT) -> str:
    text = (tree / "agent" / "__init__.py").read_text(encoding="utf-8")
    m = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
    assert m, "no __version__ in agent/__init__.py"
    return m.group(1)


def bumped(version: str) -> str:
    """0.1.0 -> 0.1.1: a strictly newer version for the upgrade test."""
    parts = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    assert parts, version
    major, minor, patch = (int(p) for p in parts.groups())
    return f"{major}.{minor}.{patch + 1}"


def copy_tree(dst: Path, version: Optional[str] = None) -> Path:
    """What packaging/build.sh needs from a clean clone, optionally with another __version__."""
    for name in ("agent", "packaging", "systemd", "docs"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if version is not None:
        init = dst / "agent" / "__init__.py"
        text = re.sub(r'^__version__\s*=\s*"[^"]+"', f'__version__ = "{version}"',
                      init.read_text(encoding="utf-8"), flags=re.M)
        init.write_text(text, encoding="utf-8")
    return dst


def build(kind: str, tree: Path, out: Path) -> Path:
    """Run packaging/build.sh KIND in `tree` with its output in `out`; returns the package file."""
    env = dict(os.environ, DIST=str(out / "dist"), BUILD_DIR=str(out / "build"), BURSTWATCH_CACHE=str(CACHE))
    sh("bash", str(tree / "packaging" / "build.sh"), kind, env=env, timeout=600)
    pattern = "burstwatch-*.noarch.rpm" if kind == "rpm" else "burstwatch_*_all.deb"
    (pkg,) = (out / "dist").glob(pattern)
    return pkg


# -- the Debian root ------------------------------------------------------------------------------

def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources), else deb.debian.org."""
    if os.environ.get("BURSTWATCH_DEBIAN_MIRROR"):
        return os.environ["BURSTWATCH_DEBIAN_MIRROR"]
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for src in sources:
        try:
            text = src.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for m in re.finditer(r"(https?://\S+/debian)/?(?:\s|$)", text):
            if "security" not in m.group(1):
                return m.group(1)
    return "http://deb.debian.org/debian"


def base_tarball() -> Path:
    """A Debian 12 minbase root with apt lists and the dependencies' .debs cached, built once with
    debootstrap (~30 s) and kept in .cache/packaging (set BURSTWATCH_REFRESH_ROOT=1 to rebuild)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    ignore = CACHE.parent / ".gitignore"
    if not ignore.exists():  # the cache never gets committed, whatever the top-level .gitignore says
        ignore.write_text("*\n", encoding="utf-8")
    # The dependency list is in the name: a changed list builds a new root instead of reusing a stale one.
    deps = hashlib.sha256(" ".join(DEPENDENCIES).encode()).hexdigest()[:8]
    tarball = CACHE / f"debian-{SUITE}-minbase-{deps}.tar"
    with open(CACHE / ".root.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists() and not os.environ.get("BURSTWATCH_REFRESH_ROOT"):
            return tarball
        work = CACHE / "root.tmp"
        if work.exists():
            remove_root(work)
        mirror = debian_mirror()
        sh("debootstrap", "--variant=minbase", SUITE, str(work), mirror, timeout=900)
        shutil.copy("/etc/resolv.conf", work / "etc" / "resolv.conf")
        (work / "etc" / "hosts").write_text(ETC_HOSTS, encoding="utf-8")
        policy = work / "usr" / "sbin" / "policy-rc.d"
        policy.write_text(POLICY_RC_D, encoding="utf-8")
        policy.chmod(0o755)
        root = DebianRoot(work)
        root.run("apt-get", "-q", "update", timeout=600)
        root.run("apt-get", "-q", "install", "-y", "--download-only", *DEPENDENCIES, timeout=900)
        sh("tar", "-C", str(work), "-cf", str(tarball) + ".part", ".", timeout=600)
        os.replace(str(tarball) + ".part", tarball)
        remove_root(work)
        return tarball


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if (p + "/").startswith(prefix)]


def remove_root(path: Path) -> None:
    """rm -rf a chroot, but never through a mount (a leaked /proc or /sys bind would be the host's)."""
    leaked = mounts_under(path)
    if leaked:
        raise RuntimeError(f"refusing to delete {path}: still mounted: {leaked}")
    sh("rm", "-rf", "--one-file-system", str(path), timeout=300)


class DebianRoot:
    """A Debian root to run commands in with chroot(8). Every command gets its own private mount
    namespace (`unshare --mount`, or `ip netns exec`, which makes one) holding /proc and /sys for
    the chroot, so nothing is mounted in the host's namespace and nothing is left behind."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def fresh(cls, dest: Path) -> DebianRoot:
        tarball = base_tarball()
        dest.mkdir(parents=True)
        sh("tar", "-C", str(dest), "-xpf", str(tarball), timeout=300)
        hosts = dest / "etc" / "hosts"
        if not hosts.exists():
            hosts.write_text(ETC_HOSTS, encoding="utf-8")
        return cls(dest)

    def wrap(self, argv: list[str], netns: Optional[str] = None, sys_: bool = False) -> list[str]:
        """argv (run inside the root) wrapped in a private mount namespace with /proc (and /sys)."""
        r = shlex.quote(str(self.path))
        script = f"mount -t proc proc {r}/proc"
        if sys_:
            script += f" && mount --rbind /sys {r}/sys"
        script += f' && exec chroot {r} "$@"'
        outer = ["ip", "netns", "exec", netns] if netns else ["unshare", "--mount", "--propagation", "private"]
        return [*outer, "sh", "-c", script, "chroot", *argv]

    def run(self, *argv: str, check: bool = True, timeout: float = 300.0, netns: Optional[str] = None,
            sys_: bool = False) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive",
               "HOME": "/root"}
        return sh(*self.wrap(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv], netns, sys_),
                  check=check, timeout=timeout)

    def apt(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("apt-get", "-q", "-o", "Dpkg::Use-Pty=0", *args, check=check, timeout=600)

    def install_deb(self, deb: Path) -> subprocess.CompletedProcess:
        target = self.path / "tmp" / deb.name
        shutil.copy(deb, target)
        try:
            return self.apt("install", "-y", f"/tmp/{deb.name}")
        finally:
            target.unlink()

    def file(self, path: str) -> Path:
        return self.path / path.lstrip("/")

    def ids(self, user: str) -> tuple[int, int]:
        for line in self.file("/etc/passwd").read_text(encoding="utf-8").splitlines():
            fields = line.split(":")
            if fields[0] == user:
                return int(fields[2]), int(fields[3])
        raise KeyError(f"no user {user} in {self.path}/etc/passwd")

    def close(self) -> None:
        remove_root(self.path)


def unit_value(unit_text: str, key: str) -> str:
    """The last assignment of `key` in a unit file (later lines override earlier ones)."""
    values = [line.split("=", 1)[1].strip() for line in unit_text.splitlines()
              if line.strip().startswith(f"{key}=")]
    assert values, f"no {key}= in the unit"
    return values[-1]


def exec_argv(unit_text: str, key: str = "ExecStart") -> list[str]:
    """A unit's Exec*= command line as argv: systemd's prefixes (-@:+!) stripped, words split the way
    systemd.service(5) quotes them (close enough to shell quoting for our lines)."""
    line = unit_value(unit_text, key).lstrip("-@:+!")
    return shlex.split(line)


def seconds(value: str) -> float:
    """systemd time span ("30s", "1min 30s", "500ms", "10") in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    for num, unit in re.findall(r"([\d.]+)\s*([a-z]*)", value):
        total += float(num) * units.get(unit or "s", 1)
    return total


def kernel_has_mdwe() -> bool:
    """PR_SET_MDWE (the kernel's MemoryDenyWriteExecute) exists from Linux 6.3."""
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (6, 3)


def wait_until(pred, timeout: float, interval: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())
