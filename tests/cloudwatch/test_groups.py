"""Per group, per instance when draining, fewer calls (docs/cloudwatch.md, "Per group, per instance" and
"Requests at fleet scale"): the rollup, the publish policy, the flush timing, throttling, the group lookup's
cache and the cost model's targets."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from botocore.exceptions import ClientError

from agent.cloudwatch.dimensions import aggregation_sets
from agent.cloudwatch.policy import PublishPolicy, next_steady, phase
from agent.cloudwatch.publisher import CloudWatchPublisher
from agent.config import CloudWatchConfig
from agent.models.credit_model import CreditReading
from agent.models.cw_aggregate import Datum, PeriodAggregator, SeriesKey
from agent.models.cw_cost import PUT_METRIC_DATA_TPS, cloudwatch_cost
from agent.models.figures import CLOUDWATCH_METRICS
from agent.readers.autoscaling import CACHE_FILE, CACHE_FORMAT, autoscaling_group_name
from agent.sampling.pipeline import Snapshot

IID, ITYPE = "i-0123456789abcdef0", "m5.large"
INST = (("InstanceId", IID), ("InstanceType", ITYPE))
GROUP = (("InstanceType", ITYPE),)
HOUR = 7 * 3600.0


def key(name: str, direction: str = "out") -> SeriesKey:
    return SeriesKey(name, CLOUDWATCH_METRICS[name].unit, (("Direction", direction),))


def period(start: float, exhaustion: float = 3e7, ratio: float = 0.9, shaping: float = 0.0,
           exhausted: Optional[float] = None) -> dict[SeriesKey, Any]:
    """One closed period of one instance: three samples of each default credit series (out only)."""
    agg = PeriodAggregator(60)
    for k in range(3):
        t = start + k
        agg.add(t, key("CreditExhaustionSeconds"), exhaustion + 100 * k)
        agg.add(t, key("CreditExhaustionTrendSeconds"), 3e7)
        agg.add(t, key("CreditRemainingRatio"), ratio - 0.01 * k)
        agg.add(t, key("ShapingEvents"), shaping)
        if exhausted is not None:
            agg.add(t, key("CreditExhausted"), exhausted)
    ((_, bucket),) = agg.close_periods(start + 60)
    return bucket


def merged(datums: list[Datum]) -> dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, float]]:
    """What CloudWatch makes of statistic sets with the same name and dimensions in one period."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, float]] = {}
    for d in datums:
        m = out.setdefault((d.name, d.dims), {"SampleCount": 0.0, "Sum": 0.0, "Minimum": math.inf,
                                              "Maximum": -math.inf})
        m["SampleCount"] += d.sample_count
        m["Sum"] += d.total
        m["Minimum"] = min(m["Minimum"], d.minimum)
        m["Maximum"] = max(m["Maximum"], d.maximum)
    return out


# -- the group metric: one value per instance and period ---------------------------------------------

def test_a_group_metric_is_its_worst_instance_and_counts_instances() -> None:
    datums = []
    for i, (ratio, exhausted) in enumerate([(0.9, 0.0), (0.15, 1.0), (0.5, 1.0), (0.8, 0.0)]):
        pol = PublishPolicy("never", (("InstanceId", f"i-{i}"), ("InstanceType", ITYPE)), [GROUP], 60)
        out, _ = pol.take(HOUR, period(HOUR, ratio=ratio, exhausted=exhausted))
        assert all("InstanceId" not in dict(d.dims) and d.sample_count == 1 for d in out)
        datums += out
    got = merged(datums)
    remaining = got[("CreditRemainingRatio", GROUP + (("Direction", "out"),))]
    assert remaining["SampleCount"] == 4                       # the instances reporting
    assert remaining["Minimum"] == pytest.approx(0.15 - 0.02)  # the worst instance's lowest
    assert got[("CreditExhausted", GROUP + (("Direction", "out"),))]["Sum"] == 2   # instances at the baseline
    # The forecast goes in as each instance's Maximum (sustained over the period, as the alarm reads it).
    assert got[("CreditExhaustionSeconds", GROUP + (("Direction", "out"),))]["Minimum"] == 3e7 + 200


