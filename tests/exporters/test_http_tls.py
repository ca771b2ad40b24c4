"""TLS and basic auth on /metrics (agent/exporters/webconfig.py), set up the way exporter-toolkit's web
config does it: a real TLS client from the ssl module, client certificates, bcrypt users, the [metrics]
keys' validation, and Prometheus itself scraping over TLS with basic auth."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from agent import config as configmod
from agent.config import ConfigError, MetricsConfig
from agent.exporters import webconfig
from agent.exporters.prometheus import BuildInfoView, MetricsServer, build_registry
from tests.conftest import free_port
from tests.support.tls import Pki, make_pki

PASSWORD = "correct horse"


@pytest.fixture(scope="module")
def bcrypt() -> Any:
    # the .deb and .rpm depend on it; `make deps` installs python3-bcrypt, `make test39` the same version from PyPI
    return pytest.importorskip("bcrypt", reason="python3-bcrypt is missing: `make deps` installs it")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def users(bcrypt: Any) -> dict[str, str]:
    # cost 10, what `htpasswd -nBC 10` makes; $2y$ is htpasswd's prefix for the same algorithm
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    return {"prometheus": "$2y$" + hashed[4:], "ops": bcrypt.hashpw(b"other", bcrypt.gensalt(rounds=4)).decode()}


def tls_cfg(pki: Pki, **kw: Any) -> MetricsConfig:
    return MetricsConfig(tls_cert_file=str(pki.server_cert), tls_key_file=str(pki.server_key), **kw)


def serve(cfg: MetricsConfig) -> MetricsServer:
    server = MetricsServer("127.0.0.1", 0, build_registry([BuildInfoView()]), config=cfg, generation=lambda: None)
    server.start()
    return server


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[MetricsServer]:
    s = serve(request.param)
    try:
        yield s
    finally:
        s.stop()


def client_ctx(pki: Pki, cert: Optional[tuple[Path, Path]] = None,
               max_version: Optional[ssl.TLSVersion] = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


def https_get(port: int, ctx: ssl.SSLContext, user: Optional[str] = None, password: str = "",
              path: str = "/metrics", host: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


# -- TLS ------------------------------------------------------------------------------------------

def test_tls_serves_metrics_to_a_verifying_client(pki: Pki) -> None:
    s = serve(tls_cfg(pki))
    try:
        status, _, body = https_get(s.port, client_ctx(pki))
        assert status == 200 and b"burstwatch_build_info" in body
        status, _, body = https_get(s.port, client_ctx(pki), path="/", host="localhost")
        assert status == 200 and b'href="/metrics"' in body
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as raw, \
                client_ctx(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            assert tls.selected_alpn_protocol() in (None, "http/1.1")
        # a client that does not trust the CA refuses the server; plain HTTP on the TLS port gets nothing
        with pytest.raises(ssl.SSLCertVerificationError):
            https_get(s.port, ssl.create_default_context())
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{s.port}/metrics", timeout=5).read()
        assert s.httpd.counts["tls-failed"] >= 2
    finally:
        s.stop()


def test_tls_min_version(pki: Pki) -> None:
    s = serve(tls_cfg(pki, tls_min_version="TLS13"))
    try:
        assert https_get(s.port, client_ctx(pki))[0] == 200
        with pytest.raises(ssl.SSLError):
            https_get(s.port, client_ctx(pki, max_version=ssl.TLSVersion.TLSv1_2))
    finally:
        s.stop()


def test_client_certificates_required_and_verified(pki: Pki) -> None:
    s = serve(tls_cfg(pki, tls_client_ca_file=str(pki.ca)))   # default: RequireAndVerifyClientCert
    try:
        assert https_get(s.port, client_ctx(pki, (pki.client_cert, pki.client_key)))[0] == 200
        for cert in (None, (pki.stranger_cert, pki.stranger_key)):
            with pytest.raises(OSError):  # an alert at the handshake (TLS 1.2) or at the first read (1.3)
                https_get(s.port, client_ctx(pki, cert))
    finally:
        s.stop()


def test_client_certificates_verified_if_given(pki: Pki) -> None:
    s = serve(tls_cfg(pki, tls_client_ca_file=str(pki.ca), tls_client_auth_type="VerifyClientCertIfGiven"))
    try:
        assert https_get(s.port, client_ctx(pki))[0] == 200
        assert https_get(s.port, client_ctx(pki, (pki.client_cert, pki.client_key)))[0] == 200
        with pytest.raises(OSError):
            https_get(s.port, client_ctx(pki, (pki.stranger_cert, pki.stranger_key)))
    finally:
        s.stop()


def test_tls_handshakes_that_stall_are_closed_within_the_header_timeout(pki: Pki) -> None:
    s = serve(tls_cfg(pki, header_timeout=1.0))
    socks = []
    try:
        for i in range(50):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            if i % 2:
                c.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello
            socks.append(c)
        t0 = time.monotonic()
        assert https_get(s.port, client_ctx(pki))[0] == 200
        assert time.monotonic() - t0 < 2.0
        for c in socks:
            c.settimeout(5)
            assert c.recv(100) == b""
        assert time.monotonic() - t0 < 2.5
        assert s.httpd.open_connections() == 0
    finally:
        for c in socks:
            c.close()
        s.stop()


# -- basic auth -----------------------------------------------------------------------------------

def test_basic_auth_over_tls(pki: Pki, users: dict[str, str]) -> None:
    s = serve(tls_cfg(pki, basic_auth_users=users))
    ctx = client_ctx(pki)
    try:
        for user, password in ((None, ""), ("prometheus", "wrong"), ("nobody", PASSWORD), ("prometheus", ""),
                               ("prometheus", PASSWORD + "x"), ("ops", PASSWORD)):
            status, headers, body = https_get(s.port, ctx, user, password)
            assert status == 401, (user, password)
            assert headers["WWW-Authenticate"].startswith("Basic realm=")
            assert b"burstwatch_" not in body
        # every path needs the password, the landing page and a 404 too (exporter-toolkit wraps them all)
        assert https_get(s.port, ctx, path="/")[0] == 401
        assert https_get(s.port, ctx, path="/nope")[0] == 401
        assert https_get(s.port, ctx, "prometheus", PASSWORD, path="/nope")[0] == 404
        status, _, body = https_get(s.port, ctx, "prometheus", PASSWORD)
        assert status == 200 and b"burstwatch_build_info" in body
        assert https_get(s.port, ctx, "ops", "other")[0] == 200
    finally:
        s.stop()


@pytest.mark.parametrize("header", [None, "", "Bearer abc", "Basic", "Basic !!!!", "Basic " +
                                    base64.b64encode(b"no-colon").decode(), "Basic " +
                                    base64.b64encode(b"\xff\xfe:x").decode()])
def test_malformed_authorization_is_refused_without_bcrypt(users: dict[str, str], header: Optional[str]) -> None:
    auth = webconfig.BasicAuth(users)
    assert auth(header, True) is False


class CountingBcrypt:
    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[bytes] = []

    def checkpw(self, password: bytes, hashed: bytes) -> bool:
        self.calls.append(hashed)
        return bool(self.real.checkpw(password, hashed))


def creds(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_bcrypt_runs_once_per_password_and_for_unknown_users_too(users: dict[str, str]) -> None:
    auth = webconfig.BasicAuth(users)
    counting = CountingBcrypt(auth._bcrypt)
    auth._bcrypt = counting
    assert auth(creds("prometheus", PASSWORD), False) is None        # needs bcrypt: not on the event loop
    assert auth(creds("prometheus", PASSWORD), True) is True
    for _ in range(5):
        assert auth(creds("prometheus", PASSWORD), False) is True    # remembered: no bcrypt, no worker
    assert len(counting.calls) == 1
    # an unknown user costs a bcrypt like a known one (no user enumeration by timing)...
    assert auth(creds("mallory", PASSWORD), True) is False
    assert len(counting.calls) == 2 and counting.calls[-1] not in [h.encode() for h in users.values()]
    # ...and a wrong password is never remembered as right
    assert auth(creds("prometheus", "wrong"), True) is False
    assert auth(creds("prometheus", "wrong"), False) is None
    assert len(counting.calls) == 3
    # the plaintext password is not kept: only a keyed hash of it
    assert PASSWORD.encode() not in repr(vars(auth)).encode()


def test_unknown_user_and_wrong_password_take_as_long(users: dict[str, str]) -> None:
    auth = webconfig.BasicAuth(users)

    def timed(user: str) -> float:
        t0 = time.perf_counter()
        assert auth(creds(user, "guess"), True) is False
        return time.perf_counter() - t0

    known = min(timed("prometheus") for _ in range(3))
    unknown = min(timed("mallory") for _ in range(3))
    assert unknown > 0.5 * known, (known, unknown)


def test_reconfigure_swaps_users_and_certificates(pki: Pki, users: dict[str, str]) -> None:
    s = serve(tls_cfg(pki, basic_auth_users={"prometheus": users["prometheus"]}))
    ctx = client_ctx(pki)
    try:
        assert https_get(s.port, ctx, "prometheus", PASSWORD)[0] == 200
        s.reconfigure(tls_cfg(pki, basic_auth_users={"ops": users["ops"]}))
        assert https_get(s.port, ctx, "prometheus", PASSWORD)[0] == 401
        assert https_get(s.port, ctx, "ops", "other")[0] == 200
        with pytest.raises(ConfigError, match="metrics.tls_cert_file"):
            s.reconfigure(MetricsConfig(tls_cert_file="/nonexistent/cert.pem", tls_key_file=str(pki.server_key)))
        assert https_get(s.port, ctx, "ops", "other")[0] == 200       # the old settings stay
        s.reconfigure(MetricsConfig())                                   # back to plain HTTP, no users
        with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/metrics", timeout=5) as r:
            assert r.status == 200
    finally:
        s.stop()


# -- config ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("toml, key", [
    ('tls_cert_file = "cert.pem"', "metrics.tls_cert_file"),
    ('tls_client_auth_type = "RequireAnyClientCert"', "metrics.tls_client_auth_type"),
    ('tls_client_auth_type = "RequestClientCert"', "metrics.tls_client_auth_type"),
    ('tls_min_version = "TLS11"', "metrics.tls_min_version"),
    ('header_timeout = 0', "metrics.header_timeout"),
    ('header_timeout = 120', "metrics.header_timeout"),
    ('max_connections = 1', "metrics.max_connections"),
    ('basic_auth_users = {prometheus = "hunter2"}', "metrics.basic_auth_users"),
    ('basic_auth_users = {prometheus = "$2y$10$tooshort"}', "metrics.basic_auth_users"),
    ('basic_auth_users = {"a:b" = "$2b$04$' + "a" * 53 + '"}', "metrics.basic_auth_users"),
    ('basic_auth_users = {"" = "$2b$04$' + "a" * 53 + '"}', "metrics.basic_auth_users"),
    ('basic_auth_users = {p = "$2b$03$' + "a" * 53 + '"}', "metrics.basic_auth_users"),
    ('basic_auth_users = {p = 12}', "metrics.basic_auth_users"),
    ('basic_auth_users = ["p"]', "metrics.basic_auth_users"),
    ('tls = true', "metrics.tls"),
])
def test_bad_keys_are_refused_at_load_naming_the_key(toml: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        configmod.parse(f"[metrics]\n{toml}\n", "/etc/burstwatch/burstwatch.toml")
    assert f"'{key}'" in str(err.value) and "/etc/burstwatch/burstwatch.toml" in str(err.value)


def test_good_keys_load() -> None:
    h = "$2y$10$" + "a" * 53
    cfg = configmod.parse(f"""[metrics]
