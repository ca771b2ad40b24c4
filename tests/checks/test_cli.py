"""`burstwatch check`: the table, --json and the exit codes; on fixtures, and for real on this host."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import config as configmod
from agent.checks.context import CheckContext
from agent.commands.check import cmd_check
from agent.readers.imds import ImdsClient
from tests.checks.helpers import fixture_context
from tests.conftest import BURSTWATCH, ROOT, free_port
from tests.support.imds_server import ImdsServer


def _run(fixture: str, tmp_path: Path, as_json: bool, config: str = "[imds]\nenabled = false\n",
         **kw: object) -> tuple[int, str]:
    path = tmp_path / "burstwatch.toml"
    path.write_text(config)
    out = io.StringIO()

    def factory(cfg: configmod.Config) -> CheckContext:
        return fixture_context(fixture, cfg=cfg, **kw)

    code = cmd_check(argparse.Namespace(config=str(path), json=as_json), context_factory=factory, out=out)
    return code, out.getvalue()


def test_table(tmp_path: Path) -> None:
    code, text = _run("ena-2.12.3g-c6in.32xlarge-express", tmp_path, False)
    lines = text.splitlines()
    assert lines[0].split() == ["CHECK", "INTERFACE", "STATUS", "SUMMARY"]
    rows = {ln.split()[0]: ln.split()[2] for ln in lines[1:-2] if ln and not ln.startswith(" ")}
    assert rows == {"driver": "OK", "driver_version": "OK", "queues": "WARN", "rings": "OK", "mtu": "WARN",
                    "path_mtu": "SKIP", "imds": "SKIP", "conntrack": "OK", "linklocal": "OK", "fleet_access": "SKIP"}
    assert any(ln.strip() == "fix: sudo ethtool -L eth0 combined 32" for ln in lines)
    assert any(ln.strip() == "fix: sudo ip link set dev eth0 mtu 8900" for ln in lines)
    assert lines[-1] == "5 ok, 2 warn, 0 fail, 3 skip; exit 1"
    assert code == 1


def test_json(tmp_path: Path) -> None:
    code, text = _run("ena-1.5.0g-r4.large", tmp_path, True)
    doc = json.loads(text)
    assert code == doc["exit_code"] == 2
    assert doc["counts"] == {"ok": 4, "warn": 0, "fail": 1, "skip": 4}
    assert doc["interfaces"] == ["eth0"] and doc["instance"]["instance_type"] == "r4.large"
    by = {(v["check"], v["interface"]): v for v in doc["verdicts"]}
    dv = by[("driver_version", "eth0")]
    assert dv["status"] == "fail" and dv["evidence"]["allowance_counters"] == [] and "modinfo ena" in dv["remedy"]
    assert set(dv) == {"check", "interface", "status", "summary", "evidence", "remedy"}
    # Issue 23: each check's own seconds, which the daemon's runner exports as burstwatch_check_duration_seconds
    assert list(doc["durations"]) == doc["checks"] and all(d >= 0 for d in doc["durations"].values())


def test_checks_option_runs_only_the_named_checks(tmp_path: Path) -> None:
    """What the daemon's runner asks its child for: the checks due this round, in registry order."""
    path = tmp_path / "burstwatch.toml"
    path.write_text("[imds]\nenabled = false\n")
    out = io.StringIO()
    cmd_check(argparse.Namespace(config=str(path), json=True, checks="mtu,driver"),
              context_factory=lambda cfg: fixture_context("ena-1.5.0g-r4.large", cfg=cfg), out=out)
    doc = json.loads(out.getvalue())
    assert [v["check"] for v in doc["verdicts"]] == ["driver", "mtu"] and list(doc["durations"]) == ["driver", "mtu"]
    bad = subprocess.run([sys.executable, "-m", "agent", "check", "--checks", "driver,nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown check nope" in bad.stderr


def test_exit_zero_when_all_is_well(tmp_path: Path) -> None:
    with ImdsServer() as imds:
        client = ImdsClient(imds.url, timeout=0.5, retries=0)
        code, text = _run("ena-2.12.3g-m6i.xlarge", tmp_path, False, config=f'[imds]\nendpoint = "{imds.url}"\n',
                          imds_probe=client.probe)
    assert code == 0, text
    assert text.splitlines()[-1] == "8 ok, 0 warn, 0 fail, 2 skip; exit 0"


def test_bad_config_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[probe]\npeers = 7\n")
    with pytest.raises(configmod.ConfigError, match="probe.peers"):
        cmd_check(argparse.Namespace(config=str(path), json=False))


def _sysfs_driver(ifname: str) -> str:
    link = Path("/sys/class/net", ifname, "device", "driver")
    return os.path.basename(os.readlink(link)) if link.is_symlink() else "none"


def test_tells_the_truth_on_this_host(tmp_path: Path) -> None:
    """No mocks: this machine's own interfaces, netlink, ethtool ioctls; IMDS is a closed local port."""
    path = tmp_path / "burstwatch.toml"
    path.write_text(f'[imds]\nendpoint = "http://127.0.0.1:{free_port()}"\ntimeout = 0.3\nretries = 0\n')
    out = io.StringIO()
    code = cmd_check(argparse.Namespace(config=str(path), json=True), out=out)
    doc = json.loads(out.getvalue())
    assert code == doc["exit_code"]
    drivers = [v for v in doc["verdicts"] if v["check"] == "driver"]
    assert drivers and [v["interface"] for v in drivers] == doc["interfaces"]
    for v in drivers:
        real = _sysfs_driver(v["interface"])
        assert v["evidence"]["sysfs_driver"] in (real, None)
        if real == "ena":
            assert v["status"] == "ok"
        else:   # the build host is not an EC2 instance with ENA: the check must say so, and why
            assert v["status"] == "fail" and "is not ENA" in v["summary"] and "allowance counters" in v["summary"]
            assert code == 2


def test_python_m_agent_check(tmp_path: Path) -> None:
    """The real command line (`python -m agent check --json`), as an operator runs it."""
    path = tmp_path / "burstwatch.toml"
    path.write_text(f'[imds]\nendpoint = "http://127.0.0.1:{free_port()}"\ntimeout = 0.3\nretries = 0\n')
    res = subprocess.run([*BURSTWATCH, "check", "--config", str(path), "--json"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    doc = json.loads(res.stdout)
    assert res.returncode == doc["exit_code"] and res.returncode in (0, 1, 2)
    assert {v["check"] for v in doc["verdicts"]} >= {"driver", "mtu", "imds"}
    table = subprocess.run([*BURSTWATCH, "check", "--config", str(path)], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
    assert table.returncode == res.returncode and table.stdout.startswith("CHECK")
    bad = tmp_path / "bad.toml"
    bad.write_text("[probe]\npeers = 7\n")
    res = subprocess.run([*BURSTWATCH, "check", "--config", str(bad)], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert res.returncode == 2 and "probe.peers" in res.stderr
    assert sys.executable in BURSTWATCH
