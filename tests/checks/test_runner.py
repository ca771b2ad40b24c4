"""The daemon's check service: rounds, the slow path MTU cadence, stop, and the real child-process executor."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agent import config as configmod
from agent.checks import CHECKS, is_slow, run_checks
from agent.checks import runner as runner_module
from agent.checks.runner import CheckRunner, subprocess_executor
from agent.models.checks import Verdict
from agent.readers.pmtu import PathMtu, measure_path_mtu
from tests.checks.helpers import fixture_context
from tests.conftest import require_root_tools
from tests.support.lab import Lab, run_in_ns

CFG = configmod.parse('[probe]\npeers = ["127.0.0.1"]\n[imds]\nenabled = false\n')


class Executor:
    """Rounds over a fixture, in process; the path MTU prober is the real one (to loopback), counted."""

    def __init__(self) -> None:
        self.probes = 0
        self.rounds: list[bool] = []

    def prober(self, peer: str) -> PathMtu:
        self.probes += 1
        return measure_path_mtu(peer, timeout=0.5)

    def __call__(self, include_slow: bool) -> list[Verdict]:
        self.rounds.append(include_slow)
        ctx = fixture_context("ena-2.12.3g-m6i.xlarge", cfg=CFG, path_mtu=self.prober)
        return run_checks(ctx, [n for n in CHECKS if include_slow or not is_slow(n)])


def test_rounds_and_slow_cadence() -> None:
    f = Executor()
    clock = iter(range(1000, 2000))
    runner = CheckRunner(f, wall=lambda: float(next(clock)))
    st = runner.run_once(include_slow=True)
    assert f.probes == 1 and st.runs == 1
    pm = st.by_check("path_mtu")[0]
    assert (pm.interface, pm.status, pm.evidence["path_mtu"]) == ("127.0.0.1", "ok", 65535)
    assert {v.check for v in st.verdicts} == {"driver", "driver_version", "queues", "rings", "mtu", "path_mtu",
                                              "imds", "fleet_access"}
    first_pm_time = st.last_run["path_mtu"]
    st = runner.run_once(include_slow=False)
    assert f.probes == 1, "path MTU is not re-measured in a quick round"
    assert st.by_check("path_mtu") == [pm] and st.last_run["path_mtu"] == first_pm_time
    assert st.last_run["driver"] > first_pm_time and st.runs == 2
    assert f.rounds == [True, False]


def test_thread_starts_runs_and_stops_quickly() -> None:
    f = Executor()
    runner = CheckRunner(f, interval=0.05, slow_interval=3600)
    runner.start()
    deadline = time.monotonic() + 10
    while runner.state.runs < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    t = time.monotonic()
    runner.stop(2.0)
    assert time.monotonic() - t < 1.0
    assert runner.state.runs >= 3 and f.probes == 1     # path MTU once in the first round only
    assert runner._thread is not None and not runner._thread.is_alive()


def test_a_failing_round_does_not_kill_the_thread() -> None:
    calls = []
    f = Executor()

    def executor(include_slow: bool) -> list[Verdict]:
        calls.append(include_slow)
        if len(calls) == 1:
            raise RuntimeError("`burstwatch check` exited 1: netlink went away")
        return f(include_slow)

    runner = CheckRunner(executor, interval=0.05)
    runner.start()
    deadline = time.monotonic() + 10
    while runner.state.runs < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    runner.stop(2.0)
    assert len(calls) >= 2 and runner.state.runs >= 1


@pytest.mark.netns
def test_the_daemon_executor_runs_burstwatch_check_in_a_child(tmp_path: Path) -> None:
    """The daemon's rounds: `burstwatch check --json` in a child process, here inside a namespace (the
    child inherits the calling thread's namespace), over real netlink and ethtool; no IMDS discovery,
    so the type's facts come from the config and the bundled catalogue."""
    require_root_tools("ip")
    config = tmp_path / "burstwatch.toml"
    config.write_text('interfaces = ["eth0"]\n[instance]\ntype = "m5.large"\n[imds]\nenabled = false\n'
                      '[probe]\npeers = ["10.99.0.2"]\n')
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, "10.99.0.1/24", "10.99.0.2/24", mtu=9001, names=("eth0", "eth0"))
        runner = CheckRunner(subprocess_executor(str(config)))
        st = run_in_ns(a, lambda: runner.run_once(include_slow=False), timeout=120)
        drv = st.by_check("driver")[0]
        assert drv.status == "fail" and drv.evidence["driver"] == "veth"
        assert drv.evidence["instance_type"] == "m5.large" and drv.evidence["ena_support"] == "required"
        assert "--ena-support" in drv.remedy            # an ENA-capable type running without ENA
        assert st.by_check("mtu")[0].evidence["mtu"] == 9001
        assert st.by_check("path_mtu") == [] and st.runs == 1     # a quick round leaves path MTU out
        st = run_in_ns(a, runner.run_once, timeout=120)
        assert st.by_check("path_mtu")[0].interface == "10.99.0.2" and st.runs == 2


