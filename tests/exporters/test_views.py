"""Every Prometheus view declares what it exports: describe() lets the registry reject duplicate names."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent import config
from agent.checks import CHECKS, is_slow, run_checks
from agent.daemon import Daemon
from agent.exporters import View
from agent.readers.ethtool import FixtureEthtoolReader
from tests.checks.helpers import fixture_context
from tests.conftest import free_port

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ethtool"


def _daemon(tmp_path: Path) -> Daemon:
    cfg = config.parse(f'''
interfaces = ["lo"]
state_dir = "{tmp_path}"
[metrics]
listen = "127.0.0.1:{free_port()}"
[imds]
enabled = false
[instance]
type = "m5.large"
[probe]
peers = ["127.0.0.1:1"]
''')
    d = Daemon(cfg, None)
    a = d.setup()
    assert a.sampler is not None and a.ethtool is not None
    # lo has no ethtool statistics: read a captured ENA device's in its place.
    a.ethtool.reader = FixtureEthtoolReader({"lo": FIXTURES / "ena-2.12.3g-c6in.32xlarge-express"})
    a.sampler.sample()
    a.sampler.sample()
    assert a.checks is not None
    # One round from a captured ENA fixture (the daemon's own rounds run `burstwatch check` in a child).
    a.checks.executor = lambda slow: run_checks(fixture_context("ena-2.12.3g-m6i.xlarge"),
                                                [n for n in CHECKS if slow or not is_slow(n)])
    a.checks.run_once(include_slow=False)
    return d


def test_views_yield_only_what_they_declare(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    assert d.agent is not None
    try:
        for view in d.agent.views:
            assert isinstance(view, View), f"{type(view).__name__} is not an agent.exporters.View"
            declared = {m.name for m in view.describe()}
            collected = {m.name for m in view.collect()}
            assert collected, f"{type(view).__name__} collected nothing on a running daemon"
            assert collected <= declared, f"{type(view).__name__} yields undeclared {collected - declared}"
    finally:
        if d.agent.responder is not None:
            d.agent.responder.stop(1.0)


def test_the_registry_rejects_a_second_view_with_the_same_names() -> None:
    class A(View):
        FAMILIES = (("burstwatch_example_bytes", "gauge"),)

        def collect(self):  # type: ignore[no-untyped-def]
            return []

    reg = CollectorRegistry(auto_describe=False)
    reg.register(A())
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        reg.register(A())
