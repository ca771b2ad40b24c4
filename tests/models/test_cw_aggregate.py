"""CloudWatch aggregation, wire sizes, batching within PutMetricData's limits, and the bounded backlog."""

from __future__ import annotations

import math
import urllib.parse

import pytest

from agent.models.cw_aggregate import (
    MAX_ABS_VALUE,
    MAX_DATUMS_PER_REQUEST,
    MAX_DIMENSIONS,
    SAFE_REQUEST_BYTES,
    Backlog,
    BatchLimits,
    Datum,
    PeriodAggregator,
    SeriesKey,
    pack,
    request_size,
)

NS = "Burstwatch"
RATIO_IN = SeriesKey("CreditRemainingRatio", "None", (("Direction", "in"),))
RATE_OUT = SeriesKey("ThroughputBytesPerSecond", "Bytes/Second", (("Direction", "out"),))


def datum(i: int = 0, dims: int = 3, value_len: int = 10, ts: float = 1_700_000_040.0) -> Datum:
    d = tuple((f"Dim{k}", f"{i:0{value_len}d}"[-value_len:]) for k in range(dims))
    return Datum(f"Metric{i % 7}", "Count", d, ts, 60.0, 0.1 * i, 0.0, float(i), 60)


def test_statistic_sets_per_period_and_close_only_complete_ones() -> None:
    agg = PeriodAggregator(60)
    t0 = 1_700_000_040.0                          # a multiple of 60
    for k, v in enumerate([0.5, 0.25, 1.0]):
        agg.add(t0 + 10 * k, RATIO_IN, v)
    agg.add(t0 + 59.9, RATE_OUT, 1000.0)
    agg.add(t0 + 60.0, RATE_OUT, 3000.0)          # next period
    assert len(agg) == 3
    common = (("InstanceId", "i-0abc"), ("InstanceType", "m5.large"))

    closed = agg.close(t0 + 60.5, common)
    by_name = {d.name: d for d in closed}
    assert set(by_name) == {"CreditRemainingRatio", "ThroughputBytesPerSecond"}
    r = by_name["CreditRemainingRatio"]
    assert (r.sample_count, r.total, r.minimum, r.maximum) == (3.0, 1.75, 0.25, 1.0)
    assert r.timestamp == t0 and r.storage_resolution == 60
    assert r.dims == common + (("Direction", "in"),)
    assert by_name["ThroughputBytesPerSecond"].total == 1000.0
    assert len(agg) == 1                          # the open period stays open ...
    assert agg.close(t0 + 100.0) == []
    rest = agg.close(t0 + 100.0, force=True)      # ... until forced (SIGTERM)
    assert [(d.timestamp, d.total) for d in rest] == [(t0 + 60, 3000.0)]
    assert len(agg) == 0


def test_high_resolution_periods() -> None:
    agg = PeriodAggregator(1)
    for k in range(10):
        agg.add(100.0 + k * 0.25, RATIO_IN, float(k))
    out = agg.close(103.0)
    assert [(d.timestamp, d.sample_count, d.storage_resolution) for d in out] == \
        [(100.0, 4.0, 1), (101.0, 4.0, 1), (102.0, 2.0, 1)]


def test_values_cloudwatch_rejects_are_dropped_or_clipped() -> None:
    agg = PeriodAggregator(60)
    assert agg.add(0.0, RATIO_IN, math.nan) is False
    assert agg.invalid == 1
    agg.add(0.0, RATE_OUT, math.inf)
    agg.add(0.0, RATE_OUT, -math.inf)
    (d,) = agg.close(60.0)
    assert (d.maximum, d.minimum) == (MAX_ABS_VALUE, -MAX_ABS_VALUE)


def test_aggregator_is_bounded() -> None:
    agg = PeriodAggregator(1, max_series=5)
    for k in range(8):                            # 8 periods of one series: only 5 fit
        assert agg.add(float(k), RATIO_IN, 1.0) is (k < 5)
    assert agg.refused == 3
    agg.add(0.5, RATIO_IN, 2.0)                   # an open series still takes samples
    assert agg.close(100.0)[0].sample_count == 2.0


