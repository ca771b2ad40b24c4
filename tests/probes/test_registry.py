"""The S3 registry of agents (agent/probes/registry.py, agent/models/peer_registry.py) against moto over HTTP."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agent import aws
from agent.models.peer_registry import (
    AgentEntry,
    agent_key,
    cross_az_dollars_per_month,
    fresh,
    parse_agent_key,
    zone_prefix,
)
from agent.probes.registry import PeerRegistry

BUCKET = "fleet"


def iid(n: int) -> str:
    """Instance ids spread over the id space, as EC2's are (a random window starts among them)."""
    return f"i-{random.Random(n).getrandbits(68):017x}"


def registry(moto: str, n: int, zone: str = "use1-az1", **kw: Any) -> PeerRegistry:
    return PeerRegistry(lambda: aws.client("s3", "us-east-1", moto), BUCKET, "bw/", zone=zone,
                        instance_id=iid(n), host=f"10.0.{n // 250}.{n % 250 + 1}", port=5201,
                        instance_type="m5.large", region="us-east-1", agent_version="test",
                        rng=random.Random(n), **kw)


def test_keys_carry_what_discovery_needs() -> None:
    key = agent_key("bw/", "use1-az1", "i-0123456789abcdef0", "10.0.1.23", 5202, "m5.large")
    assert key == "bw/agents/az=use1-az1/i-0123456789abcdef0_10.0.1.23_5202_m5.large.json"
    assert parse_agent_key(key, "use1-az1", 5.0) == AgentEntry("i-0123456789abcdef0", "10.0.1.23", 5202,
                                                               "m5.large", "use1-az1", 5.0)
    assert zone_prefix("bw", "us-east-1a") == "bw/agents/az=us-east-1a/"


@pytest.mark.parametrize("name", ["x.json", "a_b_c.json", "i-1_10.0.0.1_99999_t.json", "i-1_host_5201_t.json",
                                  "i-1_10.0.0.1_5201_t.txt", "i-1_10.0.0.1_5201_t_extra.json"])
def test_foreign_keys_are_ignored(name: str) -> None:
    assert parse_agent_key(f"bw/agents/az=z/{name}", "z", 0.0) is None


def test_stale_entries_are_gone_instances() -> None:
    e = AgentEntry("i-1", "10.0.0.1", 5201, None, "z", 1000.0)
    assert fresh(e, 1000.0 + 3600) and not fresh(e, 1000.0 + 14 * 3600)


def test_cross_az_costs_two_cents_per_gb_crossing() -> None:
    assert cross_az_dollars_per_month(0.0, 1e12) == 0
    assert cross_az_dollars_per_month(1.0, 1e9) == pytest.approx(730 * 0.02)


def test_agents_find_their_zone_and_only_it_with_one_list(moto: str) -> None:
    aws.client("s3", "us-east-1", moto).create_bucket(Bucket=BUCKET)
    regs = [registry(moto, n, zone=("use1-az1", "use1-az2")[n % 2]) for n in range(6)]
    for r in regs:
        r.register(r.wall())
    me = regs[0]
    found = me.discover()
    assert sorted(e.instance_id for e in found) == sorted([iid(2), iid(4)])
    assert all(e.zone == "use1-az1" and e.port == 5201 and e.instance_type == "m5.large" for e in found)
    assert me.requests == {"list": 1, "put": 1}          # a partition that fits: one LIST per discovery
    me.discover()
    assert me.requests == {"list": 2, "put": 1}          # the heartbeat waits REGISTER_INTERVAL


def test_a_big_zone_is_sampled_by_a_bounded_window(moto: str) -> None:
    aws.client("s3", "us-east-1", moto).create_bucket(Bucket=BUCKET)
    for n in range(1, 31):
        registry(moto, n).register(0.0 + 1e9)
    me = registry(moto, 0, window=10)
    seen: set[str] = set()
    for _ in range(8):
        found = me.discover()
        assert 1 <= len(found) <= 10
        seen |= {e.instance_id for e in found}
    assert len(seen) > 10                                 # different windows each time
    # The first listing finds the partition too big; then one LIST per discovery, two when it wraps.
    assert me.requests["list"] <= 1 + 8 * 2


def test_cross_az_share_lists_one_other_zone(moto: str) -> None:
    aws.client("s3", "us-east-1", moto).create_bucket(Bucket=BUCKET)
    for n in range(1, 5):
        registry(moto, n, zone=("use1-az1", "use1-az2")[n % 2]).register(1e9)
    me = registry(moto, 0, cross_az_share=0.1)
    zones = {e.zone for e in me.discover()}
    assert zones == {"use1-az1", "use1-az2"}