header_timeout = 2.5
max_connections = 64
tls_cert_file = "/etc/burstwatch/tls/cert.pem"
tls_key_file = "/etc/burstwatch/tls/key.pem"
tls_client_ca_file = "/etc/burstwatch/tls/ca.pem"
tls_min_version = "TLS13"
[metrics.basic_auth_users]
prometheus = "{h}"
"grafana agent" = "{h}"
""")
    m = cfg.metrics
    assert (m.header_timeout, m.max_connections, m.tls_min_version) == (2.5, 64, "TLS13")
    assert m.basic_auth_users == {"prometheus": h, "grafana agent": h}
    assert m.effective_client_auth_type == "RequireAndVerifyClientCert" and m.cross_check() is None
    assert MetricsConfig().effective_client_auth_type == "NoClientCert" and MetricsConfig().cross_check() is None


@pytest.mark.parametrize("kw, key", [
    ({"tls_cert_file": "/c"}, "metrics.tls_key_file"),
    ({"tls_key_file": "/k"}, "metrics.tls_cert_file"),
    ({"tls_client_ca_file": "/ca"}, "metrics.tls_client_ca_file"),
    ({"tls_client_auth_type": "NoClientCert"}, "metrics.tls_client_auth_type"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "tls_client_auth_type": "RequireAndVerifyClientCert"},
     "metrics.tls_client_auth_type"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "tls_client_ca_file": "/ca",
      "tls_client_auth_type": "NoClientCert"}, "metrics.tls_client_ca_file"),
])
def test_keys_that_disagree(kw: dict[str, str], key: str) -> None:
    problem = MetricsConfig(**kw).cross_check()
    assert problem is not None and problem.startswith(f"key '{key}'")
    with pytest.raises(ConfigError, match=key):
        webconfig.tls_context(MetricsConfig(**kw))


def test_unusable_files_are_refused_at_start_naming_the_key(pki: Pki, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cases = [
        (MetricsConfig(tls_cert_file=str(tmp_path / "missing.pem"), tls_key_file=str(pki.server_key)),
         "metrics.tls_cert_file"),
        (MetricsConfig(tls_cert_file=str(pki.server_cert), tls_key_file=str(tmp_path / "missing.key")),
         "metrics.tls_key_file"),
        (MetricsConfig(tls_cert_file=str(pki.server_cert), tls_key_file=str(pki.client_key)),  # not its key
         "metrics.tls_key_file"),
        (MetricsConfig(tls_cert_file=str(junk), tls_key_file=str(pki.server_key)), "metrics.tls_key_file"),
        (tls_cfg(pki, tls_client_ca_file=str(junk)), "metrics.tls_client_ca_file"),
        (tls_cfg(pki, tls_client_ca_file=str(tmp_path / "missing-ca.pem")), "metrics.tls_client_ca_file"),
    ]
    for cfg, key in cases:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            MetricsServer("127.0.0.1", 0, build_registry([]), config=cfg)


def test_bcrypt_is_imported_only_when_users_are_configured() -> None:
    code = ("import sys\nfrom agent.exporters.prometheus import MetricsServer, build_registry\n"
            "s = MetricsServer('127.0.0.1', 0, build_registry([])); s.stop()\nprint('bcrypt' in sys.modules)")
    out = subprocess.run([__import__("sys").executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False", out.stderr


# -- Prometheus -----------------------------------------------------------------------------------

def test_prometheus_scrapes_over_tls_with_basic_auth_and_a_client_certificate(
        pki: Pki, users: dict[str, str], tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is missing: `make test-deps` installs it (Debian: prometheus)")
    s = serve(tls_cfg(pki, basic_auth_users=users, tls_client_ca_file=str(pki.ca)))
    port = free_port()
    target = f"127.0.0.1:{s.port}"
    good_tls = f"{{ca_file: {pki.ca}, cert_file: {pki.client_cert}, key_file: {pki.client_key}}}"
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: good
    scheme: https
    tls_config: {good_tls}
    basic_auth: {{username: prometheus, password: "{PASSWORD}"}}
    static_configs: [{{targets: ['{target}']}}]
  - job_name: wrong-password
    scheme: https
    tls_config: {good_tls}
    basic_auth: {{username: prometheus, password: "guess"}}
    static_configs: [{{targets: ['{target}']}}]
  - job_name: no-client-cert
    scheme: https
    tls_config: {{ca_file: {pki.ca}}}
    basic_auth: {{username: prometheus, password: "{PASSWORD}"}}
    static_configs: [{{targets: ['{target}']}}]
  - job_name: plain-http
    static_configs: [{{targets: ['{target}']}}]
""")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        health: dict[str, tuple[str, str]] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{api}/targets", timeout=2) as r:
                    doc = json.load(r)
                health = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in doc["data"]["activeTargets"]}
            except OSError:
                pass
            if len(health) == 4 and all(h != "unknown" for h, _ in health.values()) and health["good"][0] == "up":
                break
            time.sleep(0.5)
        assert health["good"] == ("up", ""), health
        assert health["wrong-password"][0] == "down" and "401" in health["wrong-password"][1], health
        assert health["no-client-cert"][0] == "down", health
        assert health["plain-http"][0] == "down", health
        query = urllib.parse.quote('burstwatch_build_info{job="good"}')
        with urllib.request.urlopen(f"{api}/query?query={query}", timeout=5) as r:
            result = json.load(r)["data"]["result"]
        assert len(result) == 1 and result[0]["value"][1] == "1"
    finally:
        prom.terminate()
        prom.wait(20)
        s.stop()