def test_a_peer_metric_goes_to_the_group_without_its_peer() -> None:
    agg = PeriodAggregator(60)
    for peer, bps in (("10.0.0.1", 1e9), ("10.0.0.2", 3e9)):
        agg.add(HOUR, SeriesKey("ProbeThroughputBitsPerSecond", "Bits/Second",
                                (("Peer", peer), ("Direction", "out"))), bps)
    ((_, bucket),) = agg.close_periods(HOUR + 60)
    out, _ = PublishPolicy("always", INST, [GROUP], 60).take(HOUR, bucket)
    group = [d for d in out if "InstanceId" not in dict(d.dims)]
    assert [(d.dims, d.sample_count, d.total) for d in group] == [(GROUP + (("Direction", "out"),), 1.0, 2e9)]
    assert len(out) - len(group) == 2                     # per instance: one per peer, as before


def test_a_period_closed_twice_counts_once_in_the_group() -> None:
    pol = PublishPolicy("always", INST, [GROUP], 60)
    first, _ = pol.take(HOUR, period(HOUR))
    late, _ = pol.take(HOUR, period(HOUR))                # a late sample's second statistic set
    assert any("InstanceId" not in dict(d.dims) for d in first)
    assert late and all("InstanceId" in dict(d.dims) for d in late)


# -- per instance: only in the hours an alarm's condition holds ---------------------------------------

def test_when_draining_sends_the_hours_in_which_an_alarm_condition_held() -> None:
    pol = PublishPolicy("when_draining", INST, [GROUP], 60)

    def inst(datums: list[Datum]) -> set[float]:
        return {d.timestamp for d in datums if "InstanceId" in dict(d.dims)}

    for m in range(5):                                    # idle: nothing per instance, nothing urgent
        out, urgent = pol.take(HOUR + 60 * m, period(HOUR + 60 * m))
        assert not inst(out) and not urgent and out
    assert pol.held > 0
    out, urgent = pol.take(HOUR + 300, period(HOUR + 300, exhaustion=300.0))   # under 10 minutes: urgent
    assert urgent and pol.alarming == {("credit-exhaustion", "out")}
    assert inst(out) == {HOUR + 60 * m for m in range(6)}  # the hour so far, free once the hour is billed
    out, urgent = pol.take(HOUR + 360, period(HOUR + 360, exhaustion=300.0))
    assert not urgent and pol.alarming and inst(out) == {HOUR + 360}
    out, urgent = pol.take(HOUR + 420, period(HOUR + 420))   # over: urgent (the OK), still this hour
    assert urgent and not pol.alarming and inst(out) == {HOUR + 420}
    out, urgent = pol.take(HOUR + 3600, period(HOUR + 3600))  # the next hour: nothing per instance
    assert not urgent and not inst(out) and pol.held == len(period(HOUR))


def test_a_shaped_or_low_period_is_an_alarm_condition_too() -> None:
    pol = PublishPolicy("when_draining", INST, [], 60)
    _, urgent = pol.take(HOUR, period(HOUR, shaping=5.0))
    assert urgent and pol.alarming == {("shaping", "out")}
    _, urgent = pol.take(HOUR + 60, period(HOUR + 60, ratio=0.1))
    assert urgent and pol.alarming == {("credit-low", "out")}


def test_always_and_never() -> None:
    always, _ = PublishPolicy("always", INST, [], 60).take(HOUR, period(HOUR))
    never, _ = PublishPolicy("never", INST, [], 60).take(HOUR, period(HOUR, exhaustion=1.0))
    assert always and all(d.dims[:2] == INST for d in always)
    assert never == []


def test_aggregation_sets() -> None:
    dims = INST + (("AutoScalingGroupName", "web"), ("Environment", "prod"))
    assert aggregation_sets(None, dims) == [(("AutoScalingGroupName", "web"),)]
    assert aggregation_sets(None, INST) == [(("InstanceType", ITYPE),)]
    # the agent's form; a set given twice in another order once (aws/amazon-cloudwatch-agent#672); [] = all
    assert aggregation_sets([["Environment", "AutoScalingGroupName"], ["AutoScalingGroupName", "Environment"],
                             [], ["Nope"]], dims) == [
        (("Environment", "prod"), ("AutoScalingGroupName", "web")), ()]
    assert aggregation_sets([], dims) == []


