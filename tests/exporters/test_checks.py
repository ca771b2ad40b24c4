"""The checks view: burstwatch_check_status and the figures behind the verdicts, linted by promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent import config as configmod
from agent.checks import run_checks
from agent.checks.runner import CheckRunner, CheckState
from agent.exporters.checks import CheckView
from agent.readers.pmtu import measure_path_mtu
from tests.checks.helpers import fixture_context

CFG = configmod.parse('[probe]\npeers = ["127.0.0.1", "no-such-host.invalid"]\n[imds]\nenabled = false\n')


def _state(fixture: str = "ena-2.12.3g-c6in.32xlarge-express") -> CheckState:
    runner = CheckRunner(lambda _slow: run_checks(fixture_context(fixture, cfg=CFG, path_mtu=measure_path_mtu)),
                         wall=lambda: 1700000000.0)
    return runner.run_once()


def _registry(state: object) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CheckView(lambda: state))  # type: ignore[arg-type, return-value]
    return reg


def test_status_values_and_details() -> None:
    reg = _registry(_state())
    get = reg.get_sample_value
    def status(check: str, interface: str) -> str:
        values = {s: get("burstwatch_check_status", {"check": check, "interface": interface, "status": s})
                  for s in ("ok", "warn", "fail", "skip")}
        assert sorted(values.values()) == [0, 0, 0, 1], values     # a state set: exactly one status is 1
        return next(s for s, val in values.items() if val == 1)

    assert status("driver", "eth0") == "ok"
    assert status("queues", "eth0") == "warn"
    assert status("mtu", "eth0") == "warn"                          # the 8900 rule
    assert status("imds", "") == "skip"
    assert status("path_mtu", "127.0.0.1") == "ok"
    assert status("path_mtu", "no-such-host.invalid") == "skip"
    assert get("burstwatch_check_last_run_timestamp_seconds", {"check": "rings"}) == 1700000000.0
    assert get("burstwatch_check_duration_seconds", {"check": "rings"}) >= 0
    assert get("burstwatch_check_runs_total") == 1
    assert get("burstwatch_interface_mtu_bytes", {"interface": "eth0"}) == 9001
    assert get("burstwatch_path_mtu_bytes", {"peer": "127.0.0.1"}) == 65535
    assert get("burstwatch_path_mtu_black_hole", {"peer": "127.0.0.1"}) == 0
    assert get("burstwatch_path_mtu_bytes", {"peer": "no-such-host.invalid"}) is None
    for kind, value in (("in_use", 8), ("maximum", 32), ("expected", 32)):
        assert get("burstwatch_interface_queues", {"interface": "eth0", "kind": kind}) == value
    assert get("burstwatch_interface_ring_entries", {"interface": "eth0", "ring": "tx", "setting": "maximum"}) == 512


def test_fail_is_the_fail_series() -> None:
    reg = _registry(_state("vif-xen-m4.large"))
    labels = {"check": "driver", "interface": "eth0"}
    assert reg.get_sample_value("burstwatch_check_status", {**labels, "status": "fail"}) == 1
    assert reg.get_sample_value("burstwatch_check_status", {**labels, "status": "ok"}) == 0


def test_nothing_before_the_first_round() -> None:
    assert generate_latest(_registry(None)) == b""


def test_promtool_accepts_the_exposition() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: `make test-deps` installs Debian's prometheus package")
    res = subprocess.run([promtool, "check", "metrics"], input=generate_latest(_registry(_state())),
                         capture_output=True, timeout=30)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
