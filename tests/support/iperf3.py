"""For the iperf3, responder, probe and e2e tests and the bench: Debian's iperf3 as a peer, an in-process responder."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import pytest

from agent.config import ResponderConfig
from agent.responder.server import Responder
from agent.responder.session import Timeouts

# Short protocol timeouts so abuse tests take seconds, not minutes; the defaults are tested in unit tests.
FAST = Timeouts(cookie=0.8, params=0.8, streams=2.0, stream_cookie=0.8, end_grace=2.0, send_slack=0.5,
                results=2.0, done=1.0)


ROOT = Path(__file__).resolve().parents[2]
# A current iperf3 beside Debian's 3.12: esnet/iperf 3.21+, built on Debian 12 (the team's test tool in
# shared/tools, next to the project's clone, as CI has it); BURSTWATCH_IPERF3_NEW points elsewhere.
IPERF3_NEW = ROOT.parent / "shared" / "tools" / "iperf3-3.21" / "iperf3"


def iperf3_bin() -> str:
    path = shutil.which("iperf3")
    if path is None:
        pytest.fail("iperf3 is missing: `make test-deps` installs Debian's iperf3 (the interop peer)")
    return path


def _origin_shared() -> Optional[Path]:
    """shared/tools beside the checkout this clone was made from (`git clone . "$(mktemp -d)"`, as the
    README's CI check does, puts the clone where no shared/ is beside it)."""
    try:
        url = subprocess.run(["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not url or "://" in url or not Path(url).is_dir():
        return None
    return Path(url).resolve().parent / "shared" / "tools" / "iperf3-3.21" / "iperf3"


def iperf3_new_bin() -> str:
    """The current iperf3 (3.21+), to test against what fleets run beside Debian's 3.12."""
    env = os.environ.get("BURSTWATCH_IPERF3_NEW")
    candidates = [Path(env)] if env else [IPERF3_NEW, _origin_shared()]
    path = next((c for c in candidates if c is not None and os.access(c, os.X_OK)), candidates[0])
    if path is None or not os.access(path, os.X_OK):
        pytest.fail(f"a current iperf3 is missing at {path} (shared/tools/iperf3-3.21 beside the clone, or "
                    "set BURSTWATCH_IPERF3_NEW)")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int, netns: Optional[str] = None) -> bool:
    """Whether something listens on TCP `port`, read from /proc/net/tcp{,6} (no connection is made: an
    iperf3 server counts a probe connection as a failed test)."""
    files = ["/proc/net/tcp", "/proc/net/tcp6"]
    if netns:
        text = subprocess.run(["ip", "netns", "exec", netns, "cat", *files], capture_output=True,
                              text=True, check=False).stdout
    else:
        text = "".join(Path(f).read_text() for f in files if Path(f).exists())
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and fields[1].rsplit(":", 1)[-1] == f"{port:04X}":
            return True
    return False


def wait_listening(port: int, netns: Optional[str] = None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not listening(port, netns):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on port {port} after {timeout}s")
        time.sleep(0.05)


@contextlib.contextmanager
def iperf3_server(port: int, *extra: str, netns: Optional[str] = None, one_off: bool = False,
                  binary: Optional[str] = None) -> Iterator[subprocess.Popen]:
    """`iperf3 -s` (optionally `-1 --json`) on `port`; stdout goes to a temp file (`proc.output()`)."""
    cmd = [binary or iperf3_bin(), "-s", "-p", str(port), *(["-1"] if one_off else []), *extra]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    out = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_listening(port, netns)

        def output(timeout: float = 10.0) -> str:
            if one_off:
                proc.wait(timeout)
            out.seek(0)
            return out.read()

        proc.output = output  # type: ignore[attr-defined]
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        out.close()


def iperf3_client(host: str, port: int, *extra: str, netns: Optional[str] = None,
                  timeout: float = 60.0, binary: Optional[str] = None) -> subprocess.CompletedProcess:
    cmd = [binary or iperf3_bin(), "-c", host, "-p", str(port), *extra]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def iperf3_json(host: str, port: int, *extra: str, netns: Optional[str] = None,
                binary: Optional[str] = None) -> dict[str, Any]:
    proc = iperf3_client(host, port, "--json", *extra, netns=netns, binary=binary)
    doc = json.loads(proc.stdout)
    if proc.returncode != 0 or "error" in doc:
        raise AssertionError(f"iperf3 -c failed (rc {proc.returncode}): {doc.get('error')} {proc.stderr}")
    return doc


# Loopback moves tens of Gbit/s: the default hourly serving budgets (sized for EC2) would turn the
# abuse and interop tests into budget tests. Tests of the budget set their own.
UNLIMITED_BUDGET = {"hourly_budget_bytes": 2**50, "hourly_budget_per_source_bytes": 2**50}


@contextlib.contextmanager
def responder(allow: Sequence[str] = ("127.0.0.0/8",), timeouts: Timeouts = FAST, credits: Any = None,
              profile: Any = None, **caps: Any) -> Iterator[Responder]:
    """An in-process responder on a free loopback port; `caps` override ResponderConfig fields (the hourly
    budgets are unlimited unless given); `credits` and `profile` are the credit guard's sources."""
    cfg = ResponderConfig(listen=caps.pop("listen", "127.0.0.1:0"), **{**UNLIMITED_BUDGET, **caps})
    r = Responder(cfg, list(allow), timeouts=timeouts, credits=credits, profile=profile)
    r.start()
    assert r.stats.listening, "responder failed to bind"
    try:
        yield r
    finally:
        r.stop(5.0)


def wait_until(cond: Any, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.02)