# -- when calls go out ------------------------------------------------------------------------------

class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[float, list[dict[str, Any]]]] = []
        self.throttle = 0
        self.now = lambda: 0.0

    def put_metric_data(self, Namespace: str, MetricData: list[dict[str, Any]]) -> None:
        if self.throttle:
            self.throttle -= 1
            raise ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "PutMetricData")
        self.calls.append((self.now(), MetricData))


def reading(exhaustion: float) -> CreditReading:
    return CreditReading("out", 1e8, 0.5 * 1e9, 1e9, 0.5, exhaustion, math.inf, exhaustion_trend_seconds=3e7)


def snap(t: float, exhaustion: float) -> Snapshot:
    return Snapshot(wall_time=t, interfaces=("eth0",), raw={}, totals={}, interface_rates={},
                    instance_rates={"out": 1e8}, resets={}, sample_duration=0.001, samples_total=1, steps={},
                    credits={"out": reading(exhaustion)}, shaping=None)


def run_minutes(minutes: list[float], **cfg: Any) -> tuple[CloudWatchPublisher, FakeClient, list[float]]:
    """A publisher on a fake clock and client: minute m's samples carry the forecast minutes[m]; returns
    the publisher, the client (its calls stamped with the fake time) and the period starts."""
    clock = [HOUR]
    client = FakeClient()
    client.now = lambda: clock[0]
    c = dataclasses.replace(CloudWatchConfig(), enabled=True, region="us-east-1", **cfg)
    pub = CloudWatchPublisher(c, instance_id=IID, instance_type=ITYPE, wall=lambda: clock[0],
                              client_factory=lambda *a, **k: client)
    starts = []
    for m, forecast in enumerate(minutes):
        start = HOUR + 60 * m
        starts.append(start)
        for s in range(0, 60, 10):
            pub.observe(snap(start + s, forecast))
        clock[0] = start + 60 + pub.grace
        pub._flush(clock[0] - pub.grace, final=False)
    return pub, client, starts


def test_idle_periods_wait_for_the_steady_flush_and_a_drain_goes_at_once() -> None:
    idle = [3e7] * 20
    pub, client, _ = run_minutes(idle)
    assert pub.flush_interval == 900 and 1 <= len(client.calls) <= 2    # one steady flush in 20 minutes, or two
    steady = [t for t, _ in client.calls]
    assert all(abs((t - pub._phase) % 900) < 61 for t in steady)

    pub, client, starts = run_minutes([3e7] * 3 + [400.0, 300.0, 3e7] + [3e7] * 3)
    sent = {t: {d["Timestamp"].timestamp() for d in data} for t, data in client.calls}
    # The draining minute (the 4th) reaches CloudWatch at its end, with the group's worst value in it.
    assert starts[3] in sent.get(starts[4] + pub.grace, set())
    assert starts[4] in sent.get(starts[5] + pub.grace, set())      # while it holds: every period
    assert starts[5] in sent.get(starts[6] + pub.grace, set())      # and the period it ended (the OK)
    assert starts[6] not in set().union(*sent.values())             # then: back to the steady flush


def test_throttling_backs_off_is_counted_and_loses_nothing() -> None:
    clock = [HOUR]
    client = FakeClient()
    client.now = lambda: clock[0]
    client.throttle = 2
    c = dataclasses.replace(CloudWatchConfig(), enabled=True, region="us-east-1", per_instance="always")
    pub = CloudWatchPublisher(c, instance_id=IID, instance_type=ITYPE, wall=lambda: clock[0],
                              client_factory=lambda *a, **k: client)
    want = 0
    for m in range(12):
        start = HOUR + 60 * m
        pub.observe(snap(start, 100.0))                               # an alarm condition: urgent
        clock[0] = start + 60 + pub.grace
        pub._flush(clock[0] - pub.grace, final=False)
        want += 1
    st = pub.snapshot()
    assert st.errors["throttling"] == 2 and st.requests["error"] == 2
    # after each throttle the next call waited at least half a period, and doubled
    assert pub._backoff == 0.0 and client.calls
    assert st.backlog == 0 and st.dropped["backlog_full"] == 0
    sent_inst = {d["Timestamp"].timestamp() for _, data in client.calls for d in data
                 if any(x["Name"] == "InstanceId" for x in d.get("Dimensions", []))}
    assert sent_inst == {HOUR + 60 * m for m in range(12)}               # nothing lost


