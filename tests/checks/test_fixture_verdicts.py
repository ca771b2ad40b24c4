"""Every check on every fixture: the verdicts an ENA expert would give, and the edge cases around them."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from agent import config as configmod
from agent.checks import CHECKS, run_checks
from agent.checks.context import CounterSample, InstanceFacts
from agent.checks.driver_version import parse_ena_version
from agent.models.checks import overall_exit_code
from agent.readers.ethtool import FixtureEthtoolReader
from agent.readers.links import RouteInfo, RxCounters
from tests.checks.helpers import FACTS, FIXTURES, fixture_context

PER_INTERFACE = ["driver", "driver_version", "queues", "rings", "mtu"]

# fixture -> check -> (status, words the summary must contain, words the remedy must contain)
EXPECTED = {
    "ena-1.5.0g-r4.large": {
        "driver": ("ok", ["ena 1.5.0g", "ENA) is on"], []),
        # 2018 driver: no allowance counters (2.2.10), and too old for ENAv3 devices (2.2.9)
        "driver_version": ("fail", ["out-of-tree", "no allowance counters", ">= 2.2.10", "ENAv3"],
                           ["modinfo ena", "amzn-drivers"]),
        "queues": ("ok", ["2 of 2"], []),                    # separate RX/TX channels before 2.2.0
        "rings": ("ok", ["rx ring 1024 (max 16384)", "trend unknown"], []),
        "mtu": ("ok", ["MTU 9001"], []),
    },
    "ena-intree-6.1-m5.large": {
        "driver": ("ok", ["ena 6.1.0-18-cloud-amd64"], []),
        # judged from the statistics: the in-tree driver of 6.1 has all five allowance counters
        "driver_version": ("ok", ["in-tree, kernel release as version", "allowance counters (5/5)"], []),
        "queues": ("ok", ["2 of 2", "min(2 vCPUs, 2 default queues of m5.large)"], []),
        "rings": ("ok", ["tx ring 1024 (max 1024)"], []),
        "mtu": ("ok", ["MTU 9001 (VPC jumbo frames)"], []),
    },
    "ena-2.12.3g-m6i.xlarge": {
        "driver": ("ok", ["ena 2.12.3g"], []),
        "driver_version": ("ok", ["out-of-tree", "allowance counters (5/5)", "conntrack_allowance_available",
                                  "ENA Express off"], []),
        "queues": ("ok", ["4 of 4"], []),
        "rings": ("ok", [], []),
        "mtu": ("ok", ["MTU 9001"], []),
    },
    "ena-2.12.3g-c6in.32xlarge-express": {
        "driver": ("ok", ["ena 2.12.3g"], []),
        "driver_version": ("ok", ["ENA Express on, UDP"], []),
        "queues": ("warn", ["8 of 32 queues", "128 vCPUs", "32 default queues"], ["sudo ethtool -L eth0 combined 32"]),
        "rings": ("ok", ["tx ring 512 (max 512)"], []),       # large LLQ: 512 is the maximum, not a problem
        "mtu": ("warn", ["MTU 9001 with ENA Express on", "8900"], ["sudo ip link set dev eth0 mtu 8900"]),
    },
    "vif-xen-m4.large": {
        "driver": ("fail", ["vif (Xen netfront)", "enhanced networking is off"],
                   ["--sriov-net-support simple", "current-generation"]),
        "driver_version": ("skip", ["applies to ENA", "vif"], []),
        "queues": ("skip", ["applies to ENA"], []),
        "rings": ("skip", ["no ring settings"], []),
        "mtu": ("skip", ["MTU 9001", "vif"], []),
    },
    "ixgbevf-4.1.0-k-c4.large": {
        "driver": ("warn", ["ixgbevf", "82599", "current-generation types use ENA"], ["current-generation"]),
        "driver_version": ("skip", ["applies to ENA"], []),
        "queues": ("skip", ["applies to ENA"], []),
        "rings": ("ok", ["rx ring 1024 (max 4096)"], []),
        "mtu": ("ok", ["MTU 9001"], []),
    },
    "veth-lab": {
        "driver": ("fail", ["driver veth is not ENA", "IMDS gave no instance identity", "allowance counters"],
                   ["ethtool -i eth0"]),
        "driver_version": ("skip", ["veth"], []),
        "queues": ("skip", ["veth"], []),
        "rings": ("skip", ["no ring settings"], []),
        "mtu": ("skip", ["veth"], []),
    },
}


def test_every_fixture_has_expectations() -> None:
    assert set(EXPECTED) == {p.name for p in FIXTURES.iterdir() if p.is_dir()} == set(FACTS)


@pytest.mark.parametrize("fixture, check", [(f, c) for f in sorted(EXPECTED) for c in PER_INTERFACE])
def test_verdict(fixture: str, check: str) -> None:
    status, words, fix = EXPECTED[fixture][check]
    verdicts = run_checks(fixture_context(fixture), [check])
    assert len(verdicts) == 1
    v = verdicts[0]
    assert (v.check, v.interface, v.status) == (check, "eth0", status), v.summary
    for w in words:
        assert w in v.summary, f"{w!r} not in {v.summary!r}"
    for w in fix:
        assert w in v.remedy, f"{w!r} not in {v.remedy!r}"
    if status in ("warn", "fail"):
        assert v.remedy, "every warning and failure says what to do"


@pytest.mark.parametrize("fixture, code", [
    ("ena-1.5.0g-r4.large", 2), ("ena-intree-6.1-m5.large", 0), ("ena-2.12.3g-m6i.xlarge", 0),
    ("ena-2.12.3g-c6in.32xlarge-express", 1), ("vif-xen-m4.large", 2), ("ixgbevf-4.1.0-k-c4.large", 1),
    ("veth-lab", 2),
])
def test_exit_code_per_fixture(fixture: str, code: int) -> None:
    assert overall_exit_code(run_checks(fixture_context(fixture), PER_INTERFACE)) == code


def test_ena_express_at_8900_is_ok() -> None:
    v = run_checks(fixture_context("ena-2.12.3g-c6in.32xlarge-express", mtu=8900), ["mtu"])[0]
    assert v.status == "ok" and "ENA Express" in v.summary


@pytest.mark.parametrize("mtu, status, words", [
    (1500, "warn", "jumbo frames are off"), (1400, "warn", "below Ethernet"), (9216, "warn", "above the VPC"),
    (8500, "ok", "between 1500 and 9001"), (9001, "ok", "VPC jumbo"),
])
def test_mtu_values(mtu: int, status: str, words: str) -> None:
    v = run_checks(fixture_context("ena-2.12.3g-m6i.xlarge", mtu=mtu), ["mtu"])[0]
    assert v.status == status and words in v.summary
    if status == "warn":
        assert "sudo ip link set dev eth0 mtu" in v.remedy


def test_mtu_routes() -> None:
    igw = RouteInfo(4, "default", "10.0.0.1", "eth0", 1500, False)
    v = run_checks(fixture_context("ena-2.12.3g-m6i.xlarge", routes=(igw,)), ["mtu"])[0]
    assert v.status == "ok" and "internet gateway" in v.summary and v.evidence["routes"][0]["mtu"] == 1500
    tiny = RouteInfo(4, "10.8.0.0/16", "10.0.0.9", "eth0", 1400, True)
    v = run_checks(fixture_context("ena-2.12.3g-m6i.xlarge", routes=(igw, tiny)), ["mtu"])[0]
    assert v.status == "warn" and "route 10.8.0.0/16 has MTU 1400" in v.summary
    assert "ip route change 10.8.0.0/16 via 10.0.0.9 dev eth0 mtu 1500" in v.remedy


def _samples(lost_before: int, lost_after: int, stats_before: dict, stats_after: dict) -> tuple[dict, dict]:
    b = {"eth0": CounterSample(100.0, RxCounters(1000, lost_before, 0, 0, 0), stats_before)}
    a = {"eth0": CounterSample(160.0, RxCounters(5000, lost_after, 0, 0, 0), stats_after)}
    return b, a


def test_rings_rising_drops_suggest_a_bigger_ring() -> None:
    b, a = _samples(10, 250, {}, {})
    v = run_checks(fixture_context("ena-2.12.3g-m6i.xlarge", before=b, after=a), ["rings"])[0]
    assert v.status == "warn" and "+240 in 60s" in v.summary and v.evidence["rx_lost"] == 240
    assert v.remedy == "sudo ethtool -G eth0 rx 4096"


def test_rings_rising_drops_at_the_maximum_mean_cpu_starvation() -> None:
    ctx = fixture_context("ena-2.12.3g-m6i.xlarge", before=_samples(0, 5, {}, {})[0],
                          after=_samples(0, 5, {}, {})[1])
    ctx._memo[("rings", "eth0")] = ctx.ethtool.rings("eth0")._replace(rx=16384)  # type: ignore[union-attr]
    v = run_checks(ctx, ["rings"])[0]
    assert v.status == "warn" and "starved" in v.summary and "mpstat" in v.remedy


def test_rings_queue_stops_with_allowance_exceeded_mean_the_instance_limit() -> None:
    b, a = _samples(0, 0, {"queue_0_tx_queue_stop": 5, "bw_out_allowance_exceeded": 100},
                    {"queue_0_tx_queue_stop": 90, "bw_out_allowance_exceeded": 4100})
    v = run_checks(fixture_context("ena-2.12.3g-m6i.xlarge", before=b, after=a), ["rings"])[0]
    assert v.status == "warn" and "instance's limit" in v.summary and "bw_out" in v.summary


def test_rings_quiet() -> None:
    b, a = _samples(7, 7, {"queue_0_tx_queue_stop": 5}, {"queue_0_tx_queue_stop": 5})
    v = run_checks(fixture_context("ena-2.12.3g-m6i.xlarge", before=b, after=a), ["rings"])[0]
    assert v.status == "ok" and "no receive drops in the last 60s" in v.summary


def test_queues_without_catalogue_use_the_driver_maximum() -> None:
    facts = InstanceFacts(vcpus=128)
    v = run_checks(fixture_context("ena-2.12.3g-c6in.32xlarge-express", facts=facts), ["queues"])[0]
    assert v.status == "warn" and "8 of 32" in v.summary and "driver maximum 32" in v.summary
    v = run_checks(fixture_context("ena-2.12.3g-c6in.32xlarge-express", facts=InstanceFacts()), ["queues"])[0]
    assert v.status == "warn" and v.remedy == "sudo ethtool -L eth0 combined 32"


def test_queues_on_a_small_instance_follow_vcpus() -> None:
    facts = InstanceFacts("c6in.xlarge", vcpus=4, ena_support="required", default_queues=4)
    ctx = fixture_context("ena-2.12.3g-c6in.32xlarge-express", facts=facts)
    ctx._memo[("channels", "eth0")] = ctx.ethtool.channels("eth0")._replace(combined=4, max_combined=4)  # type: ignore[union-attr]
    v = run_checks(ctx, ["queues"])[0]
    assert v.status == "ok" and "4 of 4" in v.summary


def test_ixgbevf_on_an_ena_capable_type_says_enable_ena() -> None:
    facts = dataclasses.replace(FACTS["ixgbevf-4.1.0-k-c4.large"], instance_type="m4.16xlarge",
                                ena_support="supported")
    v = run_checks(fixture_context("ixgbevf-4.1.0-k-c4.large", facts=facts), ["driver"])[0]
    assert v.status == "warn" and "supports ENA" in v.summary and "--ena-support" in v.remedy


def test_missing_interface_fails_every_per_interface_check() -> None:
    ctx = fixture_context("ena-2.12.3g-m6i.xlarge")
    ctx.interfaces = ["eth0", "eth7"]
    verdicts = [v for v in run_checks(ctx, PER_INTERFACE) if v.interface == "eth7"]
    assert [v.status for v in verdicts] == ["fail"] * len(PER_INTERFACE)
    assert all("does not exist" in v.summary for v in verdicts)


def test_out_of_tree_new_enough_without_counters_blames_the_device(tmp_path: pathlib.Path) -> None:
    d = tmp_path
    src = FIXTURES / "ena-2.12.3g-m6i.xlarge"
    lines = [ln for ln in (src / "S.txt").read_text().splitlines() if "allowance" not in ln]
    (d / "S.txt").write_text("\n".join(lines) + "\n")
    (d / "i.txt").write_text((src / "i.txt").read_text())
    ctx = fixture_context("ena-2.12.3g-m6i.xlarge")
    ctx.ethtool = FixtureEthtoolReader({"eth0": d})
    v = run_checks(ctx, ["driver_version"])[0]
    assert v.status == "fail" and "device does not report them" in v.summary and "shaping_source" in v.remedy
    # and with only some of the counters: a warning naming the missing ones
    (d / "S.txt").write_text("\n".join(lines + ["     bw_in_allowance_exceeded: 4"]) + "\n")
    ctx = fixture_context("ena-2.12.3g-m6i.xlarge")
    ctx.ethtool = FixtureEthtoolReader({"eth0": d})
    v = run_checks(ctx, ["driver_version"])[0]
    assert v.status == "warn" and "missing bw_out, pps, conntrack, linklocal" in v.summary


@pytest.mark.parametrize("text, module, kind, number", [
    ("2.12.3g", None, "out-of-tree", (2, 12, 3)),
    ("1.5.0g", None, "out-of-tree", (1, 5, 0)),
    ("2.1.0K", None, "in-tree", (2, 1, 0)),        # in-tree builds before Linux 5.8
    ("1.2.0k", None, "in-tree", (1, 2, 0)),
    ("6.1.0-18-cloud-amd64", None, "in-tree", None),
    ("4.18.0-305.el8_4.x86_64", None, "in-tree", None),
    ("6.11.2", None, "unknown", (6, 11, 2)),        # no suffix and no module version: cannot tell
    ("2.13.0", "2.13.0", "out-of-tree", (2, 13, 0)),
    ("", None, "unknown", None),
])
def test_parse_ena_version(text: str, module: object, kind: str, number: object) -> None:
    v = parse_ena_version(text, module)  # type: ignore[arg-type]
    assert (v.kind, v.number) == (kind, number)


def test_a_crashing_check_is_a_fail_verdict() -> None:
    ctx = fixture_context("ena-2.12.3g-m6i.xlarge")
    ctx.links = None  # type: ignore[assignment]   # the mtu check will trip over it
    v = run_checks(ctx, ["mtu"])[0]
    assert v.status == "fail" and "the check itself failed" in v.summary


def test_registry_lists_modules_with_run() -> None:
    import importlib
    for name, mod in CHECKS.items():
        m = importlib.import_module(mod)
        assert m.NAME == name and callable(m.run)
    assert configmod.Config().probe.peers == []