_POPEN = subprocess.Popen     # the real one: the tests below patch subprocess.Popen (the module is shared)


class SleepingChild:
    """Popen stand-in for the round's child: `sleep 30`, so a stop always lands mid-round."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []

    def __call__(self, cmd: list[str], **kw: Any) -> subprocess.Popen:
        child = _POPEN(["sleep", "30"], **kw)
        self.children.append(child)
        return child


def _start_mid_round(monkeypatch: pytest.MonkeyPatch) -> tuple[CheckRunner, SleepingChild]:
    spawn = SleepingChild()
    monkeypatch.setattr(runner_module.subprocess, "Popen", spawn)
    runner = CheckRunner(subprocess_executor(None))
    runner.start()
    deadline = time.monotonic() + 5
    while not spawn.children and time.monotonic() < deadline:
        time.sleep(0.01)
    assert spawn.children, "the round's child did not start"
    return runner, spawn


def _assert_one_quiet_line(caplog: pytest.LogCaptureFixture, runner: CheckRunner) -> None:
    records = [r for r in caplog.records if r.name == runner_module.__name__]
    assert [(r.levelname, r.getMessage()) for r in records] == [
        ("INFO", records[0].getMessage())], "one INFO line, no traceback"
    assert "cancelled" in records[0].getMessage() and records[0].exc_info is None
    assert runner.state.runs == 0 and runner.state.verdicts == (), "a cancelled round counts as nothing"


def test_stop_cancels_the_rounds_child_quietly(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    runner, spawn = _start_mid_round(monkeypatch)
    t = time.monotonic()
    runner.stop(2.0)
    assert time.monotonic() - t < 1.5, "stop waited for the child"
    assert spawn.children[0].wait(5) == -signal.SIGTERM
    assert runner._thread is not None and not runner._thread.is_alive()
    _assert_one_quiet_line(caplog, runner)


def test_child_killed_by_systemd_just_before_the_stop_is_quiet(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """`systemctl stop` signals the whole cgroup: the child may die before the daemon's handler runs.
    Before the fix this logged 'check round failed' with a RuntimeError traceback ("exited -15")."""
    caplog.set_level(logging.DEBUG)
    runner, spawn = _start_mid_round(monkeypatch)
    spawn.children[0].send_signal(signal.SIGTERM)
    time.sleep(0.3)
    runner.stop(2.0)
    runner._thread.join(5) if runner._thread is not None else None
    _assert_one_quiet_line(caplog, runner)


def test_child_killed_without_a_stop_warns_once(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    runner, spawn = _start_mid_round(monkeypatch)
    spawn.children[0].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while not any(r.levelname == "WARNING" for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.05)
    runner.stop(2.0)
    msgs = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == runner_module.__name__]
    assert msgs[0] == ("WARNING", "check round cancelled: `burstwatch check` stopped by SIGTERM")
    assert all(r.exc_info is None for r in caplog.records) and runner.state.runs == 0
