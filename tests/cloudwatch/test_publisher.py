"""The CloudWatch publisher end to end against moto in server mode, through a real HTTP proxy."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, NamedTuple, Optional

import pytest
from prometheus_client import CollectorRegistry

from agent import aws
from agent.aws import classify
from agent.cloudwatch.publisher import CloudWatchPublisher
from agent.config import CloudWatchConfig
from agent.exporters.cloudwatch import CloudWatchView
from agent.models.credit_model import CreditReading
from agent.models.figures import CLOUDWATCH_METRICS, DEFAULT_METRICS, EXHAUSTION_CAP_SECONDS
from agent.models.shaping import ShapingReading
from agent.readers.autoscaling import autoscaling_group_name
from agent.sampling.pipeline import Snapshot
from tests.support.throttle_proxy import ThrottleProxy

NS = "Burstwatch"
IID, ITYPE = "i-0123456789abcdef0", "m5.large"
COMMON = [{"Name": "InstanceId", "Value": IID}, {"Name": "InstanceType", "Value": ITYPE}]
STATS = ["SampleCount", "Sum", "Minimum", "Maximum"]


class Verdict(NamedTuple):
    check: str
    interface: Optional[str]
    status: str


class Probe(NamedTuple):
    peer: str
    direction: str
    bits_per_second: float
    success: bool


def snapshot(t: float, credits: Optional[dict[str, CreditReading]] = None,
             rates: Optional[dict[str, float]] = None, shaping: Optional[ShapingReading] = None) -> Snapshot:
    """A real sampler Snapshot with only what the publisher reads filled in."""
    return Snapshot(wall_time=t, interfaces=("eth0",), raw={}, totals={}, interface_rates={},
                    instance_rates=rates, resets={}, sample_duration=0.001, samples_total=1, steps={},
                    credits=credits, shaping=shaping)


def rising(k: int, step: dict[str, int]) -> ShapingReading:
    """The sampler's shaping reading for the k-th sample of counters rising by `step` a sample: the first
    only sets the baseline (no increase)."""
    return ShapingReading("ethtool", {} if k == 0 else dict(step), {d: k * n for d, n in step.items()})


def reading(d: str, ratio: float, exhaustion: float, rate: float, trend: float = math.inf) -> CreditReading:
    bucket = 337.5e9
    return CreditReading(d, rate, ratio * bucket, bucket, ratio, exhaustion, math.inf,
                         exhaustion_trend_seconds=trend)


_STARTED: list[CloudWatchPublisher] = []


def make_publisher(endpoint: str, period: int = 60, flush_interval: float = 1.0,
                   **kw: Any) -> CloudWatchPublisher:
    # Per instance, every period, no group metrics: the behaviour these tests pin (per_instance = "always",
    # aggregation_dimensions = []); the defaults are tested in test_groups.py.
    extra: dict[str, Any] = {"per_instance": "always", "aggregation_dimensions": []}
    extra.update({k: kw.pop(k) for k in ("include", "dimensions", "backlog", "per_instance",
                                         "aggregation_dimensions") if k in kw})
    cfg = dataclasses.replace(CloudWatchConfig(), enabled=True, region="us-east-1", endpoint_url=endpoint,
                              period=period, flush_interval=flush_interval, **extra)
    pub = CloudWatchPublisher(cfg, instance_id=IID, instance_type=ITYPE, **kw)
    _STARTED.append(pub)
    return pub


@pytest.fixture(autouse=True)
def _publishers_end_with_their_test() -> Iterator[None]:
    """A publisher thread still in a request must not write into the next test's (reset) moto."""
    yield
    while _STARTED:
        pub = _STARTED.pop()
        pub.stop(0.0)
        if pub._thread is not None:
            pub._thread.join(60)


