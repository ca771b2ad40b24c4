"""The probe service: results per peer and direction, failures as values, discovery, archive hand-off."""

from __future__ import annotations

import copy
import gzip
import json
import random
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from agent import aws
from agent.config import FleetConfig, ProbeArchiveConfig, ProbeConfig
from agent.discovery import InstanceInfo
from agent.iperf3.client import ProbeError, ProbeRequest
from agent.models.profile import GBIT, BandwidthProfile
from agent.probes.scheduler import Peer, Scheduler
from agent.probes.service import (
    ProbeService,
    build_probe_service,
    capped_bitrate,
    catalogue_baseline,
    catalogue_peak,
    pair_allowance,
)
from agent.readers.imds import Eni, Identity

FIXTURES = Path(__file__).resolve().parent.parent / "iperf3" / "fixtures"
M5 = BandwidthProfile("m5.large", 0.75 * GBIT, 10 * GBIT, 337.5e9, "config", "config", "config")


def fixture(reverse: bool) -> dict[str, Any]:
    """Captured from Debian's iperf3 3.12 (see the file's _source)."""
    name = "iperf3-3.12-tcp-reverse.json" if reverse else "iperf3-3.12-tcp-forward.json"
    return json.loads((FIXTURES / name).read_text())["doc"]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeRunner:
    """Stands in for run_probe: answers with captured iperf3 documents scaled to `gbps`, or raises."""

    def __init__(self, gbps: float = 8.0, fail: Optional[BaseException] = None) -> None:
        self.gbps = gbps
        self.fail = fail
        self.requests: list[ProbeRequest] = []

    def __call__(self, req: ProbeRequest) -> dict[str, Any]:
        self.requests.append(req)
        if self.fail is not None:
            raise self.fail
        doc = copy.deepcopy(fixture(req.reverse))
        doc["end"]["sum_received"]["bits_per_second"] = self.gbps * 1e9
        doc["end"]["sum_received"]["bytes"] = int(self.gbps * 1e9 / 8 * req.duration)
        doc["end"]["sum_sent"]["bytes"] = int(self.gbps * 1e9 / 8 * req.duration)
        return doc


def section(peers: tuple[str, ...] = ("10.0.0.2",), **kw: Any) -> ProbeConfig:
    """A [probe] section with this module's schedule: a round a minute, one peer, 5 s x 4 streams."""
    base: dict[str, Any] = {"interval": 60.0, "peers_per_round": 1, "duration": 5.0, "streams": 4,
                            "credit_floor": 0.5, "hourly_budget_bytes": 10**15}
    return ProbeConfig(peers=list(peers), **{**base, **kw})


def make(clock: Clock, runner: Any, peers: tuple[str, ...] = ("10.0.0.2",), credits: Any = None,
         profile: Optional[BandwidthProfile] = M5, peer_peak: Any = lambda t: None, **kw: Any) -> ProbeService:
    cfg = section(peers, **{k: kw.pop(k) for k in ("peers_per_round", "hourly_budget_bytes", "discover_interval")
                            if k in kw})
    sched = Scheduler.from_config(cfg, credits=lambda: credits,
                                  peak_bytes_per_second=lambda: profile.peak_bytes_per_second if profile else None,
                                  clock=clock, rng=random.Random(1))
    return ProbeService(cfg, sched, runner=runner, profile=lambda: profile, peer_peak=peer_peak, **kw)


def run_round(svc: ProbeService, clock: Clock) -> list[Any]:
    clock.t = max(clock.t, svc.scheduler.next_round)
    out = []
    while True:
        r = svc.run_once()
        if r is None and svc.scheduler.pending:
            clock.t += svc.scheduler.wait_seconds()       # the gap between probes
            continue
        if r is None:
            return out
        out.append(r)


