"""The checks view: burstwatch_check_status and the figures behind the verdicts, linted by promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent import config as configmod
from agent.checks.runner import CheckRunner, CheckState
from agent.exporters.checks import CheckView
from agent.readers.pmtu import measure_path_mtu
from tests.checks.helpers import fixture_context

CFG = configmod.parse('[probe]\npeers = ["127.0.0.1", "no-such-host.invalid"]\n[imds]\nenabled = false\n')


def _state(fixture: str = "ena-2.12.3g-c6in.32xlarge-express") -> CheckState:
    runner = CheckRunner(lambda before: fixture_context(fixture, cfg=CFG, path_mtu=measure_path_mtu),
                         wall=lambda: 1700000000.0)
    return runner.run_once()


def _registry(state: object) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CheckView(lambda: state))  # type: ignore[arg-type, return-value]
    return reg


def test_status_values_and_details() -> None:
    reg = _registry(_state())
    get = reg.get_sample_value
    assert get("burstwatch_check_status", {"check": "driver", "interface": "eth0"}) == 0
    assert get("burstwatch_check_status", {"check": "queues", "interface": "eth0"}) == 1     # warn
    assert get("burstwatch_check_status", {"check": "mtu", "interface": "eth0"}) == 1        # the 8900 rule
    assert get("burstwatch_check_status", {"check": "imds", "interface": ""}) == -1          # skip
    assert get("burstwatch_check_status", {"check": "path_mtu", "interface": "127.0.0.1"}) == 0
    assert get("burstwatch_check_status", {"check": "path_mtu", "interface": "no-such-host.invalid"}) == -1
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


def test_fail_is_two() -> None:
    reg = _registry(_state("vif-xen-m4.large"))
    assert reg.get_sample_value("burstwatch_check_status", {"check": "driver", "interface": "eth0"}) == 2


def test_nothing_before_the_first_round() -> None:
    assert generate_latest(_registry(None)) == b""


def test_promtool_accepts_the_exposition() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: `make test-deps` installs Debian's prometheus package")
    res = subprocess.run([promtool, "check", "metrics"], input=generate_latest(_registry(_state())),
                         capture_output=True, timeout=30)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