def cw_client(endpoint: str) -> Any:
    return aws.client("cloudwatch", "us-east-1", endpoint)


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def statistics(cw: Any, metric: str, dims: list[dict[str, str]], start: float, end: float,
               period: int) -> dict[float, dict[str, Any]]:
    resp = cw.get_metric_statistics(Namespace=NS, MetricName=metric, Dimensions=dims, StartTime=utc(start),
                                     EndTime=utc(end), Period=period, Statistics=STATS)
    return {p["Timestamp"].timestamp(): p for p in resp["Datapoints"]}


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def first_calls(n: int, results: list[Probe]) -> Callable[[], list[Probe]]:
    """A probes callable that has results for its first `n` calls only (probes that ran once)."""
    calls = [0]

    def probes() -> list[Probe]:
        calls[0] += 1
        return results if calls[0] <= n else []

    return probes


def expected_sets(samples: list[tuple[float, float]], period: int) -> dict[float, tuple[float, ...]]:
    """(SampleCount, Sum, Minimum, Maximum) per period start, computed the plain way."""
    groups: dict[float, list[float]] = {}
    for t, v in samples:
        groups.setdefault(math.floor(t / period) * period, []).append(v)
    return {k: (float(len(v)), sum(v), min(v), max(v)) for k, v in groups.items()}


def assert_stats_match(got: dict[float, dict[str, Any]], want: dict[float, tuple[float, ...]],
                       unit: str) -> None:
    assert sorted(got) == sorted(want)
    for ts, (count, total, lo, hi) in want.items():
        p = got[ts]
        assert p["SampleCount"] == count, ts
        assert p["Sum"] == pytest.approx(total, rel=1e-9, abs=1e-9), ts
        assert (p["Minimum"], p["Maximum"]) == (pytest.approx(lo), pytest.approx(hi)), ts
        assert p["Unit"] == unit


# -- the default set arrives as published -------------------------------------------------------

