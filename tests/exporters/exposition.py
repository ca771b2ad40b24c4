"""Every Prometheus view the daemon can register, built over fixed readings that fill every family it can
yield: the input of the exposition contract (tests/exporters/test_exposition_contract.py)."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

from agent.checks.runner import CheckState
from agent.cloudwatch.publisher import PublisherSnapshot
from agent.discovery import InstanceInfo
from agent.exporters.allowances import AllowancesView
from agent.exporters.checks import CheckView
from agent.exporters.cloudwatch import CloudWatchView
from agent.exporters.credit_view import CreditView
from agent.exporters.ena import EnaView
from agent.exporters.fleet import FleetView
from agent.exporters.instance import InstanceView
from agent.exporters.probes import ProbesView
from agent.exporters.prometheus import BuildInfoView, ReloadState, SamplerView
from agent.exporters.responder import ResponderView
from agent.exporters.state import StateView
from agent.fleet.service import FleetStats
from agent.models.checks import Verdict
from agent.models.conntrack import ConntrackReading
from agent.models.credit_model import CreditReading
from agent.models.fleet import Consensus
from agent.models.flows import FlowOwner
from agent.models.pps import PpsReading
from agent.models.profile import BandwidthProfile, CardBandwidth
from agent.models.shaping import ShapingReading
from agent.probes.archive import ArchiveStats
from agent.probes.scheduler import Peer
from agent.probes.service import DiscoveryStatus, ProbeResult, ProbeState
from agent.readers.ethtool import DriverInfo
from agent.readers.imds import Eni, Identity, ImdsStats
from agent.responder.stats import ResponderSnapshot
from agent.sampling import StepStatus
from agent.sampling.allowances import AllowanceReading
from agent.sampling.ethtool import InterfaceEthtool
from agent.sampling.pipeline import Snapshot
from agent.writers.spool import SpoolStats

BUCKET = 3.375e11


def credits() -> dict[str, CreditReading]:
    return {
        "in": CreditReading("in", 1.5e8, 2.0e11, BUCKET, 2.0e11 / BUCKET, 1200.5, math.inf, True, False, 2,
                            "exhaustion", "learned", 900.0, math.inf, bucket_low_bytes=0.4 * BUCKET,
                            bucket_high_bytes=1.6 * BUCKET, band_source="learned", band_observations=2,
                            remaining_low_ratio=0.0, remaining_high_ratio=0.75, exhaustion_earliest_seconds=0.0,
                            exhaustion_latest_seconds=2400.0, draining=True),
        "out": CreditReading("out", 1.0e6, 0.0, BUCKET, 0.0, math.inf, 3600.0, False, True, 0, "none", "default",
                             math.inf, 7200.0, bucket_low_bytes=0.2 * BUCKET, bucket_high_bytes=3.0 * BUCKET,
                             band_source="default", remaining_low_ratio=0.0, remaining_high_ratio=2.0 / 3.0,
                             exhaustion_earliest_seconds=0.0, exhaustion_latest_seconds=0.0, contradictions=1),
        # a direction without a bucket (never exhausts): only the figures that need none
        "x": CreditReading("x", 0.0, None, None, None, math.inf, math.inf),
    }


def snapshot() -> Snapshot:
    ena = InterfaceEthtool(
        raw={"bw_in_allowance_exceeded": 5, "conntrack_allowance_available": 1000, "ena_srd_mode": 3,
             "ena_srd_resource_utilization": 42, "ena_srd_tx_pkts": 9, "queue_0_tx_cnt": 77},
        totals={"bw_in_allowance_exceeded": 5, "bw_out_allowance_exceeded": 0, "pps_allowance_exceeded": 1,
                "conntrack_allowance_exceeded": 2, "linklocal_allowance_exceeded": 3, "ena_srd_tx_pkts": 9,
                "ena_srd_eligible_tx_pkts": 10, "ena_srd_rx_pkts": 11},
        driver=DriverInfo("ena", "2.12.3g", "", "0000:00:05.0"), resets=1)
    kernel = InterfaceEthtool(raw={}, totals={}, driver=DriverInfo("ena", "6.1.0-18-cloud-amd64", "", ""))
    return Snapshot(1.7e9, ("eth0", "eth1"), {}, {"eth0": [1, 2, 3, 4, 5, 6, 7, 8], "eth1": [0] * 8},
                    {"eth0": {"in": 10.0, "out": 20.5}, "eth1": {"in": 0.0, "out": 0.0}}, {"in": 10.0, "out": 20.5},
                    {"eth0": 1}, 0.0025, 42, {"netdev": StepStatus(True, 0.001), "ethtool": StepStatus(False, 0.002),
                                                                                "credits": StepStatus(True, 0.0005)},
                    ethtool={"eth0": ena, "eth1": kernel},
                    shaping=ShapingReading("ethtool", {"in": 3}, {"in": 5, "out": 0}), credits=credits())


def allowances() -> AllowanceReading:
    conntrack = ConntrackReading(True, 1000, 4000.0, "exceeded", 3000.0, 0.75, 1800.0, False, 12, 1)
    pps = PpsReading(95000.0, 100000.0, "learned", 0.95, False, False, 40, 2)
    owners = (FlowOwner("tcp", "out", 443, 2500, (("10.0.0.9", 2000),), 3),
              FlowOwner("udp", "in", 53, 400, (("10.0.0.7", 400),), 1))
    return AllowanceReading("ena", conntrack, pps, False, True, 2900, owners)


def instance() -> InstanceInfo:
    stats = ImdsStats()
    stats.count("token", "ok")
    stats.count("metadata", "not_found")
    profile = BandwidthProfile("m5.large", 9.375e7, 1.25e9, BUCKET, "catalogue", "api", "default",
                               (CardBandwidth(0, 9.375e7, 1.25e9), CardBandwidth(1, None, 1.25e9)), "api")
    # Two ENIs with an interface here (the second on network card 1) and one without (no series).
    enis = [Eni("0a:00:00:00:00:01", 0, 0, "eni-0aaa", None, None, (), ()),
            Eni("0a:00:00:00:00:02", 1, 1, "eni-0bbb", None, None, (), ()),
            Eni("0a:00:00:00:00:03", 2, 0, "eni-0ccc", None, None, (), ())]
    return InstanceInfo(True, Identity("i-0abc", "m5.large", "us-east-1", "us-east-1a", "use1-az1"), enis,
                        ["eth0", "eth1"], [], None, profile,
                        {"imds": "v2", "instance_type": "imds", "type_entry": "api", "api": "fresh"},
                        eni_interfaces={"0a:00:00:00:00:01": "eth0", "0a:00:00:00:00:02": "eth1"},
                        imds_stats=stats, discovery_seconds=0.25)


def checks() -> CheckState:
    return CheckState(verdicts=(
        Verdict("mtu", "eth0", "ok", "", {"mtu": 9001}),
        Verdict("mtu", "eth0", "fail", "a second verdict for the same interface"),
        Verdict("imds", "", "warn", ""),
        Verdict("path_mtu", "10.0.0.2", "fail", "", {"path_mtu": 1500, "black_hole": True}),
        Verdict("queues", "eth0", "ok", "", {"in_use": 2, "maximum": 8, "expected": 2}),
        Verdict("rings", "eth0", "ok", "", {"rx": 1024, "rx_max": 16384, "tx": 1024, "tx_max": 1024}),
    ), last_run={"mtu": 1.7e9, "imds": 1.7e9 + 1}, durations={"mtu": 0.01}, runs=3)


def probes() -> ProbeState:
    ok = ProbeResult("10.0.0.2:5201", "out", True, 1.7e9, 5.5, 625000000, 1.25e8, 4, 0.0005, 1.25e8)
    bad = ProbeResult("10.0.0.3:5201", "in", False, 1.7e9 + 9, 0.2, error="refused")
    return ProbeState(results={("10.0.0.2:5201", "out"): ok, ("10.0.0.3:5201", "in"): bad},
                      runs={("10.0.0.2:5201", "out", "success"): 3, ("10.0.0.3:5201", "in", "failure"): 1},
                      skipped={"budget": 2}, bytes_total={"out": 1.875e9}, budget_used_bytes=6.25e8,
                      budget_bytes=1e10, peers=(Peer("10.0.0.2", 5201, "m5.large"), Peer("10.0.0.3", 5201, None,
                                                                                          "discovered")),
                      rounds=4, next_round_timestamp=1.7e9 + 300, running=True,
                      discovery=DiscoveryStatus(True, 1.7e9, 1.7e9, 1), archive=ArchiveStats(3, 1, 0, 2, 1.7e9))


def responder() -> ResponderSnapshot:
    return ResponderSnapshot(True, False, 12, {"completed": 3, "aborted": 1}, {"busy": 2, "not_allowed": 1},
                             {"timeout": 1}, {"in": 1000, "out": 2000}, 1.7e9, ("10.0.0.0/8", "127.0.0.1/32"),
                             {"in": 1000, "out": 2000}, 10**10, 7_500_000_000, "refill")


def fleet() -> FleetStats:
    return FleetStats(published=2, publish_failures=1, backlog=0, dropped=0, objects_read=5,
                      rejected={"garbage": 1}, refresh_errors={"credentials": 1}, refreshes=2,
                      last_refresh_timestamp=1.7e9, consensus=Consensus(BUCKET, 5, 1, 0.05, 1.7e9),
                      requests={"list": 2, "get": 5, "put": 3})


def publisher() -> PublisherSnapshot:
    return PublisherSnapshot(published=10, failed=2, dropped={"backlog_full": 1, "expired": 0}, backlog=3,
                             backlog_capacity=1000, last_success=1.7e9, requests={"success": 4, "error": 1},
                             errors={"throttling": 1, "credentials": 0}, refused=1)


def spools() -> list[SpoolStats]:
    return [SpoolStats("cloudwatch", 2, 4096, 100, 10**6, {"full": 1}, 1),
            SpoolStats("probe-archive", 0, 0, 100, 10**6, {}, 0)]


def views() -> list[Any]:
    snap = snapshot()
    reload_state = ReloadState()
    reload_state.successful, reload_state.success_time = 0.0, 1.7e9
    reload_state.reloads = {"success": 2, "failure": 1}
    reload_state.restart_pending = ["responder.listen"]
    pub = publisher()
    return [BuildInfoView(), SamplerView(lambda: snap), reload_state, InstanceView(instance),
            CreditView(lambda: snap, lambda: "ethtool", lambda: "restored"),
            EnaView(lambda: snap.ethtool), CheckView(checks), CloudWatchView(lambda: pub),
            StateView(lambda: {"credits.json": 1}, spools), ResponderView(responder), ProbesView(probes),
            FleetView(fleet), AllowancesView(allowances)]


def registry(process: bool = False) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    if process:
        ProcessCollector(registry=reg)
    for v in views():
        reg.register(v)
    return reg


def contract(reg: CollectorRegistry) -> list[str]:
    """One line per family: name, type, label names (of its samples, in order), help."""
    lines = []
    for fam in reg.collect():
        labels: list[str] = []
        for s in fam.samples:
            for k in s.labels:
                if k not in labels:
                    labels.append(k)
        lines.append(f"{fam.name} {fam.type} [{','.join(labels)}] {fam.documentation}")
    return lines


def exposition() -> bytes:
    """The text exposition of every burstwatch view (the process collector's values vary: left out)."""
    return generate_latest(registry())
