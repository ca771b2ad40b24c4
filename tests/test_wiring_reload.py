"""Agent.apply and the reload handlers on an agent wiring.build made: what waits for a restart is named
against the config the agent started with, a live section without a handler is reported (never silently
dropped), and [responder] enabled turns the real listener on and off."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import pytest

from agent import config as configmod
from agent.config_loader import keep_restart_keys, restart_keys_changed
from agent.wiring import Agent, Paths, build
from tests.conftest import free_port, refused
from tests.support.daemon_config import lab_config, toml_text


def _build(tmp: Path, **sections: Any) -> Agent:
    return build(configmod.parse(toml_text(lab_config(tmp, **sections))), None, Paths())


@pytest.fixture()
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = _build(tmp_path)
    yield a
    for svc in reversed(a.services):
        svc.stop(1.0)


def _with(cfg: configmod.Config, section: str, **keys: Any) -> configmod.Config:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **keys)})


def test_restart_keys_are_named_against_the_started_config_and_keep_their_running_value(agent: Agent) -> None:
    started = agent.cfg
    moved = dataclasses.replace(_with(started, "credits", shaping_source="none", learn=False), state_dir="/elsewhere")
    assert agent.apply(moved) == ["state_dir", "credits.shaping_source"]
    assert agent.cfg.state_dir == started.state_dir and agent.cfg.credits.shaping_source == "auto"
    assert agent.credits is not None and agent.credits.cfg.learn is False      # the live key beside them applied
    assert agent.credits.cfg.shaping_source == "auto"                          # the handler got the running value
    assert agent.apply(moved) == ["state_dir", "credits.shaping_source"]         # still pending on the next reload
    assert agent.apply(started) == [] and agent.restart_pending == []           # set back: nothing waits


def test_a_section_marked_restart_names_each_changed_key() -> None:
    old = configmod.Config()
    new = _with(_with(old, "cloudwatch", period=10, namespace="X"), "fleet", prefix="p/")
    assert restart_keys_changed(old, new) == ["cloudwatch.namespace", "cloudwatch.period", "fleet.prefix"]
    kept = keep_restart_keys(old, new)
    assert kept.cloudwatch == old.cloudwatch and kept.fleet == old.fleet


def test_a_live_section_with_no_handler_is_reported_waiting(agent: Agent) -> None:
    del agent.sections["metrics"]
    assert agent.ethtool is not None
    before = agent.ethtool.include
    assert agent.apply(_with(agent.cfg, "metrics", ethtool_include=["rx_drops"])) == ["metrics.ethtool_include"]
    assert agent.ethtool.include == before


def test_probe_keys_wait_when_no_probe_service_runs(agent: Agent) -> None:
    assert agent.probes is None
    assert agent.apply(_with(agent.cfg, "probe", peers=["10.0.0.9"], interval=60.0)) == \
        ["probe.peers", "probe.interval"]


def test_the_responder_listener_follows_enabled_both_ways(tmp_path: Path) -> None:
    """Off at start; on: a listener; off: closed when apply returns; on again: a new responder that keeps
    the counters, the one responder in the services."""
    port = free_port()
    a = _build(tmp_path, responder={"enabled": False, "listen": f"127.0.0.1:{port}", "allow": ["127.0.0.0/8"]})
    try:
        on = _with(a.cfg, "responder", enabled=True)
        assert a.apply(on) == []
        assert a.responder is not None and not refused(port)
        first = a.responder
        assert a.apply(a.started) == [] and not a.responder_on       # off again
        assert refused(port) and not first.stats.listening
        assert a.apply(on) == [] and not refused(port)
        assert a.responder is not first and a.responder.stats is first.stats   # the counters carry on
        assert [s for s in a.services if s.name == "responder"] == [a.responder]
    finally:
        for svc in reversed(a.services):
            svc.stop(1.0)