def test_default_set_arrives_with_names_dimensions_units_and_values(moto: str, proxy: ThrottleProxy) -> None:
    probes = [Probe("10.0.1.23:5201", "out", 4.2e9, True), Probe("10.0.1.24", "in", 3.0e9, False)]
    verdicts = [Verdict("ena_driver", "eth0", "fail"), Verdict("mtu", "eth0", "warn"),
                Verdict("queues", "eth0", "ok"), Verdict("path_mtu", None, "fail")]
    pub = make_publisher(proxy.url, period=60, checks=lambda: verdicts, probes=lambda: probes)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CloudWatchView(pub.snapshot))
    pub.start()

    # Two whole minutes of 1 s samples, in the past, so both periods are complete at the first flush.
    base = math.floor(time.time() / 60) * 60 - 240
    fed: dict[tuple[str, str], list[tuple[float, float]]] = {}
    shaping = {"in": 1000, "out": 50}
    for k in range(120):
        t = base + k + 0.5
        draining = k >= 70
        # `in` drains in bursts from k = 70: the instant forecast flips to +Inf every third sample, the
        # trend holds (and is +Inf before the drain)
        cr = {"in": reading("in", 1.0 - k / 400, 300.0 - k if draining and k % 3 else math.inf, 1.25e9,
                            320.0 - k if draining else math.inf),
              "out": reading("out", 0.9, math.inf, 1e6 + k)}
        rates = {"in": 1.25e9 + k, "out": 1e6 + k}
        old = dict(shaping)
        shaping["in"] += 10 * k
        if k == 90:
            shaping["out"] = 3                    # driver reset: the sampler counts from zero again
        elif k % 30 == 0:
            shaping["out"] += 7
        # the increase the sampler hands on (the first reading is only a baseline)
        inc = {} if k == 0 else {d: shaping[d] - old[d] if shaping[d] >= old[d] else shaping[d] for d in shaping}
        pub.observe(snapshot(t, cr, rates, ShapingReading("ethtool", inc, dict(shaping))))
        for d in ("in", "out"):
            fed.setdefault(("CreditRemainingRatio", d), []).append((t, cr[d].ratio or 0.0))
            fed.setdefault(("CreditExhaustionSeconds", d), []).append(
                (t, min(cr[d].exhaustion_seconds, EXHAUSTION_CAP_SECONDS)))
            fed.setdefault(("CreditExhaustionTrendSeconds", d), []).append(
                (t, min(cr[d].exhaustion_trend_seconds, EXHAUSTION_CAP_SECONDS)))
            fed.setdefault(("ThroughputBytesPerSecond", d), []).append((t, rates[d]))
            if d in inc:
                fed.setdefault(("ShapingEvents", d), []).append((t, float(inc[d])))

    # the regular flush (every second here) sends both closed minutes in one request
    wait_for(lambda: pub.snapshot().published >= 20, 20, "the first flush")
    started = time.monotonic()
    pub.stop(1.5)                                  # SIGTERM's flush: checks, probes, open period
    assert time.monotonic() - started < 1.5
    st = pub.snapshot()
    assert st.backlog == 0 and not any(st.dropped.values()) and st.requests["error"] == 0
    puts = proxy.puts()
    # one call per flush, as few as possible: both minutes, the checks and the probes in the first;
    # each later flush (the one at stop, maybe one more) carries the service figures again
    assert puts[0].datums == 24 + 3                # 2 minutes x 6 metrics x 2 directions, checks, probes
    assert len(puts) == st.requests["success"] and all(r.datums == 3 for r in puts[1:])
    assert st.published == 24 + 3 * len(puts)

    cw = cw_client(moto)
    for (metric, d), samples in fed.items():
        got = statistics(cw, metric, [*COMMON, {"Name": "Direction", "Value": d}], base, base + 120, 60)
        assert_stats_match(got, expected_sets(samples, 60), CLOUDWATCH_METRICS[metric].unit)
    # +Inf went out as the year-long cap, and the forecast minimum is what an alarm sees
    got = statistics(cw, "CreditExhaustionSeconds", [*COMMON, {"Name": "Direction", "Value": "in"}],
                     base, base + 120, 60)
    assert got[base]["Maximum"] == EXHAUSTION_CAP_SECONDS
    assert got[base + 60]["Minimum"] == 300.0 - 119
    # the trend: the year-long cap before the drain, then its own minimum (what the alarm's MIN reads)
    trend = statistics(cw, "CreditExhaustionTrendSeconds", [*COMMON, {"Name": "Direction", "Value": "in"}],
                       base, base + 120, 60)
    assert trend[base]["Minimum"] == EXHAUSTION_CAP_SECONDS
    assert (trend[base + 60]["Minimum"], trend[base + 60]["Maximum"]) == (320.0 - 119, EXHAUSTION_CAP_SECONDS)

    now = time.time()
    failed = statistics(cw, "FailedChecks", COMMON, now - 600, now + 60, 60)
    assert {p["Maximum"] for p in failed.values()} == {2.0}     # sampled once per flush
    assert {p["Unit"] for p in failed.values()} == {"Count"}
    for probe, value in ((probes[0], 4.2e9), (probes[1], 0.0)):
        dims = [*COMMON, {"Name": "Peer", "Value": probe.peer}, {"Name": "Direction", "Value": probe.direction}]
        got = statistics(cw, "ProbeThroughputBitsPerSecond", dims, now - 600, now + 60, 60)
        assert got and {p["Maximum"] for p in got.values()} == {value}
        assert {p["Unit"] for p in got.values()} == {"Bits/Second"}

    # exactly the documented default set, each with exactly its dimensions (one custom metric each)
    listed = cw.list_metrics(Namespace=NS)["Metrics"]
    # (a set: moto 5.0's ListMetrics repeats a metric once per datapoint when it has several dimensions)
    have = sorted({(m["MetricName"], tuple((x["Name"], x["Value"]) for x in m["Dimensions"])) for m in listed})
    common = ((("InstanceId", IID), ("InstanceType", ITYPE)))
    want = sorted([(m, (*common, ("Direction", d))) for m in ("CreditRemainingRatio", "CreditExhaustionSeconds",
                   "CreditExhaustionTrendSeconds", "CreditExhaustionEarliestSeconds", "ThroughputBytesPerSecond",
                   "ShapingEvents")
                   for d in ("in", "out")]
                  + [("FailedChecks", common)]
                  + [("ProbeThroughputBitsPerSecond", (*common, ("Peer", p.peer), ("Direction", p.direction)))
                     for p in probes])
    assert have == want
    assert {m for m, _ in have} == set(DEFAULT_METRICS)

    # the self metrics on /metrics
    assert reg.get_sample_value("burstwatch_cloudwatch_datapoints_published_total") == st.published
    assert reg.get_sample_value("burstwatch_cloudwatch_backlog_datapoints") == 0
    assert reg.get_sample_value("burstwatch_cloudwatch_datapoints_dropped_total",
                                {"reason": "backlog_full"}) == 0
    assert reg.get_sample_value("burstwatch_cloudwatch_last_success_timestamp_seconds") == \
        pytest.approx(time.time(), abs=30)
    assert reg.get_sample_value("burstwatch_cloudwatch_requests_total", {"result": "success"}) == len(puts)


