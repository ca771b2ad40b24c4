"""Every key of the schema, changed one at a time on a reload (Daemon.reload -> Agent.apply), is either applied
(seen in the running part that reads it) or named as waiting for a restart (its running value kept, the key in
the log and burstwatch_config_restart_pending 1). The decision comes from one place, the `restart` marks of
agent/config.py (config_loader.reload_decisions); a key with no mark and no observer here fails: a new key
needs a decision and a way to see it applied."""

from __future__ import annotations

import dataclasses
import logging
import ssl
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from agent import config as configmod
from agent.config_loader import reload_decisions
from agent.daemon import Daemon
from agent.wiring import Agent, Paths
from tests.conftest import free_port
from tests.support.daemon_config import toml_text
from tests.support.tls import Pki, make_pki

BCRYPT_HASH = "$2b$04$nFTqGiQE6k/5tXqvKO.ymuesWkjkAkTYubRkXObpjeu/vEqacOHdm"    # bcrypt of "x", cost 4


def _base(tmp: Path, pki: Pki) -> dict[str, Any]:
    """The running config: TLS on /metrics (so the TLS keys have something to change), a responder on
    loopback and a probe peer (so their services exist), a configured bucket learning may correct (so
    credits.learn and trust_configured_bucket each turn learning off)."""
    return {
        "state_dir": tmp / "state", "interfaces": ["lo"],
        "metrics": {"listen": f"127.0.0.1:{free_port()}", "socket": "", "tls_cert_file": pki.server_cert,
                    "tls_key_file": pki.server_key},
        "instance": {"type": "m5.large", "bandwidth": {"burst_bucket_gbit": 2700.0}},
        "imds": {"enabled": False},
        "credits": {"trust_configured_bucket": False},
        "responder": {"enabled": True, "listen": f"127.0.0.1:{free_port()}", "allow": ["127.0.0.0/8"]},
        "probe": {"peers": ["127.0.0.1:9"]},
    }


def _values(tmp: Path, pki: Pki) -> dict[str, Any]:
    """A new valid value for each key whose default the generic rule (_new_value) cannot change, and the
    companions a key needs to be valid: {key: value} or {key: {key: value, companion: value}}."""
    return {
        "sample_interval": 2.0, "rate_window": 2.0, "state_dir": tmp / "other-state",
        "interfaces": ["lo", "dummy0"], "log_level": "debug",
        "metrics.listen": "127.0.0.1:1", "metrics.socket": tmp / "m.sock", "metrics.ethtool_include": ["rx_drops"],
        "metrics.tls_cert_file": {"metrics.tls_cert_file": pki.client_cert, "metrics.tls_key_file": pki.client_key},
        "metrics.tls_key_file": {"metrics.tls_cert_file": pki.client_cert, "metrics.tls_key_file": pki.client_key},
        "metrics.tls_client_ca_file": pki.ca,
        "metrics.tls_client_auth_type": {"metrics.tls_client_ca_file": pki.ca,
                                         "metrics.tls_client_auth_type": "VerifyClientCertIfGiven"},
        "metrics.tls_min_version": "TLS13", "metrics.basic_auth_users": {"u": BCRYPT_HASH},
        "instance.type": "c5.large", "instance.ec2_endpoint_url": "http://127.0.0.1:1",
        "instance.bandwidth.baseline_gbps": 0.5, "instance.bandwidth.peak_gbps": 12.0,
        "instance.bandwidth.burst_bucket_gbit": 100.0,
        "imds.endpoint": "http://127.0.0.1:1",
        "credits.shaping_source": "none", "credits.tc_in_interface": "ifb0", "credits.tc_out_interface": "lo",
        "allowances.source": "nft", "allowances.nft_table": "inet other",
        "cloudwatch.namespace": "Other", "cloudwatch.region": "eu-west-1", "cloudwatch.endpoint_url": "http://127.0.0.1:1",
        "cloudwatch.flush_interval": 60.0, "cloudwatch.include": ["CreditRemainingRatio"],
        "cloudwatch.dimensions": {"Team": "net"}, "cloudwatch.aggregation_dimensions": [["InstanceType"]],
        "cloudwatch.per_instance": "always",
        "responder.listen": "127.0.0.1:1", "responder.allow": ["10.0.0.0/8"],
        "responder.hourly_budget_bytes": 10**9, "responder.hourly_budget_per_source_bytes": 10**8,
        "probe.peers": ["127.0.0.1:10"], "probe.rate": "peak", "probe.directions": ["out"],
        "probe.discover_tag": "burstwatch", "probe.registry": {"probe.registry": True, "fleet.bucket": "b"},
        "probe.discover_endpoint_url": "http://127.0.0.1:1",
        "probe.archive.enabled": {"probe.archive.enabled": True, "probe.archive.bucket": "b"},
        "probe.archive.bucket": "b", "probe.archive.prefix": "p/", "probe.archive.region": "eu-west-1",
        "probe.archive.endpoint_url": "http://127.0.0.1:1",
        "fleet.enabled": {"fleet.enabled": True, "fleet.bucket": "b"}, "fleet.bucket": "b", "fleet.prefix": "x/",
        "fleet.region": "eu-west-1", "fleet.endpoint_url": "http://127.0.0.1:1",
    }


