"""The config loader: valid files, and each kind of invalid one with the exact message."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import config as c

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_when_the_default_path_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(c, "DEFAULT_CONFIG_PATH", str(tmp_path / "nope.toml"))
    cfg = c.load(None)
    assert cfg == c.Config()
    assert cfg.sample_interval == 1.0 and cfg.metrics.listen == "0.0.0.0:9786"


def test_contract_example_is_valid() -> None:
    cfg = c.parse("""
sample_interval = 1.0
state_dir = "/var/lib/burstwatch"
interfaces = ["eth0"]
[metrics]
listen = "0.0.0.0:9786"
[instance]
type = "m5.large"
[instance.bandwidth]
baseline_gbps = 0.75
peak_gbps = 10.0
burst_bucket_gbit = 2700.0
[imds]
endpoint = "http://169.254.169.254"
[cloudwatch]
enabled = false
namespace = "Burstwatch"
region = "us-east-1"
endpoint_url = "http://127.0.0.1:5000"
[responder]
listen = "0.0.0.0:5201"
allow = ["10.0.0.0/8"]
[probe]
peers = ["10.0.1.23", "10.0.1.24:5201"]
""")
    assert cfg.instance.bandwidth.burst_bucket_gbit == 2700.0
    assert cfg.probe.peers == ["10.0.1.23", "10.0.1.24:5201"]


def test_ints_are_accepted_for_floats() -> None:
    assert c.parse("sample_interval = 2").sample_interval == 2.0


@pytest.mark.parametrize(("text", "message"), [
    ("sampel_interval = 1.0", "f.toml: unknown key 'sampel_interval' (known: "),
    ("[metrics]\nlistn = 'x'", "f.toml: unknown key 'metrics.listn' (known: basic_auth_users, ethtool_include, "
     "header_timeout, listen, max_connections, socket, tls_cert_file, tls_client_auth_type, "
     "tls_client_ca_file, tls_key_file, tls_min_version)"),
    ("sample_interval = 'fast'", "f.toml: key 'sample_interval' must be a number, got 'fast'"),
    ("sample_interval = 0.05", "f.toml: key 'sample_interval' = 0.05 is out of range 0.1 .. 60"),
    ("sample_interval = true", "f.toml: key 'sample_interval' must be a number, got True"),
    ("interfaces = 'eth0'", "f.toml: key 'interfaces' must be a list of strings, got 'eth0'"),
    ("interfaces = [1]", "f.toml: key 'interfaces' must be a list of strings, got [1]"),
    ("metrics = 3", "f.toml: [metrics] must be a table, got 3"),
    ("[metrics]\nlisten = '0.0.0.0'", "f.toml: key 'metrics.listen': '0.0.0.0' is not host:port"),
    ("[metrics]\nlisten = 'h:70000'", "f.toml: key 'metrics.listen': 'h:70000' is not host:port"),
    ("[responder]\nallow = ['10.0.0.0/33']", "f.toml: key 'responder.allow': '10.0.0.0/33' is not a CIDR"),
    ("[probe]\npeers = ['10.0.0.1:x']", "f.toml: key 'probe.peers': peer '10.0.0.1:x' has an invalid port"),
    ("[instance.bandwidth]\nbaseline_gbps = 5.0\npeak_gbps = 1.0",
     "f.toml: key 'instance.bandwidth.peak_gbps' = 1.0 is below baseline_gbps = 5.0"),
    ("[instance.bandwidth]\npeak_gbps = -1", "f.toml: key 'instance.bandwidth.peak_gbps' = -1.0 is out of range"),
    ("[cloudwatch]\nnamespace = 'AWS/EC2'", "f.toml: key 'cloudwatch.namespace': must not start with 'AWS/'"),
    ("[cloudwatch]\nendpoint_url = 'localhost:5000'", "f.toml: key 'cloudwatch.endpoint_url': 'localhost:5000' is not"),
    ("[credits]\nshaping_source = 'magic'", "f.toml: key 'credits.shaping_source': 'magic' is not one of"),
    ("rate_window = 0.5\nsample_interval = 1.0", "f.toml: key 'rate_window' = 0.5 is shorter than sample_interval"),
    ("sample_interval = = 1", "f.toml: not valid TOML: "),
])
def test_invalid_configs_name_the_file_and_key(text: str, message: str) -> None:
    with pytest.raises(c.ConfigError) as exc:
        c.parse(text, "f.toml")
    assert str(exc.value).startswith(message), str(exc.value)


def test_missing_explicit_file(tmp_path: Path) -> None:
    with pytest.raises(c.ConfigError, match="no such file"):
        c.load(tmp_path / "absent.toml")


def test_bundled_default_config_is_valid() -> None:
    cfg = c.load(ROOT / "agent" / "data" / "default.toml")
    assert cfg.metrics.listen.startswith("127.0.0.1:")


def test_every_key_is_documented_in_order() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    doc = doc[doc.index("<!-- keys:begin"):doc.index("<!-- keys:end")]   # the reference table
    positions = []
    for key, _type, _default, _doc in c.describe_keys():
        token = f"`{key}`"
        assert token in doc, f"docs/configuration.md does not describe {key}"
        positions.append(doc.index(token))
    assert positions == sorted(positions), "docs/configuration.md lists the keys in another order than the code"


def test_configuration_reference_is_generated_from_the_code() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_config_doc.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