def test_results_per_peer_and_direction() -> None:
    clock, runner = Clock(), FakeRunner(gbps=8.0)
    svc = make(clock, runner)
    results = run_round(svc, clock)
    assert [(r.peer, r.direction, r.success) for r in results] == [("10.0.0.2:5201", "out", True),
                                                                  ("10.0.0.2:5201", "in", True)]
    assert [(q.host, q.port, q.reverse, q.streams, q.duration) for q in runner.requests] == [
        ("10.0.0.2", 5201, False, 4, 5.0), ("10.0.0.2", 5201, True, 4, 5.0)]
    out, rev = results
    assert out.throughput_bytes_per_second == pytest.approx(1e9)
    # m5.large with credits: 10 Gbit/s is what the pair should get, 8 of 10 = 0.8.
    assert out.expected_bytes_per_second == pytest.approx(10 * GBIT)
    assert out.throughput_ratio == pytest.approx(0.8)
    assert out.retransmits == 9
    assert out.rtt_seconds == pytest.approx((366 + 158) / 2 / 1e6)
    assert rev.rtt_seconds is None          # iperf3's reverse report carries no RTT for the local side
    st = svc.snapshot()
    assert st.runs == {("10.0.0.2:5201", "out", "success"): 1, ("10.0.0.2:5201", "in", "success"): 1}
    assert st.budget_used_bytes == pytest.approx(2 * 5e9)
    assert st.bytes_total == {"out": pytest.approx(5e9), "in": pytest.approx(5e9)}


@pytest.mark.parametrize("exc,kind,backoff", [
    (ProbeError("10.0.0.2:5201", "connection refused", "refused"), "refused", True),
    (ProbeError("10.0.0.2:5201", "the server is busy", "busy"), "busy", False),
    (ProbeError("10.0.0.2:5201", "no results", "timeout"), "timeout", True),
    (RuntimeError("a bug in the runner"), "error", True),
])
def test_a_failed_probe_is_a_value(exc: BaseException, kind: str, backoff: bool) -> None:
    clock = Clock()
    svc = make(clock, FakeRunner(fail=exc))
    results = run_round(svc, clock)
    assert [(r.success, r.error, r.throughput_bytes_per_second) for r in results] == [(False, kind, None)] * 2
    assert results[0].expected_bytes_per_second == pytest.approx(10 * GBIT)
    st = svc.snapshot()
    assert st.runs[("10.0.0.2:5201", "out", "failure")] == 1
    run_round(svc, clock)   # failures 3 and 4 for a faulty peer: it then sits out a round
    run_round(svc, clock)
    assert (svc.snapshot().skipped["peer_backoff"] > 0) == backoff


def test_iperf3_error_document_and_garbage_are_failures() -> None:
    clock = Clock()
    docs = iter([{"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server"},
                 {"not": "iperf3"}])
    svc = make(clock, lambda req: next(docs))
    results = run_round(svc, clock)
    assert [(r.success, r.error) for r in results] == [(False, "error"), (False, "invalid")]


@pytest.mark.parametrize("direction,credits,profile,peer_peak,expected", [
    ("out", {}, M5, None, 10 * GBIT),                                    # ours with credits, peer unknown
    ("out", {"out": (0.0, 1e9)}, M5, None, 0.75 * GBIT),                 # our out bucket empty: baseline
    ("in", {"out": (0.0, 1e9), "in": (5e8, 1e9)}, M5, None, 10 * GBIT),  # the in bucket still has credit
    ("out", {}, M5, 5 * GBIT, 5 * GBIT),                                 # smaller peer size decides
    ("out", {}, M5, 25 * GBIT, 10 * GBIT),                               # bigger peer: we decide
    ("out", {"out": (0.0, 1e9)}, M5, 5 * GBIT, 0.75 * GBIT),
    ("out", {}, None, 5 * GBIT, 5 * GBIT),                               # our profile unknown
    ("out", {}, None, None, None),
])
def test_pair_allowance(direction: str, credits: dict, profile: Optional[BandwidthProfile],
                        peer_peak: Optional[float], expected: Optional[float]) -> None:
    assert pair_allowance(direction, credits, profile, peer_peak) == expected