def test_phase_spreads_instances_and_stays_put() -> None:
    phases = [phase(f"i-{n:017x}", 900) for n in range(1000)]
    assert phase("i-0abc", 900) == phase("i-0abc", 900)
    assert max(phases) - min(phases) > 850 and abs(sum(phases) / len(phases) - 450) < 40
    assert next_steady(1000.0, 900, 100.0) == 1900.0 and next_steady(999.0, 900, 100.0) == 1000.0


# -- the group's name: looked up once per instance, cached across restarts -----------------------------

def test_describe_tags_once_per_instance(tmp_path: Path) -> None:
    calls: list[str] = []

    class Ec2:
        def describe_tags(self, Filters: list[dict[str, Any]]) -> dict[str, Any]:
            calls.append(Filters[0]["Values"][0])
            return {"Tags": [{"ResourceId": calls[-1], "Key": "aws:autoscaling:groupName", "Value": "web-asg"}]}

    cache = tmp_path / CACHE_FILE
    no_tags: dict[str, str] = {}
    assert autoscaling_group_name(IID, no_tags.get, Ec2, cache=cache, region="eu-west-1") == "web-asg"
    assert autoscaling_group_name(IID, no_tags.get, Ec2, cache=cache, region="eu-west-1") == "web-asg"  # restart
    assert calls == [IID]
    assert autoscaling_group_name("i-0fffffffffffffff0", no_tags.get, Ec2, cache=cache,
                                  region="eu-west-1") == "web-asg"
    assert len(calls) == 2                          # another instance (an AMI with a stale state_dir) asks
    tags = {"meta-data/tags/instance": "Name"}
    assert autoscaling_group_name(IID, tags.get, Ec2, cache=cache) is None    # IMDS tags answer, for free
    assert len(calls) == 2