def test_timestamped_probe_results_are_published_once_in_the_period_they_ran(
        moto: str, proxy: ThrottleProxy) -> None:
    from agent.probes.service import ProbeResult

    base = math.floor(time.time() / 60) * 60 - 180
    results = [ProbeResult("10.0.1.23:5201", "out", True, base + 12.0, 5.0, bytes=10**9,
                           throughput_bytes_per_second=5e8),
               ProbeResult("10.0.1.24:5201", "in", False, base + 13.0, 5.0, error="refused")]
    reads: list[int] = []

    def probes() -> list[ProbeResult]:
        reads.append(1)                            # once per flush (Aggregation.sample_services)
        return results

    pub = make_publisher(proxy.url, probes=probes)
    pub.start()
    wait_for(lambda: pub.snapshot().published >= 2, 20, "the probe results")
    seen = len(reads)
    # Two more flushes read the same results (proof by count, not by a pause): they are not sent again.
    wait_for(lambda: len(reads) >= seen + 2, 20, "two more flushes")
    pub.stop(1.5)
    assert pub.snapshot().published == 2
    cw = cw_client(moto)
    for peer, d, value in (("10.0.1.23:5201", "out", 4e9), ("10.0.1.24:5201", "in", 0.0)):
        dims = [*COMMON, {"Name": "Peer", "Value": peer}, {"Name": "Direction", "Value": d}]
        got = statistics(cw, "ProbeThroughputBitsPerSecond", dims, base - 600, base + 600, 60)
        assert list(got) == [base]
        assert (got[base]["SampleCount"], got[base]["Sum"]) == (1.0, value)