def _server_cert(d: Daemon) -> bytes:
    """The certificate /metrics presents, from a real handshake."""
    assert d.server is not None
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", d.server.port)))


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def _tls(d: Daemon) -> ssl.SSLContext:
    assert d.server is not None and d.server.httpd.tls is not None
    return d.server.httpd.tls


Observe = Callable[[Daemon, Agent, Any], bool]


def _reads(owner: Callable[[Agent], Any], attr: str) -> Observe:
    """The running part `owner` holds the new value as `attr` (it reads it on every use)."""
    return lambda d, a, v: getattr(owner(a), attr) == v

# Live keys: how the running part shows the new value `v` (as parsed). Where the running part reads its
# section on every use (caps, intervals), that section is what it shows.
OBSERVE: dict[str, Observe] = {
    "sample_interval": lambda d, a, v: d.cfg.sample_interval == v and a.sampler.tracker.rate_window == v,  # type: ignore[union-attr]
    "rate_window": lambda d, a, v: a.sampler.tracker.rate_window == v,  # type: ignore[union-attr]
    "interfaces": lambda d, a, v: a.interfaces == v,
    "log_level": lambda d, a, v: logging.getLogger().level == logging.DEBUG,
    "metrics.ethtool_include": lambda d, a, v: a.ethtool.include == frozenset(v),  # type: ignore[union-attr]
    "metrics.header_timeout": lambda d, a, v: d.server.httpd.limits.header_timeout == v,  # type: ignore[union-attr]
    "metrics.max_connections": lambda d, a, v: d.server.httpd.limits.max_connections == v,  # type: ignore[union-attr]
    "metrics.tls_cert_file": lambda d, a, v: _server_cert(d) == _der(Path(v)),
    "metrics.tls_key_file": lambda d, a, v: _server_cert(d) == _der(Path(d.cfg.metrics.tls_cert_file or "")),
    "metrics.tls_client_ca_file": lambda d, a, v: _tls(d).verify_mode == ssl.CERT_REQUIRED
    and len(_tls(d).get_ca_certs()) == 1,
    "metrics.tls_client_auth_type": lambda d, a, v: _tls(d).verify_mode == ssl.CERT_OPTIONAL,
    "metrics.tls_min_version": lambda d, a, v: _tls(d).minimum_version == ssl.TLSVersion.TLSv1_3,
    "metrics.basic_auth_users": lambda d, a, v: d.server.httpd.auth is not None,  # type: ignore[union-attr]
    "instance.type": lambda d, a, v: a.profile.instance_type == v == a.credits.profile.instance_type,  # type: ignore[union-attr]
    "instance.bandwidth.baseline_gbps": lambda d, a, v: a.profile.baseline_bytes_per_second == v * 1e9 / 8,
    "instance.bandwidth.peak_gbps": lambda d, a, v: a.profile.peak_bytes_per_second == v * 1e9 / 8,
    "instance.bandwidth.burst_bucket_gbit": lambda d, a, v: a.credits.estimator.buckets["in"].bucket == v * 1e9 / 8,  # type: ignore[union-attr]
    "credits.learn": lambda d, a, v: a.credits.estimator.learn is False,  # type: ignore[union-attr]
    "credits.trust_configured_bucket": lambda d, a, v: a.credits.estimator.learn is False,  # type: ignore[union-attr]
    "credits.save_interval": lambda d, a, v: a.credits.cfg.save_interval == v,  # type: ignore[union-attr]
    "credits.forecast_window": lambda d, a, v: a.credits.estimator.forecast_window == v,  # type: ignore[union-attr]
    "allowances.window": lambda d, a, v: a.allowances.conntrack.window == v,  # type: ignore[union-attr]
    "allowances.learn": lambda d, a, v: a.allowances.pps.learn is False,  # type: ignore[union-attr]
    **{f"allowances.{k}": _reads(lambda a: a.allowances.cfg, k)  # type: ignore[union-attr]
       for k in ("horizon", "running_out_share", "near_ceiling_ratio", "flows_interval", "save_interval")},
    "responder.enabled": lambda d, a, v: not a.responder_on and not a.responder.stats.listening,  # type: ignore[union-attr]
    "responder.allow": lambda d, a, v: a.responder.stats.allowed == tuple(v),  # type: ignore[union-attr]
    "responder.max_tests_per_hour": lambda d, a, v: a.responder.limiter.per_hour == v,  # type: ignore[union-attr]
    **{f"responder.{k}": _reads(lambda a: a.responder.cfg, k)  # type: ignore[union-attr]
       for k in ("max_pending", "max_pending_per_source", "max_duration", "max_streams", "max_bytes",
                 "credit_floor", "hourly_budget_bytes", "hourly_budget_per_source_bytes", "hourly_budget_share")},
    "probe.peers": lambda d, a, v: [p.key for p in a.probes.configured] == v,  # type: ignore[union-attr]
    "probe.directions": lambda d, a, v: a.probes.scheduler.directions == tuple(v),  # type: ignore[union-attr]
    **{f"probe.{k}": _reads(lambda a: a.probes.scheduler, k)  # type: ignore[union-attr]
       for k in ("interval", "peers_per_round", "duration", "streams", "rate", "credit_floor", "hourly_budget_bytes")},
}