def test_an_unknown_instance_is_not_cached_as_no_group(moto: str, tmp_path: Path) -> None:
    """moto in server mode, the instance in eu-west-1: us-east-1's DescribeTags answers its id with no tags
    and no error. That is not "no group" (nothing cached); the home Region's answer is, either way."""
    from agent import aws

    ec2_home = aws.client("ec2", "eu-west-1", moto)
    ami = ec2_home.describe_images()["Images"][0]["ImageId"]
    grouped, plain = (ec2_home.run_instances(ImageId=ami, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
                      for _ in range(2))
    ec2_home.create_tags(Resources=[grouped], Tags=[{"Key": "aws:autoscaling:groupName", "Value": "web-asg"}])
    ec2_home.create_tags(Resources=[plain], Tags=[{"Key": "Name", "Value": "plain"}])
    cache = tmp_path / CACHE_FILE

    def ask(iid: str, region: str) -> Optional[str]:
        return autoscaling_group_name(iid, None, lambda: aws.client("ec2", region, moto), cache=cache,
                                      region=region)

    assert ask(grouped, "us-east-1") is None and not cache.exists()     # the wrong Region: unknown, not cached
    assert ask(grouped, "eu-west-1") == "web-asg"
    assert ask(plain, "eu-west-1") is None                              # known there, no group tag: an answer
    doc = json.loads(cache.read_text())
    assert (doc["instance_id"], doc["region"], doc["group"]) == (plain, "eu-west-1", None)
    # a cache from an older version (no Region: maybe another Region's empty answer) is asked again
    cache.write_text(json.dumps({"format": CACHE_FORMAT, "instance_id": grouped, "group": None,
                                 "source": "describe_tags", "time": 0}))
    assert ask(grouped, "eu-west-1") == "web-asg"
    assert ask(grouped, "us-east-1") is None                            # and another Region's cache is not ours
    # an instance with no tags at all: no group, asked again at the next start (nothing to prove the Region)
    bare = ec2_home.run_instances(ImageId=ami, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    assert ask(bare, "eu-west-1") is None
    assert bare not in cache.read_text()


# -- the cost model's targets (issue 20) ------------------------------------------------------------

def test_the_defaults_meet_the_fleet_targets() -> None:
    small, mid, big = cloudwatch_cost(10, 1), cloudwatch_cost(1000, 10), cloudwatch_cost(100_000, 100)
    assert mid.per_instance_month <= 0.50                     # all in: metrics, requests, alarms
    assert big.calls_per_second <= 0.5 * PUT_METRIC_DATA_TPS   # PutMetricData: 500 TPS per account and Region
    assert big.describe_tags_share <= 0.5                     # ec2:DescribeTags: 20 tokens a second
    assert small.per_instance_month < 1.0
    # the old behaviour, for comparison: every metric per instance, a call a minute
    old = cloudwatch_cost(1000, 10, dataclasses.replace(CloudWatchConfig(), flush_interval=60.0,
                                                        per_instance="always", aggregation_dimensions=[]),
                          hot_fraction=0.0)
    assert old.per_instance_month > 3.0 and old.calls_per_second * 100 > PUT_METRIC_DATA_TPS


def test_the_cost_table_in_the_docs_is_the_models() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "scripts" / "gen_cloudwatch_cost.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_cloudwatch_merges_the_instances_into_one_group_metric(moto: str) -> None:
    """Four real publishers, one group, moto in server mode: one metric, its Minimum the worst instance, its
    SampleCount the instances, the Sum of CreditExhausted the instances at the baseline."""
    from tests.cloudwatch.test_publisher import _STARTED, cw_client, wait_for

    base = math.floor(time.time() / 60) * 60 - 120
    pubs = []
    for i, (ratio, exhausted) in enumerate([(0.9, False), (0.15, True), (0.5, True), (0.8, False)]):
        c = dataclasses.replace(CloudWatchConfig(), enabled=True, region="us-east-1", endpoint_url=moto,
                                flush_interval=1.0, per_instance="never", include=["CreditExhausted"])
        pub = CloudWatchPublisher(c, instance_id=f"i-{i:017x}", instance_type=ITYPE, autoscaling_group="web-asg")
        _STARTED.append(pub)
        r = CreditReading("out", 1e8, ratio * 1e9, 1e9, ratio, 3e7, math.inf, exhausted=exhausted,
                          exhaustion_trend_seconds=3e7)
        for k in range(3):
            pub.observe(Snapshot(wall_time=base + k, interfaces=("eth0",), raw={}, totals={}, interface_rates={},
                                 instance_rates={"out": 1e8}, resets={}, sample_duration=0.001, samples_total=1,
                                 steps={}, credits={"out": r}, shaping=None))
        pub.start()
        pubs.append(pub)
    for pub in pubs:
        wait_for(lambda pub=pub: pub.snapshot().published > 0, 30, "each instance's first publish")
    cw = cw_client(moto)
    metrics = cw.list_metrics(Namespace="Burstwatch", MetricName="CreditRemainingRatio")["Metrics"]
    # one metric (moto lists it once per sender)
    assert {tuple((d["Name"], d["Value"]) for d in m["Dimensions"]) for m in metrics} == {
        (("AutoScalingGroupName", "web-asg"), ("Direction", "out"))}

    def stat(name: str) -> dict[str, Any]:
        from datetime import datetime, timezone
        resp = cw.get_metric_statistics(
            Namespace="Burstwatch", MetricName=name, Dimensions=metrics[0]["Dimensions"],
            StartTime=datetime.fromtimestamp(base, tz=timezone.utc),
            EndTime=datetime.fromtimestamp(base + 60, tz=timezone.utc), Period=60,
            Statistics=["Minimum", "SampleCount", "Sum"])
        (point,) = resp["Datapoints"]
        return point  # type: ignore[no-any-return]

    ratio = stat("CreditRemainingRatio")
    assert (ratio["Minimum"], ratio["SampleCount"]) == (pytest.approx(0.15), 4.0)
    assert stat("CreditExhausted")["Sum"] == 2.0