def test_include_and_extra_dimensions(moto: str, proxy: ThrottleProxy, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        pub = make_publisher(proxy.url, include=["CreditBucketBytes", "Shaped", "NoSuchMetric"],
                             dimensions={"Environment": "prod", "Team": "net"})
    assert "NoSuchMetric" in caplog.text
    pub.start()
    base = math.floor(time.time() / 60) * 60 - 120
    cr = {"in": reading("in", 0.5, math.inf, 1.0), "out": reading("out", 0.5, math.inf, 1.0)}
    cr["in"] = dataclasses.replace(cr["in"], shaped=True)
    for k in range(3):
        pub.observe(snapshot(base + k, cr, None, None))
    pub.stop(1.5)
    cw = cw_client(moto)
    dims = [*COMMON, {"Name": "Environment", "Value": "prod"}, {"Name": "Team", "Value": "net"},
            {"Name": "Direction", "Value": "in"}]
    got = statistics(cw, "CreditBucketBytes", dims, base, base + 60, 60)
    assert got[base]["Maximum"] == 337.5e9 and got[base]["Unit"] == "Bytes"
    assert statistics(cw, "Shaped", dims, base, base + 60, 60)[base]["Sum"] == 3.0
    # throughput falls back to the credit model's rate when the snapshot has no instance rates
    assert statistics(cw, "ThroughputBytesPerSecond", dims, base, base + 60, 60)[base]["SampleCount"] == 3
    names = {m["MetricName"] for m in cw.list_metrics(Namespace=NS)["Metrics"]}
    assert "NoSuchMetric" not in names and {"CreditBucketBytes", "Shaped"} <= names


# -- retries, errors and limits -----------------------------------------------------------------

def _feed_past_minute(pub: CloudWatchPublisher, minutes_ago: int = 2) -> float:
    base = math.floor(time.time() / 60) * 60 - 60 * minutes_ago
    cr = {d: reading(d, 0.75, math.inf, 1e8) for d in ("in", "out")}
    for k in range(10):
        pub.observe(snapshot(base + k, cr, {"in": 1e8, "out": 2e8}, rising(k, {"in": 1, "out": 0})))
    return base


def test_throttling_is_retried_by_botocore(moto: str, proxy: ThrottleProxy) -> None:
    proxy.fail_next(2, "Throttling", 400, "Rate exceeded")
    pub = make_publisher(proxy.url)
    pub.start()
    base = _feed_past_minute(pub)
    wait_for(lambda: pub.snapshot().published > 0, 30, "a publish after throttling")
    pub.stop(1.5)
    assert [r.status for r in proxy.puts()] == [400, 400, 200]   # one PutMetricData call, retried twice
    st = pub.snapshot()
    assert st.errors["throttling"] == 0 and st.requests == {"success": 1, "error": 0}
    got = statistics(cw_client(moto), "ThroughputBytesPerSecond",
                     [*COMMON, {"Name": "Direction", "Value": "out"}], base, base + 60, 60)
    assert got[base]["SampleCount"] == 10 and got[base]["Sum"] == 2e9


def test_persistent_errors_are_logged_once_per_kind_and_lose_nothing(
        moto: str, proxy: ThrottleProxy, caplog: pytest.LogCaptureFixture) -> None:
    # 2 throttles outlast one call's 2 attempts (max_attempts is botocore's retry count); then 2
    # credential failures (not retried by botocore)
    proxy.fail_next(2, "Throttling", 400, "Rate exceeded")
    proxy.fail_next(2, "InvalidClientTokenId", 403, "The security token included in the request is invalid.")
    pub = make_publisher(proxy.url, max_attempts=1)
    caplog.set_level(logging.INFO, logger="agent.cloudwatch.publisher")
    pub.start()
    base = _feed_past_minute(pub)
    wait_for(lambda: pub.snapshot().published > 0, 30, "recovery")
    pub.stop(1.5)
    st = pub.snapshot()
    assert st.errors["throttling"] == 1
    assert st.errors["credentials"] == 2
    assert [r.status for r in proxy.puts()] == [400, 400, 403, 403, 200]
    assert not any(st.dropped.values()) and st.backlog == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("throttling error" in m for m in warnings) == 1
    assert sum("credentials error" in m for m in warnings) == 1
    assert any("works again" in r.getMessage() for r in caplog.records)
    got = statistics(cw_client(moto), "ShapingEvents", [*COMMON, {"Name": "Direction", "Value": "in"}],
                     base, base + 60, 60)
    assert got[base]["Sum"] == 9.0                  # 0..9: the increase over the minute


def test_batches_respect_the_api_limits(moto: str, proxy: ThrottleProxy) -> None:
    # 1250 peers: every flush makes 1250 probe datums; while the endpoint is down they pile up
    peers = [Probe(f"10.1.{i // 250}.{i % 250}", "out", 1e9 + i, True) for i in range(1250)]
    proxy.down()
    pub = make_publisher(proxy.url, period=1, probes=first_calls(2, peers), max_attempts=0)
    pub.start()
    wait_for(lambda: pub.snapshot().backlog >= 2500, 30, "a backlog of 2 flushes")
    proxy.up()
    wait_for(lambda: pub.snapshot().backlog == 0, 60, "the backlog to drain")
    pub.stop(1.5)
    st = pub.snapshot()
    puts = proxy.puts()
    assert puts and all(r.status == 200 for r in puts)
    assert all(r.datums <= 1000 and r.body_bytes <= 1_000_000 and r.max_dimensions <= 30 for r in puts)
    # as few calls as the limits allow: every call but the last of a drain is full
    assert sum(r.datums for r in puts) == st.published
    assert max(r.datums for r in puts) == 1000
    assert len(puts) <= math.ceil(st.published / 1000) + 2   # + the trailing partial flushes
    cw = cw_client(moto)
    listed = cw.get_paginator("list_metrics").paginate(Namespace=NS).build_full_result()["Metrics"]
    assert len({tuple(d["Value"] for d in m["Dimensions"]) for m in listed}) == 1250


def test_big_dimensions_bind_on_bytes(moto: str, proxy: ThrottleProxy) -> None:
    # 26 extra dimensions of 1000 characters: at most 28 fit beside Peer and Direction (30 in all)
    extra = {f"Tag{i:02d}": chr(ord("a") + i % 26) * 1000 for i in range(26)}
    peers = [Probe(f"10.2.0.{i}", "in", 5e8, True) for i in range(40)]
    proxy.down()
    pub = make_publisher(proxy.url, period=1, probes=first_calls(1, peers), dimensions=extra, max_attempts=0)
    pub.start()
    wait_for(lambda: pub.snapshot().backlog >= 40, 30, "a backlog")
    proxy.up()
    wait_for(lambda: pub.snapshot().backlog == 0 and pub.snapshot().published >= 40, 60, "the drain")
    pub.stop(1.5)
    puts = proxy.puts()
    assert all(r.status == 200 and r.body_bytes <= 1_000_000 and r.max_dimensions == 30 for r in puts)
    assert max(r.body_bytes for r in puts) > 500_000                # the byte limit, not the count, bound
    assert max(r.datums for r in puts) < 40


def test_old_20_datum_limit_is_learned(moto: str, proxy: ThrottleProxy, caplog: pytest.LogCaptureFixture) -> None:
    proxy.max_datums = 20        # what CloudWatch answered before 2022
    pub = make_publisher(proxy.url, include=["CreditRemainingBytes", "CreditBucketBytes", "Shaped"])
    pub.start()
    base = math.floor(time.time() / 60) * 60 - 300
    for minute in range(3):
        cr = {d: reading(d, 0.5, 100.0, 1.0) for d in ("in", "out")}
        pub.observe(snapshot(base + 60 * minute, cr, {"in": 1.0, "out": 1.0}, None))
    wait_for(lambda: pub.snapshot().published >= 3 * 12, 30, "delivery in 20-datum batches")
    pub.stop(1.5)
    puts = proxy.puts()
    assert [r.status for r in puts].count(400) == 1
    assert all(r.datums <= 20 for r in puts if r.status == 200)
    assert not any(pub.snapshot().dropped.values())
    assert "at most 20 datapoints" in caplog.text


def test_observe_never_waits_on_a_hung_endpoint(moto: str, proxy: ThrottleProxy,
                                                caplog: pytest.LogCaptureFixture) -> None:
    proxy.release.clear()                          # requests are accepted and never answered
    pub = make_publisher(proxy.url, period=1)
    pub.start()
    wait_for(lambda: len(proxy.records) == 0 and pub.snapshot().requests["success"] == 0, 1, "start")
    cr = {d: reading(d, 0.5, 100.0, 1.0) for d in ("in", "out")}
    worst = 0.0
    end = time.monotonic() + 3.0                   # spans flushes that block on the proxy
    n = 0
    while time.monotonic() < end:
        s = snapshot(time.time(), cr, {"in": 1.0, "out": 2.0}, rising(n, {"in": 1, "out": 1}))
        t0 = time.perf_counter()
        pub.observe(s)
        worst = max(worst, time.perf_counter() - t0)
        n += 1
        time.sleep(0.01)
    assert proxy.records, "the publisher should be stuck in a request by now"
    # observe() only hands the sample over: microseconds. Waiting on the hung request would take the client's
    # read timeout (10 s, agent/aws.py). 0.25 s leaves a margin of 40x below that and far above microseconds.
    assert worst < 0.25, f"observe took {worst * 1000:.1f} ms while the endpoint hung"
    started = time.monotonic()
    pub.stop(1.0)                                  # a request is in flight: stop still keeps its deadline
    assert time.monotonic() - started < 1.3
    assert "not sent" in caplog.text
    proxy.release.set()


def test_client_errors_are_classified() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    def ce(code: str, status: int, msg: str = "") -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": msg}, "ResponseMetadata": {"HTTPStatusCode": status}},
                           "PutMetricData")

    def kind(exc: BaseException) -> tuple[str, Optional[int]]:
        err = classify(exc)
        return err.kind, err.limit

    assert kind(ce("Throttling", 400)) == ("throttling", None)
    assert kind(ce("AccessDenied", 403)) == ("credentials", None)
    assert kind(ce("InternalServiceFault", 500)) == ("server", None)
    assert kind(ce("InvalidParameterValue", 400, "bad")) == ("rejected", None)
    assert kind(ce("InvalidParameterValue", 400,
                   "The collection MetricData must not have a size greater than 20.")) == ("too_large", 20)
    assert kind(ce("RequestEntityTooLarge", 413)) == ("too_large", None)
    assert kind(NoCredentialsError()) == ("credentials", None)
    assert kind(EndpointConnectionError(endpoint_url="http://x")) == ("network", None)
    # the service's code comes along, and an answer tells "refused" from "no credentials at all"
    assert classify(ce("AccessDenied", 403)).code == "AccessDenied" and classify(NoCredentialsError()).code == ""