def test_peer_size_from_discovery_sets_the_expectation() -> None:
    clock = Clock()
    svc = make(clock, FakeRunner(gbps=4.0), peers=(), peer_peak=catalogue_peak,
               discover=lambda: [Peer("10.0.0.7", 5201, "t3.micro", "discovered")])
    svc.refresh_peers()
    results = run_round(svc, clock)
    t3_peak = catalogue_peak("t3.micro")
    assert t3_peak == pytest.approx(5 * GBIT)              # ec2-network-facts.md: t3.micro 0.064 / 5.0
    assert results[0].expected_bytes_per_second == pytest.approx(t3_peak)
    assert results[0].throughput_ratio == pytest.approx(0.8)


def test_discovery_failure_keeps_the_last_good_list() -> None:
    clock = Clock()
    answers: list[Any] = [[Peer("10.0.0.7", 5201, "m5.large", "discovered")], RuntimeError("throttled")]

    def discover() -> list[Peer]:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    svc = make(clock, FakeRunner(), discover=discover, discover_interval=300.0)
    svc.refresh_peers()
    assert [p.key for p in svc.scheduler.peers] == ["10.0.0.2:5201", "10.0.0.7:5201"]
    svc.refresh_peers()
    st = svc.snapshot()
    assert [p.key for p in st.peers] == ["10.0.0.2:5201", "10.0.0.7:5201"]
    assert st.discovery is not None and not st.discovery.success and st.discovery.last_success_timestamp > 0
    assert st.discovery.error == "throttled"


def test_departed_peers_leave_the_results() -> None:
    clock = Clock()
    lists = [[Peer("10.0.0.7", 5201, None, "discovered")], []]
    svc = make(clock, FakeRunner(), peers=(), discover=lambda: lists.pop(0))
    svc.refresh_peers()
    run_round(svc, clock)
    assert {k[0] for k in svc.snapshot().results} == {"10.0.0.7:5201"}
    svc.refresh_peers()
    assert svc.snapshot().results == {}


def test_credits_low_means_no_probe_and_the_runner_is_never_called() -> None:
    clock, runner = Clock(), FakeRunner()
    svc = make(clock, runner, credits={"in": (10e9, 337.5e9), "out": (337.5e9, 337.5e9)})
    assert run_round(svc, clock) == []
    assert runner.requests == []
    assert svc.snapshot().skipped["credit_floor"] == 2


def test_thread_runs_the_schedule_and_stops_promptly() -> None:
    runner = FakeRunner()
    cfg = section(interval=0.2, duration=1.0, streams=1)     # faster than [probe] allows, for the test
    sched = Scheduler.from_config(cfg, rng=random.Random(3), gap=0.05)
    svc = ProbeService(cfg, sched, runner=runner, profile=lambda: M5, peer_peak=lambda t: None)
    svc.start()
    try:
        deadline = time.monotonic() + 5.0
        while len(runner.requests) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        t0 = time.monotonic()
        svc.stop(2.0)
        stopped_in = time.monotonic() - t0
    assert len(runner.requests) >= 6
    # stop() wakes the thread out of its 0.2-s wait and joins it: milliseconds; 1 s is the margin for a loaded
    # machine, and half of stop()'s own 2-s timeout, so a stop that only timed out still fails.
    assert stopped_in < 1.0
    # The thread is gone, so nothing can run after stop(): no pause needed to show it.
    assert svc._thread is not None and not svc._thread.is_alive()


def instance_info(instance_id: str, vpc_id: str, ip: str) -> InstanceInfo:
    """What discovery learns on EC2, as far as the probe service reads it."""
    ident = Identity(instance_id, "m5.large", "us-east-1", "us-east-1a", "use1-az1")
    eni = Eni("02:00:00:00:00:01", 0, 0, "eni-1", "subnet-1", vpc_id, ("10.40.0.0/16",), (ip,))
    return InstanceInfo(True, ident, [eni], ["eth0"], ["10.40.0.0/16"], None, M5, {})


