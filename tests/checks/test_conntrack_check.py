"""The conntrack check: drops for the connection-tracking and link-local allowances, the table's owners, remedies."""

from __future__ import annotations

import pytest

from agent.checks import conntrack as check
from agent.checks import run_checks
from agent.checks.context import CounterSample
from agent.readers.flows import Flow
from agent.readers.links import RxCounters
from tests.checks.helpers import fixture_context

FLOWS = ([Flow("tcp", "10.0.0.1", 40000 + i, "10.0.0.9", 443, "ESTABLISHED") for i in range(5)]
         + [Flow("udp", "10.0.0.1", 50000 + i, "10.0.0.7", 53, "ESTABLISHED") for i in range(2)]
         + [Flow("tcp", "10.0.0.1", 8080, "0.0.0.0", 0, "LISTEN"),
            Flow("tcp", "10.0.0.1", 8080, "10.0.0.3", 33000, "ESTABLISHED")])


@pytest.fixture(autouse=True)
def _flows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "host_flows", lambda: list(FLOWS))


def _window(stat: str, before: int, after: int) -> dict:
    return {"before": {"eth0": CounterSample(0.0, RxCounters(), {stat: before})},
            "after": {"eth0": CounterSample(2.0, RxCounters(), {stat: after})}}


def test_quiet_table_is_ok_and_names_its_owners() -> None:
    vs = {v.check: v for v in run_checks(fixture_context("ena-2.12.3g-m6i.xlarge"), ["conntrack"])}
    v = vs["conntrack"]
    assert v.status == "ok", v.summary
    assert "tracked connections still available" in v.summary
    assert "busiest: tcp out port 443: 5 flows, peers 10.0.0.9 (5); udp out port 53: 2 flows" in v.summary
    assert "tcp in port 8080: 1 flows" in v.summary
    assert [o["port"] for o in v.evidence["owners"]] == [443, 53, 8080]
    assert vs["linklocal"].status == "ok"


def test_rising_drops_fail_with_aws_remedies() -> None:
    ctx = fixture_context("ena-2.12.3g-m6i.xlarge", **_window("conntrack_allowance_exceeded", 10, 50))
    v = next(v for v in run_checks(ctx, ["conntrack"]) if v.check == "conntrack")
    assert v.status == "fail" and "being dropped now (40 packets" in v.summary
    for words in ("0.0.0.0/0", "ConnectionTrackingSpecification", "NLB, NAT gateway, GWLB"):
        assert words in v.remedy


def test_link_local_drops_name_dns_and_a_local_cache() -> None:
    # the in-tree 6.1 fixture counted 12 link-local drops since the driver loaded
    v = next(v for v in run_checks(fixture_context("ena-intree-6.1-m5.large"), ["conntrack"]) if v.check == "linklocal")
    assert v.status == "warn" and "DNS" in v.summary and "since the driver loaded (12)" in v.summary
    assert "local DNS cache" in v.remedy
    ctx = fixture_context("ena-intree-6.1-m5.large", **_window("linklocal_allowance_exceeded", 12, 900))
    v = next(v for v in run_checks(ctx, ["conntrack"]) if v.check == "linklocal")
    assert v.status == "fail" and "now (888 packets" in v.summary


def test_no_level_and_non_ena_interfaces() -> None:
    v = next(v for v in run_checks(fixture_context("ena-intree-6.1-m5.large"), ["conntrack"]) if v.check == "conntrack")
    assert v.status == "ok" and "no conntrack_allowance_available" in v.summary
    assert [v.status for v in run_checks(fixture_context("veth-lab"), ["conntrack"])] == ["skip"]
    assert [v.status for v in run_checks(fixture_context("ena-1.5.0g-r4.large"), ["conntrack"])] == ["skip"]
