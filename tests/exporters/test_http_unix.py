"""The local Unix socket beside /metrics (issue 23): the same exposition with no TLS and no password, its file
mode the access control, and `burstwatch status` reading it from a daemon whose /metrics has TLS and basic auth."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import MetricsConfig
from agent.exporters.prometheus import BuildInfoView, MetricsServer, build_registry
from agent.readers.daemon_metrics import read_metrics_socket
from tests.conftest import ROOT, free_port
from tests.exporters.test_http_tls import PASSWORD, client_ctx, https_get, tls_cfg
from tests.support.daemon_config import daemon_config
from tests.support.tls import Pki, make_pki

NOBODY = 65534


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def users() -> dict[str, str]:
    bcrypt = pytest.importorskip("bcrypt", reason="python3-bcrypt is missing: `make deps` installs it")
    return {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}


@pytest.fixture
def rundir() -> Iterator[Path]:
    """A short directory under /tmp that other users can traverse (pytest's tmp_path is 0700, and a Unix
    socket path has 107 bytes at most): the socket's own directory is made inside it, as /run/burstwatch."""
    top = Path(tempfile.mkdtemp(prefix="bw-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def serve(cfg: MetricsConfig, path: Path) -> MetricsServer:
    server = MetricsServer("127.0.0.1", 0, build_registry([BuildInfoView()]), config=cfg, generation=lambda: None)
    assert server.httpd.listen_unix(str(path))
    server.start()
    return server


# The child runs as another user, who may not reach a venv inside a 0700 clone (CI clones into mktemp -d):
# the system interpreter is world-executable and the code needs only the standard library.
SYSTEM_PYTHON = "/usr/bin/python3"


def connect_as(path: Path, uid: int, gid: int) -> str:
    """Connect to the socket from a child running as uid:gid with no supplementary groups: "ok" or the errno."""
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1]); print('ok')\n"
            "except OSError as e:\n    print(e.errno)\n")
    out = subprocess.run([SYSTEM_PYTHON, "-c", code, str(path)], user=uid, group=gid, extra_groups=[],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or out.stderr


def test_the_socket_serves_without_tls_or_password_while_tcp_needs_both(pki: Pki, users: dict[str, str],
                                                                        rundir: Path) -> None:
    path = rundir / "run" / "metrics.sock"
    s = serve(tls_cfg(pki, basic_auth_users=users), path)
    try:
        assert "burstwatch_build_info" in read_metrics_socket(str(path))
        # the TCP port is as secured as before: TLS, and a 401 without the password
        assert https_get(s.port, client_ctx(pki))[0] == 401
        assert https_get(s.port, client_ctx(pki), user="prometheus", password=PASSWORD)[0] == 200
        with pytest.raises(OSError):      # plain HTTP on the TLS port: what `status` met before (issue 23)
            with socket.create_connection(("127.0.0.1", s.port), timeout=5) as raw:
                raw.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                assert not raw.recv(100).startswith(b"HTTP/1.1 200")
                raise OSError("no HTTP answer")
        # the landing page and 404s come over the socket too, with the same request limits
        with socket.socket(socket.AF_UNIX) as raw:
            raw.connect(str(path))
            raw.sendall(b"GET /nope HTTP/1.0\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.1 404")
        with socket.socket(socket.AF_UNIX) as raw:
            raw.connect(str(path))
            raw.sendall(b"X" * 9000)
            assert raw.recv(100).startswith(b"HTTP/1.1 431")
    finally:
        s.stop()
    assert not path.exists(), "the socket file is removed at stop"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as other users (make test runs as root)")
def test_only_the_owner_and_its_group_can_connect(rundir: Path) -> None:
    path = rundir / "run" / "metrics.sock"
    s = serve(MetricsConfig(), path)
    try:
        assert oct(path.stat().st_mode & 0o777) == "0o660" and oct(path.parent.stat().st_mode & 0o777) == "0o750"
        assert (path.stat().st_uid, path.stat().st_gid) == (os.getuid(), os.getgid())
        # a member of the socket's group (here root's group 0, as the burstwatch group under systemd)
        assert connect_as(path, NOBODY, os.getgid()) == "ok"
        # anyone else: the directory (0750) and the socket (0660) both refuse
        assert connect_as(path, NOBODY, NOBODY) == "13"               # EACCES
        path.parent.chmod(0o755)                                     # even with the directory open
        assert connect_as(path, NOBODY, NOBODY) == "13"
    finally:
        s.stop()


def test_a_stale_socket_is_replaced_a_live_one_and_other_files_are_not(rundir: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = rundir / "metrics.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()                                  # a daemon killed with -9 leaves the file behind
    s = serve(MetricsConfig(), path)
    try:
        assert "burstwatch_build_info" in read_metrics_socket(str(path))
        second = MetricsServer("127.0.0.1", 0, build_registry([BuildInfoView()]))
        assert not second.httpd.listen_unix(str(path)), "a live daemon's socket is not taken over"
        second.httpd.stop()
        assert "another process serves" in caplog.text
        assert "burstwatch_build_info" in read_metrics_socket(str(path))
    finally:
        s.stop()
    path.write_text("not a socket")
    third = MetricsServer("127.0.0.1", 0, build_registry([BuildInfoView()]))
    assert not third.httpd.listen_unix(str(path)) and path.read_text() == "not a socket"
    third.httpd.stop()
    # the default's directory (systemd's RuntimeDirectory=) is never made by the daemon
    fourth = MetricsServer("127.0.0.1", 0, build_registry([BuildInfoView()]))
    assert not fourth.httpd.listen_unix(str(rundir / "absent" / "metrics.sock"), create_dir=False)
    fourth.httpd.stop()
    assert not (rundir / "absent").exists()


# -- `burstwatch status` against the real daemon --------------------------------------------------------

def status(*args: str, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", "status", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)), **kw)


@pytest.mark.slow
def test_status_prints_the_credit_bars_from_a_daemon_serving_tls_with_basic_auth(
        pki: Pki, users: dict[str, str], rundir: Path, tmp_path: Path) -> None:
    sock = rundir / "run" / "metrics.sock"
    port = free_port()
    metrics = {"listen": f"127.0.0.1:{port}", "socket": str(sock), "tls_cert_file": pki.server_cert,
               "tls_key_file": pki.server_key, "basic_auth_users": users}
    cfg = daemon_config(tmp_path, sample_interval=0.5, metrics=metrics, instance={"type": "m5.large"})
    log = tmp_path / "agent.log"
    proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"))
    try:
        deadline = time.monotonic() + 30
        out = status("--config", str(cfg))
        while out.returncode != 0 and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.3)
            out = status("--config", str(cfg))
        assert out.returncode == 0, out.stderr + log.read_text()[-2000:]
        lines = out.stdout.splitlines()
        bars = [ln for ln in lines if ln.lstrip().startswith(("in  [", "out [")) and "#" in ln]
        assert len(bars) == 2 and all("% of " in b and "Gbit (" in b for b in bars), out.stdout
        assert "off EC2  type m5.large" in lines[0], out.stdout
        doc = status("--config", str(cfg), "--json")
        assert doc.returncode == 0
        directions = json.loads(doc.stdout)["directions"]
        assert set(directions) == {"in", "out"}, directions
        assert all(0 < d["remaining_ratio"] <= 1 for d in directions.values())
        # TLS and the password still guard the port
        assert https_get(port, ssl.create_default_context(cafile=str(pki.ca)))[0] == 401
        text = log.read_text()
        assert f"and {sock}" in text and "Traceback" not in text and " ERROR " not in text, text[-2000:]
    finally:
        proc.terminate()
        proc.wait(10)
    assert not sock.exists(), "the daemon removes its socket at stop"
    # with the daemon gone, status says where it looked and does not try plain HTTP on a TLS port
    out = status("--config", str(cfg))
    assert out.returncode == 1 and f"the daemon does not answer at {sock}: no such socket" in out.stderr
    assert "not tried: /metrics needs TLS or basic auth" in out.stderr, out.stderr


def test_the_socket_key() -> None:
    from agent import config as configmod

    assert configmod.Config().metrics.socket == "/run/burstwatch/metrics.sock"
    assert configmod.parse('[metrics]\nsocket = ""\n').metrics.socket == ""
    with pytest.raises(configmod.ConfigError, match="metrics.socket.*107 bytes"):
        configmod.parse(f'[metrics]\nsocket = "/run/{"x" * 120}.sock"\n', "f.toml")
