"""The daemon's check service: rounds, each check's cadence, stop, and the real child-process executor."""

from __future__ import annotations

import logging
import shutil
import signal
import time
from pathlib import Path
from typing import Sequence

import pytest

from agent import config as configmod
from agent.checks import CHECKS, DEFAULT_INTERVAL, interval, run_timed
from agent.checks import runner as runner_module
from agent.checks.runner import CheckRound, CheckRunner, subprocess_executor
from agent.isolate import Spawned
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
        self.rounds: list[tuple[str, ...]] = []

    def prober(self, peer: str) -> PathMtu:
        self.probes += 1
        return measure_path_mtu(peer, timeout=0.5)

    def __call__(self, names: Sequence[str]) -> CheckRound:
        self.rounds.append(tuple(names))
        ctx = fixture_context("ena-2.12.3g-m6i.xlarge", cfg=CFG, path_mtu=self.prober)
        verdicts, durations = run_timed(ctx, [n for n in names if n not in LIVE])
        return CheckRound(verdicts, {**durations, **{n: 0.0 for n in names if n in LIVE}})


# Checks that read this host's live state even on a fixture (conntrack: the host's flows, up to ~1 s on a
# busy machine); their own tests cover them, and here they would only make the rounds slow.
LIVE = {"conntrack"}


QUICK = tuple(n for n in CHECKS if interval(n) == DEFAULT_INTERVAL)


def lab_intervals(scale: float) -> dict[str, float]:
    """The shipped cadences scaled down: 300 s -> 300 * scale (path MTU and fleet_access keep their ratios)."""
    return {n: interval(n) * scale for n in CHECKS}


def test_rounds_and_slow_cadence() -> None:
    f = Executor()
    clock = iter(range(1000, 2000))
    runner = CheckRunner(f, wall=lambda: float(next(clock)))
    st = runner.run_once(include_slow=True)
    assert f.probes == 1 and st.runs == 1
    pm = st.by_check("path_mtu")[0]
    assert (pm.interface, pm.status, pm.evidence["path_mtu"]) == ("127.0.0.1", "ok", 65535)
    assert {v.check for v in st.verdicts} == set(CHECKS) - LIVE
    first_pm_time = st.last_run["path_mtu"]
    st = runner.run_once(include_slow=False)
    assert f.probes == 1, "path MTU is not re-measured in a quick round"
    assert st.by_check("path_mtu") == [pm] and st.last_run["path_mtu"] == first_pm_time
    assert st.last_run["driver"] > first_pm_time and st.runs == 2
    assert f.rounds == [tuple(CHECKS), QUICK]
    assert set(st.durations) == set(CHECKS) and all(d >= 0 for d in st.durations.values())


def test_each_check_runs_at_its_own_cadence() -> None:
    """Issue 20: quick checks every 300 s, path MTU every 3600 s, fleet_access daily (86400 s), over two
    simulated days on the runner's own schedule (its loop wakes at next_due()): path MTU rides along with
    every 12th quick round and fleet_access with every 288th, never in a child of their own, even when
    rounds start late."""
    assert (interval("driver"), interval("path_mtu"), interval("fleet_access")) == (300.0, 3600.0, 86400.0)
    now = [0.0]
    rounds: list[tuple[str, ...]] = []

    def executor(names: Sequence[str]) -> CheckRound:
        rounds.append(tuple(names))
        return CheckRound([], {n: 0.002 for n in names})

    runner = CheckRunner(executor, clock=lambda: now[0])
    late = 0
    for _ in range(2 * 288 + 1):
        runner.run_round(runner.due(now[0]))
        late = (late + 7) % 23                # the thread wakes up to 22 s late, as on a loaded host
        now[0] = runner.next_due() + late
    assert rounds[0] == tuple(CHECKS) and len(rounds) == 2 * 288 + 1
    assert all(set(QUICK) <= set(r) for r in rounds), "the quick checks are in every round"
    assert [i for i, r in enumerate(rounds) if "path_mtu" in r] == list(range(0, len(rounds), 12))
    assert [i for i, r in enumerate(rounds) if "fleet_access" in r] == [0, 288, 576]
    assert runner.state.durations["fleet_access"] == 0.002