def test_discovery_and_archive_end_to_end_through_moto(moto: str) -> None:
    """build_probe_service as the daemon would: peers from EC2 tags, results into S3 (both moto over HTTP)."""
    ec2 = aws.client("ec2", "us-east-1", moto)
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.1.0/24",
                               AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    other_az = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.2.0/24",
                                 AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    tag = [{"ResourceType": "instance", "Tags": [{"Key": "burstwatch:peer", "Value": "true"}]}]
    me, peer = ec2.run_instances(ImageId="ami-12c6146b", MinCount=2, MaxCount=2, InstanceType="m5.large",
                                 SubnetId=subnet, TagSpecifications=tag)["Instances"]
    # A tagged instance in another zone: same-AZ peers by default (docs/probes.md, "Same-AZ peers").
    ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="m5.large",
                      SubnetId=other_az, TagSpecifications=tag)
    aws.client("s3", "us-east-1", moto).create_bucket(Bucket="results")
    runner = FakeRunner(gbps=9.0)
    cfg = ProbeConfig(hourly_budget_bytes=10**12, discover_tag="burstwatch:peer=true", discover_endpoint_url=moto,
                      archive=ProbeArchiveConfig(enabled=True, bucket="results", prefix="bw/", endpoint_url=moto))
    svc = build_probe_service(cfg, responder_port=5201, credits=lambda: None, profile=lambda: M5,
                              instance=instance_info(me["InstanceId"], vpc, me["PrivateIpAddress"]), runner=runner)
    assert svc.archive is not None
    svc.archive.start()
    try:
        svc.refresh_peers()
        assert [(p.host, p.instance_type, p.source) for p in svc.scheduler.peers] == [
            (peer["PrivateIpAddress"], "m5.large", "discovered")]
        svc.scheduler.next_round = svc.scheduler.clock()      # do not wait up to 15 minutes for round one
        svc.scheduler.gap = 0.0
        while svc.run_once() is not None:
            pass
        assert [q.host for q in runner.requests] == [peer["PrivateIpAddress"]] * 2
        assert svc.archive.flush(20.0)
    finally:
        svc.archive.stop(2.0)
    s3 = aws.client("s3", "us-east-1", moto)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="results")["Contents"])
    assert len(keys) == 2 and all(k.startswith("bw/d=") and f"-{me['InstanceId']}.json.gz" in k for k in keys)
    body = json.loads(gzip.decompress(s3.get_object(Bucket="results", Key=keys[0])["Body"].read()))
    assert body["instanceType"] == "m5.large" and body["region"] == "us-east-1"
    st = svc.snapshot()
    assert st.archive is not None and st.archive.uploaded == 2
    assert st.discovery is not None and st.discovery.success and st.discovery.peers == 1


def test_reconfigure_on_reload_keeps_history() -> None:
    clock = Clock()
    svc = make(clock, FakeRunner(), peers=("10.0.0.2", "10.0.0.3"))
    run_round(svc, clock)
    before = svc.snapshot()
    assert len(before.results) == 2 and before.budget_used_bytes > 0
    svc.reconfigure(ProbeConfig(peers=["10.0.0.3", "10.0.0.4:5202"], interval=30.0, peers_per_round=2,
                                duration=2.0, streams=8, credit_floor=0.2, hourly_budget_bytes=2 * 10**12,
                                directions=["out"]))
    s = svc.scheduler
    assert (s.interval, s.peers_per_round, s.duration, s.streams, s.credit_floor, s.directions) == (
        30.0, 2, 2.0, 8, 0.2, ("out",))
    assert s.next_round <= clock.t + 30.0
    assert [p.key for p in s.peers] == ["10.0.0.3:5201", "10.0.0.4:5202"]
    after = svc.snapshot()
    assert after.budget_used_bytes == before.budget_used_bytes          # the hour's bytes still count
    assert all(k[0] != "10.0.0.2:5201" for k in after.results)          # the removed peer's series go
    results = run_round(svc, clock)
    assert {(r.peer, r.direction) for r in results} <= {("10.0.0.3:5201", "out"), ("10.0.0.4:5202", "out")}
    assert len(results) == 2 and all(r.success for r in results)
    with pytest.raises(ValueError):
        svc.reconfigure(ProbeConfig(peers=[], interval=30.0, streams=1, hourly_budget_bytes=10**9,
                                    directions=["sideways"]))
    assert s.directions == ("out",) and s.interval == 30.0           # a bad section changes nothing