def test_rejected_batches_are_dropped_not_retried_forever(moto: str, proxy: ThrottleProxy) -> None:
    proxy.fail_next(1, "InvalidParameterValue", 400, "The value for parameter MetricData is invalid.")
    pub = make_publisher(proxy.url)
    pub.start()
    _feed_past_minute(pub)
    wait_for(lambda: pub.snapshot().dropped["rejected"] > 0, 20, "the rejection")
    pub.stop(1.5)
    st = pub.snapshot()
    assert st.dropped["rejected"] == st.failed == 12 and st.backlog == 0   # 6 metrics x 2 directions


def test_backlog_bound_keeps_the_newest(moto: str, proxy: ThrottleProxy) -> None:
    proxy.down()
    pub = make_publisher(proxy.url, period=1, backlog=20, max_attempts=0)
    pub.start()
    base = math.floor(time.time()) - 30
    cr = {d: reading(d, 0.5, 100.0, 1.0) for d in ("in", "out")}
    for k in range(10):                            # 10 seconds x 10 series = 100 datums for 20 places
        pub.observe(snapshot(base + k, cr, {"in": float(k), "out": 1.0}, None))
    wait_for(lambda: pub.snapshot().dropped["backlog_full"] == 80, 20, "the backlog to overflow")
    proxy.up()
    wait_for(lambda: pub.snapshot().published == 20, 30, "the drain")
    pub.stop(1.5)
    got = statistics(cw_client(moto), "ThroughputBytesPerSecond", [*COMMON, {"Name": "Direction", "Value": "in"}],
                     base, base + 10, 1)
    assert sorted(got) == [float(base + k) for k in range(10 - len(got), 10)]   # the newest seconds
    assert len(got) == 2                           # 20 places hold 2 seconds of 10 series


