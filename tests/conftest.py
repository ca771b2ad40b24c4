"""Shared fixtures: a guard that keeps tests off the real IMDS and AWS, and moto in server mode."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
MOTO_SERVER = ROOT / ".venv-moto" / "bin" / "moto_server"
BURSTWATCH = [sys.executable, "-m", "agent"]

_real_connect = socket.socket.connect
_real_create_connection = socket.create_connection
BLOCKED_HOSTS = ("169.254.169.254", "fd00:ec2::254")


def _blocked(address: object) -> bool:
    host = address[0] if isinstance(address, tuple) else None
    return isinstance(host, str) and (host in BLOCKED_HOSTS or host.endswith("amazonaws.com"))


@pytest.fixture(autouse=True)
def _no_real_cloud(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Block the real IMDS and AWS endpoints in-process (cloud-init's disable_subp_usage idea);
    a test that really means it marks itself `real_cloud`. AWS credentials are fake everywhere."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    if request.node.get_closest_marker("real_cloud"):
        return

    def guarded_connect(self: socket.socket, address: object) -> None:
        if _blocked(address):
            raise ConnectionRefusedError(f"test guard: no connections to {address!r}")
        return _real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_cloud: allowed to reach the real IMDS/AWS (never in CI)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def refused(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on `port` (a connection is refused), False when something accepts."""
    try:
        with _real_create_connection((host, port), timeout=1.0):
            return False
    except ConnectionRefusedError:
        return True


def wait_port(host: str, port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with _real_create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{host}:{port} did not open within {timeout}s")


def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll `cond` until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(interval)


def scrape_metrics(port: int) -> dict[str, float]:
    """A daemon's /metrics on loopback as {series: value}."""
    from tests.support.credit_lab import parse_metrics

    return parse_metrics(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())


@contextlib.contextmanager
def moto_process(*command: str) -> Iterator[str]:
    """A moto server process (`command` gets -H and -p added) on a free loopback port; its endpoint URL."""
    if not MOTO_SERVER.exists():
        pytest.fail(f"{MOTO_SERVER} missing: run `make test-deps` (make test installs it)")
    port = free_port()
    proc = subprocess.Popen([*command, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port("127.0.0.1", port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(5)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto in server mode over HTTP (a separate process and venv); yields its endpoint URL."""
    with moto_process(str(MOTO_SERVER)) as url:
        yield url


@pytest.fixture()
def moto(moto_server: str) -> str:
    """A clean moto state for each test (POST /moto-api/reset)."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST"), timeout=5)
    return moto_server


@pytest.fixture()
def proxy(moto: str) -> Iterator[Any]:
    """A ThrottleProxy in front of this test's moto: it can throttle, fail or hold requests on demand."""
    from tests.support.throttle_proxy import ThrottleProxy

    p = ThrottleProxy(moto)
    try:
        yield p
    finally:
        p.close()


def require_root_tools(*tools: str) -> None:
    """Fail loudly (not skip) when the lab cannot run: make test installs these, so CI must have them."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces (CI runs as root)")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing tools {missing}: `make test-deps` installs them")


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The project's container image, built once per session (tests/support/project_image.py)."""
    from tests.support.project_image import built_image

    yield from built_image(tmp_path_factory)
