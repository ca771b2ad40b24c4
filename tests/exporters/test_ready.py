"""/-/ready, the chart's readiness path: 200 while every configured listener listens, 503 naming the ones
that do not (a pod whose responder could not bind is never Ready)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from agent.exporters.prometheus import MetricsServer


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture()
def server_and_missing():
    missing: list[str] = []
    srv = MetricsServer("127.0.0.1", 0, CollectorRegistry(), not_listening=lambda: missing)
    srv.start()
    try:
        yield srv, missing
    finally:
        srv.stop()


def test_ready_follows_the_listeners(server_and_missing) -> None:
    srv, missing = server_and_missing
    assert _get(srv.port, "/-/ready") == (200, b"ready\n")
    missing.append("responder")
    status, body = _get(srv.port, "/-/ready")
    assert status == 503 and body == b"not ready: not listening: responder\n"
    missing.clear()
    assert _get(srv.port, "/-/ready")[0] == 200


def test_ready_without_listeners_to_watch() -> None:
    srv = MetricsServer("127.0.0.1", 0, CollectorRegistry())
    srv.start()
    try:
        assert _get(srv.port, "/-/ready") == (200, b"ready\n")
    finally:
        srv.stop()


def test_the_daemon_is_not_ready_while_its_responder_cannot_listen(tmp_path) -> None:
    """The daemon's wiring: a responder whose port is taken makes /-/ready answer 503 naming it."""
    import socket

    from agent import config
    from agent.daemon import Daemon
    from tests.conftest import free_port

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    cfg = config.parse(f'''
interfaces = ["lo"]
state_dir = "{tmp_path}"
[metrics]
listen = "127.0.0.1:{free_port()}"
[responder]
enabled = true
listen = "127.0.0.1:{taken.getsockname()[1]}"
[imds]
enabled = false
[instance]
type = "m5.large"
''')
    d = Daemon(cfg, None)
    a = d.setup()
    assert d.server is not None and a.responder is not None
    d.server.start()
    try:
        a.responder.start()          # logs "cannot listen", the daemon runs on
        assert _get(d.server.port, "/-/ready") == (503, b"not ready: not listening: responder\n")
        taken.close()
        a.responder.start()          # the port free: the next start listens
        assert _get(d.server.port, "/-/ready") == (200, b"ready\n")
    finally:
        a.responder.stop(1.0)
        d.server.stop()
        taken.close()