# -- the Auto Scaling group dimension -----------------------------------------------------------

def test_autoscaling_group_from_imds_tags_or_describe_tags(moto: str) -> None:
    tags = {"meta-data/tags/instance": "Name\naws:autoscaling:groupName",
            "meta-data/tags/instance/aws:autoscaling:groupName": "web-asg"}
    assert autoscaling_group_name(IID, tags.get) == "web-asg"
    assert autoscaling_group_name(IID, {"meta-data/tags/instance": "Name"}.get) is None

    asg = aws.client("autoscaling", "us-east-1", moto)
    asg.create_launch_configuration(LaunchConfigurationName="lc", ImageId="ami-12c6146b", InstanceType=ITYPE)
    asg.create_auto_scaling_group(AutoScalingGroupName="web-asg", LaunchConfigurationName="lc", MinSize=1,
                                  MaxSize=1, DesiredCapacity=1, AvailabilityZones=["us-east-1a"])
    iid = asg.describe_auto_scaling_instances()["AutoScalingInstances"][0]["InstanceId"]
    ec2 = lambda: aws.client("ec2", "us-east-1", moto)  # noqa: E731
    no_tags_in_imds: dict[str, str] = {}
    assert autoscaling_group_name(iid, no_tags_in_imds.get, ec2) == "web-asg"
    assert autoscaling_group_name("i-00000000000000000", None, ec2) is None

    # and the publisher resolves it in its own thread, before the first datum is built
    pub = make_publisher(moto, autoscaling_group=lambda: autoscaling_group_name(iid, None, ec2))
    pub.start()
    base = _feed_past_minute(pub)
    # (sent at the next 1-s flush; waiting for it, not for a stop's 1.5 s, keeps a loaded host from failing)
    wait_for(lambda: pub.snapshot().published > 0, 30, "the first publish")
    pub.stop(1.5)
    dims = {tuple((d["Name"], d["Value"]) for d in m["Dimensions"])
            for m in cw_client(moto).list_metrics(Namespace=NS)["Metrics"]}
    assert ((("InstanceId", IID), ("InstanceType", ITYPE), ("AutoScalingGroupName", "web-asg"),
             ("Direction", "in"))) in dims
    assert base > 0


