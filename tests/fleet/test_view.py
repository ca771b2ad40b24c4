"""burstwatch_fleet_* (agent/exporters/fleet.py): what FleetView renders, and that docs/metrics.md names it."""

from __future__ import annotations

from typing import Optional

from prometheus_client import CollectorRegistry, generate_latest

from agent.exporters.fleet import FleetView
from agent.fleet.service import FleetStats
from agent.models.fleet import Consensus
from tests.support.metrics_doc import undocumented


def stats(consensus: Optional[Consensus] = None) -> FleetStats:
    return FleetStats(published=2, publish_failures=1, backlog=1, dropped=0, objects_read=7,
                      rejected={"garbage": 4, "foreign": 2}, refresh_errors={"network": 3}, refreshes=5,
                      last_refresh_timestamp=1.7e9, consensus=consensus, requests={"list": 6, "get": 7, "put": 3})


def registry(st: FleetStats) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(FleetView(lambda: st))
    return reg


def test_counters_and_the_consensus() -> None:
    reg = registry(stats(Consensus(3.4e11, 3, 1, 0.06, 1.7e9)))
    v = reg.get_sample_value
    assert v("burstwatch_fleet_published_total") == 2
    assert v("burstwatch_fleet_publish_failures_total") == 1
    assert v("burstwatch_fleet_backlog_objects") == 1
    assert v("burstwatch_fleet_objects_read_total") == 7
    assert v("burstwatch_fleet_objects_rejected_total", {"reason": "garbage"}) == 4
    assert v("burstwatch_fleet_objects_rejected_total", {"reason": "foreign"}) == 2
    assert v("burstwatch_fleet_refresh_errors_total", {"kind": "network"}) == 3
    assert v("burstwatch_fleet_requests_total", {"action": "get"}) == 7
    assert v("burstwatch_fleet_refreshes_total") == 5
    assert v("burstwatch_fleet_last_refresh_timestamp_seconds") == 1.7e9
    assert v("burstwatch_fleet_consensus_instances") == 3
    assert v("burstwatch_fleet_consensus_bucket_bytes") == 3.4e11
    assert v("burstwatch_fleet_consensus_outliers") == 1
    assert v("burstwatch_fleet_consensus_spread") == 0.06


def test_no_consensus_is_zero_instances_and_no_bucket() -> None:
    reg = registry(stats())
    assert reg.get_sample_value("burstwatch_fleet_consensus_instances") == 0
    assert reg.get_sample_value("burstwatch_fleet_consensus_bucket_bytes") is None
    # Both reasons are exported from the start, so increase() sees the first rejection.
    empty = registry(FleetStats(0, 0, 0, 0, 0, {}, {}, 0, 0.0, None, {}))
    assert empty.get_sample_value("burstwatch_fleet_objects_rejected_total", {"reason": "garbage"}) == 0


def test_declares_what_it_yields_and_docs_describe_it() -> None:
    view = FleetView(lambda: stats(Consensus(3.4e11, 3, 1, 0.06, 1.7e9)))
    declared = {m.name for m in view.describe()}
    assert {m.name for m in view.collect()} == declared
    assert undocumented(generate_latest(registry(stats(Consensus(1.0, 3, 0, 0.0, 0.0)))).decode()) == []
