"""The fleet document, its parser and the consensus (agent/models/fleet.py): pure, table-driven."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

import pytest

from agent.models.fleet import (
    ALLOWANCE_FIELDS,
    BUCKET_FIELDS,
    FIELDS,
    FORMAT,
    MAX_OBJECT_BYTES,
    OUTLIER_FACTOR,
    AllowanceConsensus,
    Consensus,
    LearnedRecord,
    Rejected,
    allowance_consensus,
    allowance_record,
    consensus,
    encode,
    is_allowance_line,
    learned_record,
    object_key,
    parse_object,
    publishable,
    type_prefix,
    worth_publishing,
)

DAY = 86400.0
NOW = 1_763_900_000.0
KEY = "burstwatch/learned/type=m5.large/i-0123456789abcdef0-1763900000.json"


def record(**over: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        instance_type="m5.large", instance_id="i-0123456789abcdef0", region="us-east-1",
        availability_zone="us-east-1a", direction="out", bucket_bytes=337_500_000_000.0, method="exhaustion",
        learned_count=1, baseline_bytes_per_second=93_750_000.0, baseline_source="catalogue",
        peak_bytes_per_second=1_250_000_000.0, peak_source="catalogue", driver="ena", driver_version="2.8.1g",
        learned_at=NOW, agent_version="0.x")
    fields.update(over)
    return learned_record(**fields)


# -- keys ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix,itype,iid,epoch,key", [
    ("burstwatch/", "m5.large", "i-0123456789abcdef0", 1763900000.7,
     "burstwatch/learned/type=m5.large/i-0123456789abcdef0-1763900000.json"),
    ("", "m5.large", "i-0abc", 5, "learned/type=m5.large/i-0abc-5.json"),
    ("p", "c6gn.medium", "i-1", 7, "p/learned/type=c6gn.medium/i-1-7.json"),              # "/" added
    ("p/", "x/../y", "a b", 7, "p/learned/type=x_.._y/a_b-7.json"),                      # sanitised
    ("p/", "m5.large", None, 7, "p/learned/type=m5.large/unknown-7.json"),
])
def test_object_key(prefix: str, itype: str, iid: Optional[str], epoch: float, key: str) -> None:
    assert object_key(prefix, itype, iid, epoch) == key
    assert key.startswith(type_prefix(prefix, itype))


# -- the document --------------------------------------------------------------------------------------------
def test_learned_record_has_every_field_in_order_and_nulls() -> None:
    r = learned_record(instance_type="m5.large", direction="in", bucket_bytes=10)
    assert list(r) == [*FIELDS, *ALLOWANCE_FIELDS]
    assert r["format"] == FORMAT and r["bucket_bytes"] == 10.0 and isinstance(r["bucket_bytes"], float)
    assert r["instance_id"] is None and r["driver"] is None


@pytest.mark.parametrize("over", [
    {"direction": "both"}, {"direction": None}, {"bucket_bytes": 0}, {"bucket_bytes": -1.0},
    {"bucket_bytes": math.nan}, {"bucket_bytes": math.inf}, {"bucket_bytes": True}, {"bucket_bytes": "1"},
    {"colour": "red"},
])
def test_learned_record_refuses_bad_values(over: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        record(**over)


def test_encode_is_one_json_line_per_record_and_round_trips() -> None:
    recs = [record(direction="in", bucket_bytes=1e11), record(direction="out")]
    body = encode(recs)
    assert body.endswith(b"\n") and body.count(b"\n") == 2
    assert [json.loads(line) for line in body.splitlines()] == recs
    parsed = parse_object(KEY, body, "m5.large")
    assert parsed == [LearnedRecord("i-0123456789abcdef0", "in", 1e11, NOW, 93_750_000.0, KEY),
                      LearnedRecord("i-0123456789abcdef0", "out", 337_500_000_000.0, NOW, 93_750_000.0, KEY)]


def test_missing_instance_id_falls_back_to_the_key_name() -> None:
    (r,) = parse_object(KEY, encode([record(instance_id=None)]), "m5.large")
    assert r.instance_id == "i-0123456789abcdef0"


def _line(**over: Any) -> bytes:
    doc = record()
    doc.update(over)
    return json.dumps(doc).encode() + b"\n"


def _without(field: str) -> bytes:
    doc = record()
    del doc[field]
    return json.dumps(doc).encode()


@pytest.mark.parametrize("body,why", [
    (b"\xff\xfe not utf-8", "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"", "no records"),
    (b"\n\n", "no records"),
    (b"[1, 2]", "not a JSON object"),
    (b'"text"', "not a JSON object"),
    (_line(format="burstwatch-learned/2"), "format"),
    (_line(format=None), "format"),
    (_without("bucket_bytes"), "missing bucket_bytes"),
    (_without("driver"), "missing driver"),
    (_line(bucket_bytes=0), "bucket_bytes"),
    (_line(bucket_bytes=-5.0), "bucket_bytes"),
    (_line(bucket_bytes="1e11"), "bucket_bytes"),
    (_line(bucket_bytes=None), "bucket_bytes"),
    (_line(bucket_bytes=True), "bucket_bytes"),
    (_line().replace(b"337500000000.0", b"NaN"), "bucket_bytes"),
    (_line().replace(b"337500000000.0", b"Infinity"), "bucket_bytes"),
    (_line().replace(b"337500000000.0", b"1e400"), "bucket_bytes"),
    (_line(direction="sideways"), "direction"),
    (_line(learned_at=None), "learned_at"),
    (_line(learned_at="yesterday"), "learned_at"),
    (_line(learned_count=1.5), "learned_count"),
    (_line(instance_id=42), "instance_id"),
    (_line(instance_type=None), "instance_type"),
    (_line(baseline_bytes_per_second="fast"), "baseline_bytes_per_second"),
    (_line() + b"garbage\n", "line 2"),                 # one bad line condemns the object
    (b" " * (MAX_OBJECT_BYTES + 1), "bytes, more than"),
])
def test_garbage_of_every_kind_is_rejected(body: bytes, why: str) -> None:
    with pytest.raises(Rejected) as exc:
        parse_object(KEY, body, "m5.large")
    assert exc.value.reason == "garbage"
    assert why in exc.value.detail


@pytest.mark.parametrize("key,body", [
    (KEY, _line(instance_type="c5.large")),                                            # another type's record
    (KEY.replace("type=m5.large", "type=c5.large"), _line()),                         # another partition
    ("burstwatch/learned/type=m5.large/sub/x-1.json", _line()),                      # nested below it
    ("burstwatch/learned/type=m5.large/", _line()),                                   # the folder itself
    ("burstwatch/notlearned/type=m5.large/i-1-1.json", _line()),
    ("burstwatch/xlearned/type=m5.large/i-1-1.json", _line()),
])
def test_foreign_objects_are_rejected(key: str, body: bytes) -> None:
    with pytest.raises(Rejected) as exc:
        parse_object(key, body, "m5.large")
    assert exc.value.reason == "foreign"


def test_a_blank_prefix_partition_is_ours() -> None:
    assert parse_object("learned/type=m5.large/i-1-1.json", _line(), "m5.large")


# -- the consensus -------------------------------------------------------------------------------------------
def lr(iid: str, value: float, direction: str = "out", at: float = NOW - DAY, key: str = "") -> LearnedRecord:
    return LearnedRecord(iid, direction, value, at, None, key or f"{iid}-{at}")


def agree(records: list[LearnedRecord], min_instances: int = 3, max_age: float = 90 * DAY) -> Optional[Consensus]:
    return consensus(records, min_instances=min_instances, now=NOW, max_age_seconds=max_age)


def test_consensus_is_the_median_of_enough_distinct_instances() -> None:
    c = agree([lr("a", 100.0), lr("b", 110.0), lr("c", 120.0)])
    assert c == Consensus(bucket_bytes=110.0, instances=3, outliers=0, spread=pytest.approx(20 / 110),
                          newest=NOW - DAY)


def test_too_few_instances_give_none() -> None:
    assert agree([]) is None
    assert agree([lr("a", 100.0), lr("b", 100.0)]) is None
    assert agree([lr("a", 100.0), lr("b", 100.0)], min_instances=2) is not None


def test_one_instance_publishing_many_times_counts_once_with_its_latest_value() -> None:
    many = [lr("a", 100.0 + i, at=NOW - DAY * (10 - i)) for i in range(10)]
    assert agree(many, min_instances=1) == Consensus(109.0, 1, 0, 0.0, NOW - DAY)
    assert agree(many) is None                         # ten objects, still one instance
    c = agree([*many, lr("b", 109.0), lr("c", 109.0)])
    assert c is not None and c.instances == 3 and c.bucket_bytes == 109.0


def test_both_directions_are_pooled_per_instance() -> None:
    # a learned both directions (100, 140 -> 120); b and c one each. Three instances, not four.
    recs = [lr("a", 100.0, "in"), lr("a", 140.0, "out"), lr("b", 118.0, "in"), lr("c", 125.0, "out")]
    c = agree(recs)
    assert c is not None and c.instances == 3 and c.bucket_bytes == 120.0
    assert agree(recs, min_instances=4) is None


def test_latest_per_direction_then_pooled() -> None:
    recs = [lr("a", 50.0, "in", at=NOW - 5 * DAY), lr("a", 100.0, "in", at=NOW - DAY),
            lr("a", 300.0, "out", at=NOW - DAY), lr("a", 120.0, "out", at=NOW - 0.5 * DAY)]
    c = agree(recs, min_instances=1)
    assert c is not None and c.bucket_bytes == 110.0 and c.newest == NOW - 0.5 * DAY


def test_records_older_than_max_age_are_dropped_even_when_they_are_the_latest() -> None:
    recs = [lr("a", 100.0), lr("b", 100.0), lr("c", 100.0, at=NOW - 91 * DAY)]
    assert agree(recs) is None
    assert agree(recs, max_age=92 * DAY) is not None
    # An old record does not hide behind a newer one of the same instance either: the newer one counts.
    recs.append(lr("c", 104.0, at=NOW - 2 * DAY))
    c = agree(recs)
    assert c is not None and c.bucket_bytes == 100.0 and c.instances == 3


def test_outliers_outside_a_factor_of_two_are_rejected_and_counted() -> None:
    good = [lr("a", 100.0), lr("b", 105.0), lr("c", 95.0), lr("d", 190.0)]       # d: inside the band
    bits_for_bytes = lr("e", 800.0)                                            # 8x: bits taken for bytes
    tiny = lr("f", 1.0)
    c = agree([*good, bits_for_bytes, tiny])
    assert c is not None
    assert (c.instances, c.outliers, c.bucket_bytes) == (4, 2, 102.5)
    assert c.spread == pytest.approx((190.0 - 95.0) / 102.5)
    assert OUTLIER_FACTOR == 2.0


def test_outliers_can_leave_too_few() -> None:
    assert agree([lr("a", 100.0), lr("b", 100.0), lr("c", 1000.0)]) is None
    c = agree([lr("a", 100.0), lr("b", 100.0), lr("c", 1000.0)], min_instances=2)
    assert c is not None and c.outliers == 1


def test_two_exact_agreements_do_not_reject_a_close_third() -> None:
    # A MAD rule would (MAD = 0 here); the ratio band keeps an honest 10 % disagreement.
    c = agree([lr("a", 100.0), lr("b", 100.0), lr("c", 110.0)])
    assert c is not None and c.instances == 3 and c.outliers == 0


# -- when to publish -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("last,at,value,now,want", [
    (None, None, 100.0, NOW, True),                      # never published
    (100.0, NOW - DAY, 104.9, NOW, False),               # moved < 5 %
    (100.0, NOW - DAY, 95.0, NOW, True),                 # moved 5 %
    (100.0, NOW - DAY, 106.0, NOW, True),
    (100.0, NOW - 29 * DAY, 100.0, NOW, False),
    (100.0, NOW - 30 * DAY, 100.0, NOW, True),           # old enough to refresh before readers' max_age
])
def test_worth_publishing(last: Optional[float], at: Optional[float], value: float, now: float, want: bool) -> None:
    assert worth_publishing(last, at, value, now) is want


def test_only_sizes_learned_at_an_exhaustion_are_published() -> None:
    """An unshaped overrun is a growing lower bound, not a measurement (docs/fleet.md, "Publishing")."""
    assert publishable("exhaustion")
    assert not publishable("unshaped_overrun") and not publishable("none")


def test_the_other_allowances_ride_with_the_buckets_by_the_same_rule() -> None:
    """docs/allowances.md: PPS ceilings and conntrack sizes published beside buckets; each instance's latest,
    outliers out, the median when min_instances agree; documents without them (older agents) still parse."""
    def line(iid: str, at: float, pps: Optional[float], size: Optional[float]) -> bytes:
        return encode([learned_record(instance_type="m5.large", instance_id=iid, direction="out", bucket_bytes=3e11,
                                      learned_at=at, pps_ceiling_packets_per_second=pps,
                                      conntrack_size_entries=size)])
    objs = [("i-1", 10.0, 100_000.0, 80_000.0), ("i-1", 20.0, 104_000.0, None), ("i-2", 10.0, 98_000.0, 81_000.0),
            ("i-3", 10.0, 500_000.0, 79_000.0), ("i-4", 10.0, None, None)]
    records = [r for iid, at, pps, size in objs
               for r in parse_object(object_key("p/", "m5.large", iid, at), line(iid, at, pps, size), "m5.large")]
    c = consensus(records, min_instances=2, now=30.0, max_age_seconds=100.0)
    assert c is not None and c.instances == 4
    # PPS: i-1's latest 104k, i-2 98k, i-3 500k an outlier: median of two; conntrack: i-1's latest that has
    # one (80k, at 10), i-2 81k, i-3 79k
    a = allowance_consensus(records, min_instances=2, now=30.0, max_age_seconds=100.0)
    assert a == AllowanceConsensus(101_000.0, 2, 80_000.0, 3)
    assert allowance_consensus(records, min_instances=3, now=30.0, max_age_seconds=100.0).pps_ceiling is None
    old = json.dumps({k: v for k, v in json.loads(line("i-5", 10.0, None, None)).items()
                      if k not in ALLOWANCE_FIELDS}).encode()
    assert parse_object(object_key("p/", "m5.large", "i-5", 10.0), old, "m5.large")[0].pps_ceiling is None
    bad = line("i-6", 10.0, None, None).replace(b'"conntrack_size_entries":null', b'"conntrack_size_entries":-1')
    with pytest.raises(Rejected):
        parse_object(object_key("p/", "m5.large", "i-6", 10.0), bad, "m5.large")


# -- allowance lines: learned allowances without a bucket (issue 22) -----------------------------------------
ITYPE = "c6in.32xlarge"          # a large, non-burstable size: it never exhausts a bucket


def allowance(iid: str, at: float, pps: Optional[float] = None, size: Optional[float] = None) -> list[LearnedRecord]:
    body = encode([allowance_record(instance_type=ITYPE, instance_id=iid, learned_at=at,
                                    pps_ceiling_packets_per_second=pps, conntrack_size_entries=size)])
    return parse_object(object_key("p/", ITYPE, iid, at), body, ITYPE)


def test_allowance_record_has_every_field_and_null_bucket_fields() -> None:
    r = allowance_record(instance_type=ITYPE, instance_id="i-1", learned_at=5, conntrack_size_entries=10)
    assert list(r) == [*FIELDS, *ALLOWANCE_FIELDS] and r["format"] == FORMAT
    assert all(r[f] is None for f in BUCKET_FIELDS) and is_allowance_line(r) and not is_allowance_line(record())
    assert r["conntrack_size_entries"] == 10.0 and isinstance(r["conntrack_size_entries"], float)
    assert r["pps_ceiling_packets_per_second"] is None and r["learned_at"] == 5.0


@pytest.mark.parametrize("over", [
    {}, {"pps_ceiling_packets_per_second": 0}, {"pps_ceiling_packets_per_second": math.nan},
    {"conntrack_size_entries": -1.0, "pps_ceiling_packets_per_second": 5.0}, {"conntrack_size_entries": True},
    {"pps_ceiling_packets_per_second": 5.0, "direction": "out"}, {"pps_ceiling_packets_per_second": 5.0,
                                                                  "bucket_bytes": 1e9},
    {"pps_ceiling_packets_per_second": 5.0, "colour": "red"},
])
def test_allowance_record_refuses_bad_values(over: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        allowance_record(instance_type=ITYPE, learned_at=NOW, **over)


def test_an_allowance_line_parses_and_never_counts_in_the_bucket_consensus() -> None:
    (r,) = allowance("i-1", 10.0, pps=2e6)
    assert (r.direction, r.bucket_bytes, r.pps_ceiling, r.conntrack_size) == (None, None, 2e6, None)
    recs = [*allowance("i-1", 10.0, 2e6, 9e5), *allowance("i-2", 10.0, 2.1e6), *allowance("i-3", 10.0, 1.9e6, 9.2e5)]
    assert consensus(recs, min_instances=1, now=20.0, max_age_seconds=100.0) is None
    assert allowance_consensus(recs, min_instances=3, now=20.0, max_age_seconds=100.0) == \
        AllowanceConsensus(2e6, 3, None, 0)                  # two conntrack sizes: fewer than min_instances
    assert allowance_consensus(recs, min_instances=2, now=20.0, max_age_seconds=100.0).conntrack_size == 9.1e5


@pytest.mark.parametrize("over,why", [
    ({"pps_ceiling_packets_per_second": None}, "neither a bucket nor an allowance"),
    ({"pps_ceiling_packets_per_second": -3}, "pps_ceiling_packets_per_second"),
    ({"bucket_bytes": 1e9}, "direction"),                     # half a bucket line
    ({"direction": "in"}, "bucket_bytes"),
    ({"learned_at": None}, "learned_at"),
])
def test_a_bad_allowance_line_is_garbage(over: dict[str, Any], why: str) -> None:
    doc = allowance_record(instance_type=ITYPE, instance_id="i-1", learned_at=NOW, pps_ceiling_packets_per_second=5e5)
    doc.update(over)
    with pytest.raises(Rejected) as exc:
        parse_object(object_key("p/", ITYPE, "i-1", NOW), json.dumps(doc).encode(), ITYPE)
    assert exc.value.reason == "garbage" and why in exc.value.detail


def test_allowance_consensus_by_the_buckets_rule() -> None:
    """Latest per instance (allowance lines and bucket lines alike), age limit, outliers beyond 2x, min_instances."""
    recs = [*allowance("i-1", 10.0, pps=1e6), *allowance("i-1", 50.0, pps=2e6),       # i-1 counts once: 2e6
            *allowance("i-2", 40.0, pps=2.2e6), *allowance("i-3", 40.0, pps=16e6),     # 8x: an outlier
            *allowance("i-4", 1.0, pps=2.1e6),                                         # older than max_age
            *allowance("i-5", 45.0, size=5e5)]
    bucket_line = encode([learned_record(instance_type=ITYPE, instance_id="i-6", direction="in", bucket_bytes=1e12,
                                         learned_at=45.0, pps_ceiling_packets_per_second=1.8e6)])
    recs += parse_object(object_key("p/", ITYPE, "i-6", 45.0), bucket_line, ITYPE)
    a = allowance_consensus(recs, min_instances=3, now=60.0, max_age_seconds=55.0)
    assert a == AllowanceConsensus(2e6, 3, None, 0)
    assert allowance_consensus(recs, min_instances=4, now=60.0, max_age_seconds=55.0).pps_ceiling is None
    assert allowance_consensus(recs, min_instances=4, now=60.0, max_age_seconds=100.0).pps_instances == 4
    assert allowance_consensus([], min_instances=1, now=60.0, max_age_seconds=55.0) == AllowanceConsensus(None, 0,
                                                                                                          None, 0)


def test_bucket_records_take_the_publishable_directions_with_the_profile() -> None:
    from agent.models.fleet import bucket_records
    from agent.models.profile import BandwidthProfile

    profile = BandwidthProfile("m5.large", 93.75e6, 1.25e9, 337.5e9, "catalogue", "catalogue", "default")
    learned = {"out": {"bucket": 3e11, "learn_method": "exhaustion", "learned_count": 2},
               "in": {"bucket": 2e11, "learn_method": "exhaustion", "learned_count": 1}}
    learned_unsure = {**learned, "in": {**learned["in"], "learn_method": "none"}}
    records = bucket_records(learned, profile, instance_type="m5.large", learned_at=1.7e9)
    assert [(r["direction"], r["bucket_bytes"], r["learned_count"]) for r in records] == \
        [("in", 2e11, 1), ("out", 3e11, 2)]
    assert all(r["baseline_bytes_per_second"] == 93.75e6 and r["peak_source"] == "catalogue" for r in records)
    assert [r["direction"] for r in bucket_records(learned_unsure, profile, instance_type="m5.large")] == ["out"]