def test_stop_before_start_and_observe_after_stop_are_harmless() -> None:
    pub = make_publisher("http://127.0.0.1:9")
    pub.stop(0.1)
    pub.observe(snapshot(time.time(), None, {"in": 1.0, "out": 1.0}, None))
    assert len(pub._agg) == 0
    assert threading.active_count() >= 1


def test_view_describes_its_families_so_duplicates_are_refused() -> None:
    pub = make_publisher("http://127.0.0.1:9")
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CloudWatchView(pub.snapshot))
    with pytest.raises(ValueError, match="Duplicated"):
        reg.register(CloudWatchView(pub.snapshot))
    assert reg.get_sample_value("burstwatch_cloudwatch_datapoints_published_total") == 0
    assert reg.get_sample_value("burstwatch_cloudwatch_errors_total", {"kind": "network"}) == 0


def test_shaping_events_are_the_samplers_increase() -> None:
    """The publisher sends the increase the sampler computed, whatever the totals did (no rule of its own)."""
    pub = make_publisher("http://127.0.0.1:9", period=60)
    t = math.floor(time.time() / 60) * 60 - 120
    pub.observe(snapshot(t, shaping=ShapingReading("ethtool", {}, {"in": 500})))           # baseline
    pub.observe(snapshot(t + 1, shaping=ShapingReading("ethtool", {"in": 7}, {"in": 507})))
    pub.observe(snapshot(t + 2, shaping=ShapingReading("tc", {"in": 3, "out": 0}, {"in": 3, "out": 0})))
    datums = {(d.name, d.dims[-1][1]): d for d in pub._agg.close(t + 60)}
    assert (datums["ShapingEvents", "in"].sample_count, datums["ShapingEvents", "in"].total) == (2.0, 10.0)
    assert datums["ShapingEvents", "out"].total == 0.0