@pytest.mark.parametrize("d", [
    datum(1),
    datum(2, dims=MAX_DIMENSIONS, value_len=1024),
    Datum("Näme & =", "Bytes/Second", (("Peer", "10.0.1.23:5201"), ("Direction", "in")), 1_700_000_001.25,
          3.0, 0.1 + 0.2, 1e-300, 123456789.123456789, 1),
    Datum("X", "Seconds", (), 1_700_000_000.0, 1.0, 31536000.0, 31536000.0, 31536000.0, 60),
])
def test_request_size_is_exactly_what_botocore_sends(d: Datum) -> None:
    import botocore.session
    from botocore.serialize import create_serializer

    op = botocore.session.get_session().get_service_model("cloudwatch").operation_model("PutMetricData")
    batch = [d, datum(3), d]
    req = create_serializer("query").serialize_to_request({"Namespace": NS, "MetricData":
                                                          [x.to_api() for x in batch]}, op)
    assert request_size(NS, batch) == len(urllib.parse.urlencode(req["body"]))


def test_pack_fills_requests_to_the_datum_limit() -> None:
    datums = [datum(i) for i in range(2500)]
    batches = pack(NS, datums)
    assert [len(b) for b in batches] == [1000, 1000, 500]
    assert [d for b in batches for d in b] == datums           # nothing lost, order kept
    assert all(request_size(NS, b) <= SAFE_REQUEST_BYTES for b in batches)


def test_pack_respects_the_byte_limit_with_big_datums() -> None:
    # 30 dimensions with 1024-character values: ~62 KB per datum, so bytes bind long before count
    datums = [datum(i, dims=MAX_DIMENSIONS, value_len=1024) for i in range(40)]
    batches = pack(NS, datums)
    sizes = [request_size(NS, b) for b in batches]
    assert sum(len(b) for b in batches) == len(datums) and len(sizes) >= 2, sizes   # all sent, bytes bind
    assert all(s <= SAFE_REQUEST_BYTES for s in sizes)
    per = len(batches[0])
    assert per < MAX_DATUMS_PER_REQUEST
    # greedy is tight: one more datum would not have fitted
    assert request_size(NS, datums[:per + 1]) > SAFE_REQUEST_BYTES
    assert len(batches) == math.ceil(40 / per)


def test_batch_limits_shrink_to_what_an_endpoint_takes() -> None:
    lim = BatchLimits()
    assert lim.limit_datums(20) is True and lim.max_datums == 20
    assert lim.limit_datums(20) is False
    lim = BatchLimits()
    while lim.halve():
        pass
    assert (lim.max_datums, lim.max_bytes) == (20, 40_000)     # never below the pre-2022 limits
    assert [len(b) for b in pack(NS, [datum(i) for i in range(45)], lim)] == [20, 20, 5]


def test_backlog_keeps_the_newest_and_counts_drops() -> None:
    b = Backlog(100)
    assert b.extend(datum(i) for i in range(150)) == 50
    assert len(b) == 100 and b.dropped["backlog_full"] == 50
    batch = b.peek_batch(NS, BatchLimits(max_datums=30))
    assert [d.total for d in batch] == [datum(i).total for i in range(50, 80)]  # oldest kept first
    b.pop(len(batch))
    assert len(b) == 70
    b.drop(10, "rejected")
    assert b.dropped["rejected"] == 10
    assert b.drop_all("shutdown") == 60 and len(b) == 0


def test_backlog_expires_what_cloudwatch_would_refuse() -> None:
    now = 1_700_000_000.0
    b = Backlog(10)
    b.extend([datum(0, ts=now - 15 * 86400), datum(1, ts=now - 86400), datum(2, ts=now)])
    assert b.expire(now) == 1
    assert len(b) == 2 and b.dropped["expired"] == 1


def test_zero_capacity_backlog_drops_everything() -> None:
    b = Backlog(0)
    assert b.extend([datum(0), datum(1)]) == 2
    assert b.peek_batch(NS, BatchLimits()) == []