def test_the_thread_runs_each_check_at_its_scaled_cadence() -> None:
    """The same on the real thread and clock, scaled down 1500 times (0.2 s, 2.4 s, 57.6 s)."""
    f = Executor()
    runner = CheckRunner(f, intervals=lab_intervals(1 / 1500))
    runner.start()
    deadline = time.monotonic() + 20
    while sum("path_mtu" in r for r in f.rounds) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    runner.stop(2.0)
    rounds = list(f.rounds)
    assert rounds[0] == tuple(CHECKS) and all(set(QUICK) <= set(r) for r in rounds)
    assert sum("path_mtu" in r for r in rounds) >= 2 and f.probes == sum("path_mtu" in r for r in rounds)
    assert [i for i, r in enumerate(rounds) if "fleet_access" in r] == [0]


def test_thread_starts_runs_and_stops_quickly() -> None:
    f = Executor()
    runner = CheckRunner(f, intervals={n: 0.05 if n in QUICK else 3600.0 for n in CHECKS})
    runner.start()
    deadline = time.monotonic() + 10
    while runner.state.runs < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    t = time.monotonic()
    runner.stop(2.0)
    # stop() wakes the thread out of its 0.05-s wait: milliseconds. 1 s is the margin for a loaded machine and
    # half of stop()'s 2-s timeout, so a stop that only timed out still fails.
    assert time.monotonic() - t < 1.0
    assert runner.state.runs >= 3 and f.probes == 1     # path MTU once in the first round only
    assert runner._thread is not None and not runner._thread.is_alive()


def test_a_failing_round_does_not_kill_the_thread() -> None:
    calls = []
    f = Executor()

    def executor(names: Sequence[str]) -> list[Verdict]:
        calls.append(tuple(names))
        if len(calls) == 1:
            raise RuntimeError("`burstwatch check` exited 1: netlink went away")
        return f(names).verdicts

    runner = CheckRunner(executor, intervals={n: 0.05 if n in QUICK else 3600.0 for n in CHECKS})
    runner.start()
    deadline = time.monotonic() + 10
    while runner.state.runs < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    runner.stop(2.0)
    assert len(calls) >= 2 and runner.state.runs >= 1
    assert calls[1] == tuple(CHECKS), "the failed round's checks are retried, the slow ones included"


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
        # Issue 23: the child times each check and the runner keeps it (0 before: the child's time was lost).
        assert set(st.durations) == set(CHECKS) - {"path_mtu", "fleet_access"}
        assert all(0 < d < 30 for d in st.durations.values()), st.durations
        st = run_in_ns(a, runner.run_once, timeout=120)
        assert st.by_check("path_mtu")[0].interface == "10.99.0.2" and st.runs == 2
        assert st.durations["path_mtu"] > 0


class SleepingChild:
    """Stands in for the round's child: `sleep 30` spawned the same way, so a stop always lands mid-round."""

    def __init__(self) -> None:
        self.children: list[Spawned] = []

    def __call__(self, cmd: list[str]) -> Spawned:
        child = Spawned([shutil.which("sleep") or "/bin/sleep", "30"])
        self.children.append(child)
        return child


def _start_mid_round(monkeypatch: pytest.MonkeyPatch) -> tuple[CheckRunner, SleepingChild]:
    spawn = SleepingChild()
    monkeypatch.setattr(runner_module, "Spawned", spawn)
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
    assert spawn.children[0].wait() == -signal.SIGTERM
    assert runner._thread is not None and not runner._thread.is_alive()
    _assert_one_quiet_line(caplog, runner)


def test_child_killed_by_systemd_just_before_the_stop_is_quiet(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """`systemctl stop` signals the whole cgroup: the child may die before the daemon's handler runs.
    Before the fix this logged 'check round failed' with a RuntimeError traceback ("exited -15")."""
    caplog.set_level(logging.DEBUG)
    runner, spawn = _start_mid_round(monkeypatch)
    spawn.children[0].signal(signal.SIGTERM)
    time.sleep(0.3)
    runner.stop(2.0)
    runner._thread.join(5) if runner._thread is not None else None
    _assert_one_quiet_line(caplog, runner)


def test_child_killed_without_a_stop_warns_once(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    runner, spawn = _start_mid_round(monkeypatch)
    spawn.children[0].signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while not any(r.levelname == "WARNING" for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.05)
    runner.stop(2.0)
    msgs = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == runner_module.__name__]
    assert msgs[0] == ("WARNING", "check round cancelled: `burstwatch check` stopped by SIGTERM")
    assert all(r.exc_info is None for r in caplog.records) and runner.state.runs == 0
