"""Fixtures for the real-systemd tier: a privileged podman container booting systemd as PID 1, in a
network namespace this tier makes, with the .deb built once and a peer namespace (moto, iperf3)."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

from tests.conftest import MOTO_SERVER, wait_until
from tests.packaging.conftest import Debs, debs  # noqa: F401  (the session fixture, built once here)
from tests.support.lab import Lab
from tests.support.podman import build_image, ensure_base_image, podman, require_podman

HERE = Path(__file__).resolve().parent
# The tier's fixed addresses live only inside the namespaces it makes; the ports are the ones this
# tier owns on the machine (the Kubernetes tests use 29786/25201), so no other test can clash.
SERVICE_IP, PEER_IP = "10.77.0.1", "10.77.0.2"
METRICS_PORT, RESPONDER_PORT, IPERF3_PORT, MOTO_PORT = 19786, 15201, 15202, 15500


class Net(NamedTuple):
    lab: Lab
    service: str      # the container's network namespace: eth0 = SERVICE_IP, default route via the peer
    peer: str         # PEER_IP: moto, a stock iperf3 server and client; 169.254.169.254 refuses at once
    moto: str         # moto's endpoint URL, reachable from the service namespace


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tier's image (Containerfile here), tagged per run and removed afterwards; the base stays cached."""
    require_podman()
    ensure_base_image()
    tag = f"localhost/burstwatch-systemd-tier:{uuid.uuid4().hex[:8]}"
    try:
        build_image(HERE / "Containerfile", HERE, tag)
        yield tag
    finally:
        podman("rmi", "-f", tag, check=False)


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    """Two namespaces joined by a veth; the service side is what the container sees as its host."""
    if not MOTO_SERVER.exists():
        pytest.fail(f"{MOTO_SERVER} missing: run `make test-deps` (make test installs it)")
    with Lab() as lab:
        service, peer = lab.host("sd"), lab.host("peer")
        lab.link(service, peer, f"{SERVICE_IP}/24", f"{PEER_IP}/24", names=("eth0", "eth0"))
        lab.run(service, "ip", "route", "add", "default", "via", PEER_IP)
        # What systemd's /usr/lib/sysctl.d/50-default.conf sets on a real Debian 12 host (the kernel
        # default, "1 0", is what this machine's root namespace has): unprivileged ICMP echo sockets for
        # every group, which the path MTU check uses as the service user.
        lab.run(service, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")
        # Off EC2 with the stock config, IMDS must fail fast (a refused connection), not time out.
        lab.run(peer, "ip", "addr", "add", "169.254.169.254/32", "dev", "lo")
        lab.popen(peer, str(MOTO_SERVER), "-H", PEER_IP, "-p", str(MOTO_PORT),
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lab.popen(peer, "iperf3", "-s", "-p", str(IPERF3_PORT), stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
        moto = f"http://{PEER_IP}:{MOTO_PORT}"
        wait_until(lambda: _answers(lab, service, moto), 30, "moto in the peer namespace")
        yield Net(lab, service, peer, moto)


def _answers(lab: Lab, ns: str, url: str) -> bool:
    try:
        lab.http_get(ns, url + "/moto-api/", timeout=1.0)
        return True
    except OSError:
        return False


class Box:
    """The running container: systemd is PID 1; commands run with `podman exec`."""

    def __init__(self, name: str, net: Net) -> None:
        self.name = name
        self.net = net

    def sh(self, *cmd: str, check: bool = True, timeout: float = 120, user: str = "") -> str:
        """Run cmd in the container (as `user` if given, through runuser); stdout, or AssertionError with stderr."""
        argv = ["runuser", "-u", user, "--", *cmd] if user else list(cmd)
        proc = podman("exec", self.name, *argv, check=False, timeout=timeout)
        out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}\n--- stdout\n{out[-3000:]}"
                                 f"\n--- stderr\n{err[-3000:]}")
        return out

    def run(self, *cmd: str, user: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
        argv = ["runuser", "-u", user, "--", *cmd] if user else list(cmd)
        return podman("exec", self.name, *argv, check=False, timeout=timeout)

    def show(self, *props: str) -> dict[str, str]:
        out = self.sh("systemctl", "show", "burstwatch", *(f"-p{p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self) -> str:
        """Everything the unit and systemd said about it since the container booted."""
        return self.sh("journalctl", "--no-pager", "-o", "short-monotonic", "-u", "burstwatch.service")

    def metrics(self) -> dict[str, float]:
        from tests.support.credit_lab import parse_metrics

        return parse_metrics(self.net.lab.http_get(self.net.service, f"http://127.0.0.1:{METRICS_PORT}/metrics"))

    def wait_active(self, timeout: float = 60) -> dict[str, str]:
        wait_until(lambda: self.show("ActiveState")["ActiveState"] in ("active", "failed"), timeout,
                   "burstwatch active")
        st = self.show("ActiveState", "SubState", "MainPID", "StatusText", "Result", "NRestarts")
        assert st["ActiveState"] == "active", st
        return st


@contextlib.contextmanager
def booted(image: str, net: Net, packages: Path) -> Iterator[Box]:
    """A privileged container booting systemd, its network the service namespace, `packages` at /debs;
    removed afterwards, even when a test failed."""
    name = f"burstwatch-tier-{uuid.uuid4().hex[:8]}"
    try:
        podman("run", "-d", "--name", name, "--privileged", "--systemd=always",
               "--network", f"ns:/run/netns/{net.service}", "-v", f"{packages}:/debs:ro", image, "/sbin/init")
        b = Box(name, net)
        # Until PID 1 has its bus socket, systemctl answers "Failed to connect to bus": ask again.
        booted: dict[str, str] = {}

        def up() -> bool:
            booted["state"] = b.run("systemctl", "is-system-running", "--wait", timeout=120).stdout.decode().strip()
            return booted["state"] in ("running", "degraded")

        wait_until(up, 60, "systemd booting in the container", interval=0.5)
        yield b
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


@pytest.fixture(scope="module")
def box(image: str, net: Net, debs: Debs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:  # noqa: F811
    """The tier's container with this tree's .deb (v1) and a bumped one (v2) under /debs."""
    debdir = tmp_path_factory.mktemp("tier-debs")
    shutil.copy(debs.v1, debdir / "burstwatch-v1.deb")
    shutil.copy(debs.v2, debdir / "burstwatch-v2.deb")
    with booted(image, net, debdir) as b:
        yield b


def journal_problems(text: str) -> list[str]:
    """Journal lines that would alarm an operator: tracebacks, permission denials (EPERM/EACCES,
    including what a seccomp or mount sandbox returns), and errors."""
    bad = re.compile(r"Traceback|Permission denied|Operation not permitted|EPERM|EACCES|[Dd]enied|"
                     r"\[Errno (1|13)\]|ERROR|CRITICAL|code=(killed|dumped)|status=(?!0/SUCCESS)\d+/")
    return [line for line in text.splitlines() if bad.search(line)]
