"""The daemon's check service: rounds, the slow path MTU cadence, counters carried between rounds, stop."""

from __future__ import annotations

import time
from typing import Optional

import pytest

from agent import config as configmod
from agent.checks.context import CheckContext, CounterSample
from agent.checks.runner import CheckRunner, daemon_context_factory
from agent.readers.ethtool import IoctlEthtoolReader
from agent.readers.links import RxCounters
from agent.readers.pmtu import PathMtu, measure_path_mtu
from tests.checks.helpers import fixture_context
from tests.conftest import require_root_tools
from tests.support.lab import Lab, run_in_ns

CFG = configmod.parse('[probe]\npeers = ["127.0.0.1"]\n[imds]\nenabled = false\n')


class Factory:
    """Contexts over a fixture; the path MTU prober is the real one (to loopback), counted."""

    def __init__(self) -> None:
        self.probes = 0
        self.befores: list[Optional[dict[str, CounterSample]]] = []
        self.round = 0

    def prober(self, peer: str) -> PathMtu:
        self.probes += 1
        return measure_path_mtu(peer, timeout=0.5)

    def __call__(self, before: Optional[dict[str, CounterSample]]) -> CheckContext:
        self.befores.append(before)
        self.round += 1
        after = {"eth0": CounterSample(float(self.round), RxCounters(100 * self.round, 7 * self.round), {})}
        return fixture_context("ena-2.12.3g-m6i.xlarge", cfg=CFG, before=before, after=after,
                               path_mtu=self.prober)


def test_rounds_and_slow_cadence() -> None:
    f = Factory()
    clock = iter(range(1000, 2000))
    runner = CheckRunner(f, wall=lambda: float(next(clock)))
    st = runner.run_once(include_slow=True)
    assert f.probes == 1 and st.runs == 1
    pm = st.by_check("path_mtu")[0]
    assert (pm.interface, pm.status, pm.evidence["path_mtu"]) == ("127.0.0.1", "ok", 65535)
    assert {v.check for v in st.verdicts} == {"driver", "driver_version", "queues", "rings", "mtu", "path_mtu",
                                              "imds"}
    first_pm_time = st.last_run["path_mtu"]
    st = runner.run_once(include_slow=False)
    assert f.probes == 1, "path MTU is not re-measured in a quick round"
    assert st.by_check("path_mtu") == [pm] and st.last_run["path_mtu"] == first_pm_time
    assert st.last_run["driver"] > first_pm_time and st.runs == 2
    # the second round compares against the first round's counters: drops rose by 7 -> the rings warning
    assert f.befores[0] is None and f.befores[1] is not None and f.befores[1]["eth0"].rx.rx_dropped == 7
    rings = st.by_check("rings")[0]
    assert rings.status == "warn" and rings.evidence["rx_lost"] == 7


def test_thread_starts_runs_and_stops_quickly() -> None:
    f = Factory()
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


def test_a_failing_context_does_not_kill_the_thread() -> None:
    calls = []

    def factory(before: Optional[dict[str, CounterSample]]) -> CheckContext:
        calls.append(before)
        if len(calls) == 1:
            raise OSError("netlink went away")
        return fixture_context("ena-2.12.3g-m6i.xlarge", cfg=CFG, path_mtu=lambda p: measure_path_mtu(p))

    runner = CheckRunner(factory, interval=0.05)
    runner.start()
    deadline = time.monotonic() + 10
    while runner.state.runs < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    runner.stop(2.0)
    assert len(calls) >= 2 and runner.state.runs >= 1


@pytest.mark.netns
def test_daemon_factory_over_a_real_namespace() -> None:
    """The daemon's contexts: real netlink and ethtool in a namespace, one shared reader, no IMDS
    discovery per round (the type's facts come from the config and the bundled catalogue)."""
    require_root_tools("ip")
    cfg = configmod.parse('interfaces = ["eth0"]\n[instance]\ntype = "m5.large"\n[imds]\nenabled = false\n')
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, "10.99.0.1/24", "10.99.0.2/24", mtu=9001, names=("eth0", "eth0"))
        reader = run_in_ns(a, IoctlEthtoolReader)
        runner = CheckRunner(daemon_context_factory(lambda: cfg, lambda: ["eth0"], ethtool=reader))
        t = time.monotonic()
        st = run_in_ns(a, runner.run_once)
        assert time.monotonic() - t >= 1.0            # the first round reads counters 1 s apart
        drv = st.by_check("driver")[0]
        assert drv.status == "fail" and drv.evidence["driver"] == "veth"
        assert drv.evidence["instance_type"] == "m5.large" and drv.evidence["ena_support"] == "required"
        assert "--ena-support" in drv.remedy            # an ENA-capable type running without ENA
        assert st.by_check("mtu")[0].evidence["mtu"] == 9001
        t = time.monotonic()
        st = run_in_ns(a, lambda: runner.run_once(include_slow=False))
        assert time.monotonic() - t < 1.0 and st.runs == 2   # later rounds compare with the previous one
        reader.close()