def test_reconfigure_keeps_discovery_and_archive_until_a_restart_and_the_port_it_was_given() -> None:
    clock = Clock()
    running = section(("10.0.0.2",), discover_tag="burstwatch:peer", discover_interval=120.0)
    svc = ProbeService(running, Scheduler.from_config(running, clock=clock, rng=random.Random(1)),
                       default_port=5301, discover=lambda: [], runner=FakeRunner())
    assert [p.key for p in svc.scheduler.peers] == ["10.0.0.2:5301"]
    new = section(("10.0.0.3",), discover_tag="other", discover_interval=600.0,
                  archive=ProbeArchiveConfig(enabled=True, bucket="b"))
    svc.reconfigure(new)
    assert [p.key for p in svc.scheduler.peers] == ["10.0.0.3:5301"]     # still the responder port given
    assert (svc.cfg.discover_tag, svc.discover_interval, svc.cfg.archive) == (
        "burstwatch:peer", 120.0, ProbeArchiveConfig())                    # marked restart in agent/config.py
    assert svc.cfg.peers == ["10.0.0.3"]
    svc.reconfigure(new, responder_port=5401)
    assert [p.key for p in svc.scheduler.peers] == ["10.0.0.3:5401"]


# -- rate = "baseline" --------------------------------------------------------------------------------------
def capped(clock: Clock, runner: Any, profile: BandwidthProfile = M5, rate: str = "baseline",
           peers: tuple[str, ...] = ("10.0.0.2",), **kw: Any) -> ProbeService:
    """The service as build_probe_service wires it: the scheduler's baseline and peak from the profile."""
    cfg = section(peers, rate=rate)
    sched = Scheduler.from_config(cfg, peak_bytes_per_second=lambda: profile.peak_bytes_per_second,
                                  baseline_bytes_per_second=lambda: profile.baseline_bytes_per_second,
                                  clock=clock, rng=random.Random(1))
    return ProbeService(cfg, sched, runner=runner, profile=lambda: profile, **kw)


def test_a_baseline_probe_asks_for_the_baseline_in_both_directions() -> None:
    clock, runner = Clock(), FakeRunner(gbps=0.74)
    results = run_round(capped(clock, runner, peer_peak=lambda t: None), clock)
    per_stream = int(0.75 * GBIT * 8 / 4)
    # -R too: the client sends -b in the parameters and the server (iperf3's or our responder) paces by it.
    assert [(q.reverse, q.bitrate, q.streams) for q in runner.requests] == [(False, per_stream, 4),
                                                                           (True, per_stream, 4)]
    for r in results:   # the cap is what the pair should deliver: 0.74 of 0.75 Gbit/s, not of the 10 Gbit/s peak
        assert r.expected_bytes_per_second == pytest.approx(0.75 * GBIT, rel=1e-6)
        assert r.throughput_ratio == pytest.approx(0.74 / 0.75, rel=1e-5)
    assert svc_peak_requests(clock) == [(False, None), (True, None)]