DECISIONS = reload_decisions(configmod.Config)


def _fields(cls: type = configmod.Config, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    for f in dataclasses.fields(cls):
        default = getattr(cls(), f.name)
        if dataclasses.is_dataclass(default):
            yield from _fields(type(default), f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, default


def _new_value(f: dataclasses.Field[Any], default: Any) -> Any:
    """A valid value other than the running one (`default`), for booleans and numbers with a range."""
    if isinstance(default, bool):
        return not default
    lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
    if isinstance(default, (int, float)) and lo is not None and hi is not None:
        for candidate in (default * 2, (default + lo) / 2, lo, hi):
            v = type(default)(candidate)
            if v != default and lo <= v <= hi:
                return v
    raise AssertionError(f"no new value for {f.name}: add one to _values()")


def _set(doc: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    for p in path:
        doc = doc.setdefault(p, {})
    doc[last] = value


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path, dict[str, Any], dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("reload")
    pki = make_pki(tmp / "pki")
    base = _base(tmp, pki)
    path = tmp / "burstwatch.toml"
    path.write_text(toml_text(base))
    d = Daemon(configmod.load(path), str(path), Paths())
    a = d.setup()
    assert d.server is not None
    d.server.start()
    level = logging.getLogger().level
    try:
        yield d, path, base, _values(tmp, pki)
    finally:
        logging.getLogger().setLevel(level)
        for svc in reversed(a.services):
            svc.stop(1.0)
        d.server.stop()


def test_every_key_has_a_decision_and_a_way_to_see_it() -> None:
    """A new key is either marked `restart` or applied live and observed here."""
    keys = [k for k, _f, _d in _fields()]
    assert list(DECISIONS) == keys
    live = {k for k, waits in DECISIONS.items() if not waits}
    assert live - set(OBSERVE) == set(), "keys a reload applies with no observer in OBSERVE: add one"
    assert set(OBSERVE) - live == set(), "observed keys that are marked restart: drop them from OBSERVE"
    print(f"reload keys: {len(keys)} ({len(live)} applied live, {len(keys) - len(live)} wait for a restart)")


@pytest.mark.parametrize("key", list(DECISIONS))
def test_a_reloaded_key_is_applied_or_reported_as_waiting(
        key: str, running: tuple[Daemon, Path, dict[str, Any], dict[str, Any]],
        caplog: pytest.LogCaptureFixture) -> None:
    d, path, base, values = running
    a = d.agent
    assert a is not None
    started = a.started
    assert started is not None
    field = next(f for k, f, _df in _fields() if k == key)
    change = values.get(key, None)
    if change is None:
        change = _new_value(field, _get(started, key))
    changes = change if isinstance(change, dict) and key in change else {key: change}
    doc = _deep_copy(base)
    for k, v in changes.items():
        _set(doc, k, v)
    path.write_text(toml_text(doc))
    try:
        with caplog.at_level(logging.INFO, logger="agent"):
            assert d.reload()
        new = configmod.load(path)
        value = _get(new, key)
        assert value != _get(started, key), f"{key}: the test did not change it"
        if DECISIONS[key]:
            assert key in d.reload_state.restart_pending, f"{key}: a change that waits is not reported"
            assert _get(a.cfg, key) == _get(started, key), f"{key}: the running value moved"
            assert any(key in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
            assert _gauge(d) == 1.0
        else:
            assert key not in d.reload_state.restart_pending
            assert OBSERVE[key](d, a, value), f"{key}: the new value {value!r} is not applied"
    finally:
        path.write_text(toml_text(base))
        assert d.reload()
    assert d.reload_state.restart_pending == [] and _gauge(d) == 0.0, "setting the file back clears it"


def _deep_copy(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in doc.items()}


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _gauge(d: Daemon) -> float:
    return next(m.samples[0].value for m in d.reload_state.collect() if m.name == "burstwatch_config_restart_pending")