def svc_peak_requests(clock: Clock) -> list[tuple[bool, Optional[int]]]:
    runner = FakeRunner()
    results = run_round(capped(clock, runner, rate="peak", peer_peak=lambda t: None), clock)
    assert results[0].expected_bytes_per_second == pytest.approx(10 * GBIT)
    return [(q.reverse, q.bitrate) for q in runner.requests]


def test_a_smaller_peers_baseline_lowers_the_cap() -> None:
    clock, runner = Clock(), FakeRunner(gbps=0.06)
    svc = capped(clock, runner, peers=(), peer_peak=catalogue_peak, peer_baseline=catalogue_baseline,
                 discover=lambda: [Peer("10.0.0.7", 5201, "t3.micro", "discovered"),
                                   Peer("10.0.0.8", 5201, "m5.2xlarge", "discovered")])
    svc.refresh_peers()
    results = run_round(svc, clock) + run_round(svc, clock)
    by_peer = {(r.peer, r.direction): r for r in results}
    t3_base = catalogue_baseline("t3.micro")
    assert t3_base == pytest.approx(0.064 * GBIT)            # ec2-network-facts.md: t3.micro 0.064 / 5.0
    caps = {(q.host, q.reverse): q.bitrate for q in runner.requests}
    assert caps == {("10.0.0.7", False): int(t3_base * 8 / 4), ("10.0.0.7", True): int(t3_base * 8 / 4),
                    # a bigger peer does not raise it: our own baseline holds
                    ("10.0.0.8", False): int(0.75 * GBIT * 8 / 4), ("10.0.0.8", True): int(0.75 * GBIT * 8 / 4)}
    assert by_peer[("10.0.0.7:5201", "out")].expected_bytes_per_second == pytest.approx(t3_base, rel=1e-6)
    assert capped_bitrate(None, 4, t3_base) is None           # rate = "peak" is never lowered


def test_build_probe_service_caps_at_the_profiles_baseline() -> None:
    runner = FakeRunner()
    svc = build_probe_service(section(), responder_port=5201, credits=lambda: None, profile=lambda: M5,
                              runner=runner)
    assert svc.cfg.rate == "baseline" and svc.scheduler.bitrate() == int(0.75 * GBIT * 8 / 4)
    svc = build_probe_service(section(rate="peak"), responder_port=5201, credits=lambda: None,
                              profile=lambda: M5, runner=runner)
    assert svc.scheduler.bitrate() is None


def test_registry_discovery_as_the_daemon_builds_it(moto: str) -> None:
    """[probe] registry = true: each agent registers in the [fleet] bucket and finds its zone's agents only
    (docs/fleet.md, "Peer discovery"); no EC2 call."""
    aws.client("s3", "us-east-1", moto).create_bucket(Bucket="fleet")
    fleet = FleetConfig(bucket="fleet", prefix="bw/", region="us-east-1", endpoint_url=moto)
    cfg = ProbeConfig(registry=True)

    def agent(n: int, zone_id: str) -> Any:
        ident = Identity(f"i-0{n:016x}", "m5.large", "us-east-1", "us-east-1x", zone_id)
        eni = Eni("02:00:00:00:00:01", 0, 0, "eni-1", "subnet-1", "vpc-1", ("10.40.0.0/16",), (f"10.40.0.{n}",))
        info = InstanceInfo(True, ident, [eni], ["eth0"], ["10.40.0.0/16"], None, M5, {})
        return build_probe_service(cfg, responder_port=5201, credits=lambda: None, profile=lambda: M5,
                                   instance=info, runner=FakeRunner(), fleet=fleet)

    a, b, c = agent(1, "use1-az1"), agent(2, "use1-az1"), agent(3, "use1-az2")
    for svc in (b, c, a):
        svc.refresh_peers()
    assert [(p.host, p.zone, p.source) for p in a.scheduler.peers] == [("10.40.0.2", "use1-az1", "discovered")]
    assert a.scheduler.zone == "use1-az1"
    assert a.snapshot().discovery is not None and a.snapshot().discovery.successes == 1
