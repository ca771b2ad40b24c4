"""Learned buckets and allowances shared by the fleet: the S3 layout, the document, its parser, the consensus (pure)."""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from agent.models.profile import BandwidthProfile
from agent.models.units import DIRECTIONS

FORMAT = "burstwatch-learned/1"
# A document holds one line per direction, ~600 bytes each: anything near this size is not ours, and the
# reader checks the listing's Size before a GET, so a huge object under the prefix costs no transfer.
MAX_OBJECT_BYTES = 64 * 1024
# Keys are built from these; anything else in an instance type or id is replaced (S3 keys stay plain,
# and a type can never climb out of its partition with "/" or "..").
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
# Outlier band around the median: one type's instances share one bucket size, but the two field reports
# for r4.large disagree by 1.6x (docs/ec2-network-facts.md, "Measured bucket sizes"), so honest values
# stay inside a factor of 2. Values off by more come from a wrong baseline, bits taken for bytes (8x)
# or a broken agent; a band in ratio terms, unlike a MAD cut, still works with 3 instances, two of which
# agree to the byte (a MAD of 0 would reject any third value).
OUTLIER_FACTOR = 2.0

# The document's fields, in the order they are written; all always present (null when unknown).
FIELDS: tuple[str, ...] = (
    "format", "instance_type", "instance_id", "region", "availability_zone", "direction", "bucket_bytes",
    "method", "learned_count", "baseline_bytes_per_second", "baseline_source", "peak_bytes_per_second",
    "peak_source", "driver", "driver_version", "learned_at", "agent_version")
_STRINGS = ("instance_type", "instance_id", "region", "availability_zone", "method", "baseline_source",
            "peak_source", "driver", "driver_version", "agent_version")
_NUMBERS = ("baseline_bytes_per_second", "peak_bytes_per_second")
REJECT_REASONS = ("garbage", "foreign")
# The other allowances learned by the same instance (docs/allowances.md), written after FIELDS (null when not
# learned) and optional when read: documents of older agents lack them, and older readers ignore them.
ALLOWANCE_FIELDS: tuple[str, ...] = ("pps_ceiling_packets_per_second", "conntrack_size_entries")
# The bucket fields an allowance line (allowance_record) leaves null: a large, non-burstable size never
# exhausts a bucket, yet its PPS and conntrack limits are the ones worth sharing (issue 22).
BUCKET_FIELDS: tuple[str, ...] = ("direction", "bucket_bytes")


class Rejected(Exception):
    """An object left out of the consensus: `reason` "garbage" (unreadable, wrong format, bad field, too
    large) or "foreign" (another type's record, or a key outside the type's partition)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class LearnedRecord:
    """One published line of one instance, as the consensus uses it: a learned direction, or (direction and
    bucket_bytes None) an allowance line."""

    instance_id: str
    direction: Optional[str]
    bucket_bytes: Optional[float]
    learned_at: float
    baseline_bytes_per_second: Optional[float]
    key: str
    pps_ceiling: Optional[float] = None         # ALLOWANCE_FIELDS, when the line has them
    conntrack_size: Optional[float] = None


@dataclass(frozen=True)
class Consensus:
    """The fleet's answer for one type."""

    bucket_bytes: float          # median of the kept instances' values
    instances: int               # distinct instances behind it
    outliers: int                # instances rejected as outliers
    spread: float                # (max - min) / median of the kept values
    newest: float                # learned_at of the newest record behind it
    # the smallest and largest kept values: the type's spread across the fleet, for the bucket's band
    # (docs/credits.md, "The bucket as a band"); 0 when unknown
    low: float = field(default=0.0, compare=False)
    high: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class AllowanceConsensus:
    """The fleet's PPS ceiling and conntrack size for one type, each by the bucket's rule (None: too few agree),
    whether or not the type has a bucket consensus."""

    pps_ceiling: Optional[float]
    pps_instances: int           # instances behind it (0 when None)
    conntrack_size: Optional[float]
    conntrack_instances: int


# -- keys ----------------------------------------------------------------------------------------------------
def _safe(text: Optional[str]) -> str:
    return _SAFE.sub("_", text or "") or "unknown"


def _norm_prefix(prefix: str) -> str:
    return prefix + "/" if prefix and not prefix.endswith("/") else prefix


def type_prefix(prefix: str, instance_type: str) -> str:
    """`<prefix>learned/type=<type>/`: the type's partition (Hive layout, so Athena prunes by type)."""
    return f"{_norm_prefix(prefix)}learned/type={_safe(instance_type)}/"


def object_key(prefix: str, instance_type: str, instance_id: Optional[str], epoch: float) -> str:
    """`<prefix>learned/type=<type>/<instance_id>-<unix_epoch_int>.json`."""
    return f"{type_prefix(prefix, instance_type)}{_safe(instance_id)}-{int(epoch)}.json"


# -- the document ------------------------------------------------------------------------------------------
def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def learned_record(**fields: Any) -> dict[str, Any]:
    """The flat record for one learned direction: every field of FIELDS, missing ones null. Raises
    ValueError for an unknown field, a direction other than "in"/"out" or a bucket that is not > 0."""
    unknown = set(fields) - set(FIELDS) - set(ALLOWANCE_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    if fields.get("direction") not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, not {fields.get('direction')!r}")
    if not _finite_positive(fields.get("bucket_bytes")):
        raise ValueError(f"bucket_bytes must be a finite number > 0, not {fields.get('bucket_bytes')!r}")
    out: dict[str, Any] = {name: fields.get(name) for name in (*FIELDS, *ALLOWANCE_FIELDS)}
    out["format"] = FORMAT
    out["bucket_bytes"] = float(out["bucket_bytes"])
    if out["learned_at"] is not None:
        out["learned_at"] = float(out["learned_at"])
    return out


def bucket_records(directions: dict[str, dict[str, Any]], profile: BandwidthProfile,
                   **fields: Any) -> list[dict[str, Any]]:
    """A learned_record for each direction the credits step learned (`directions`: learned_buckets() entries)
    whose method is worth sharing (publishable), with the profile's figures and the other `fields`."""
    p = profile
    return [learned_record(**fields, direction=d, bucket_bytes=v["bucket"], method=v["learn_method"],
                           learned_count=v["learned_count"], baseline_bytes_per_second=p.baseline_bytes_per_second,
                           baseline_source=p.baseline_source, peak_bytes_per_second=p.peak_bytes_per_second,
                           peak_source=p.peak_source)
            for d, v in sorted(directions.items()) if publishable(v["learn_method"])]


def allowance_record(**fields: Any) -> dict[str, Any]:
    """The flat record for learned allowances alone: every field of FIELDS and ALLOWANCE_FIELDS, the bucket
    fields (BUCKET_FIELDS) null. Raises ValueError for an unknown field, a bucket field, or no allowance
    figure that is a finite number > 0 (a null one is "not learned")."""
    unknown = set(fields) - set(FIELDS) - set(ALLOWANCE_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    bucket = [f for f in BUCKET_FIELDS if fields.get(f) is not None]
    if bucket:
        raise ValueError(f"an allowance record has no {', '.join(bucket)}: use learned_record()")
    figures = [fields.get(f) for f in ALLOWANCE_FIELDS]
    if any(v is not None and not _finite_positive(v) for v in figures) or all(v is None for v in figures):
        raise ValueError(f"{' or '.join(ALLOWANCE_FIELDS)} must be a finite number > 0, not {figures!r}")
    out: dict[str, Any] = {name: fields.get(name) for name in (*FIELDS, *ALLOWANCE_FIELDS)}
    out["format"] = FORMAT
    for f in (*ALLOWANCE_FIELDS, "learned_at"):
        if out[f] is not None:
            out[f] = float(out[f])
    return out


def is_allowance_line(record: dict[str, Any]) -> bool:
    """Whether a record (learned_record or allowance_record) holds allowances alone."""
    return all(record.get(f) is None for f in BUCKET_FIELDS)


def encode(records: list[dict[str, Any]]) -> bytes:
    """Newline-delimited JSON, one record a line with a trailing newline (Athena's JSON SerDe and DuckDB's
    read_json both read one row per line)."""
    return b"".join(json.dumps(r, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
                    for r in records)


def _in_partition(key: str, instance_type: str) -> bool:
    """The key sits directly in the type's partition, whatever the prefix."""
    part = type_prefix("", instance_type)
    head, sep, name = key.rpartition(part)
    return bool(sep) and (head == "" or head.endswith("/")) and bool(name) and "/" not in name


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_line(n: int, doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise Rejected("garbage", f"line {n} is not a JSON object")
    if doc.get("format") != FORMAT:
        raise Rejected("garbage", f"line {n}: format {doc.get('format')!r}, not {FORMAT!r}")
    missing = [f for f in FIELDS if f not in doc]
    if missing:
        raise Rejected("garbage", f"line {n}: missing {', '.join(missing)}")
    for f in _STRINGS:
        if doc[f] is not None and not isinstance(doc[f], str):
            raise Rejected("garbage", f"line {n}: {f} is not a string")
    for f in _NUMBERS:
        if doc[f] is not None and not _number(doc[f]):
            raise Rejected("garbage", f"line {n}: {f} is not a finite number")
    if not isinstance(doc["instance_type"], str):
        raise Rejected("garbage", f"line {n}: no instance_type")
    _check_kind(n, doc)
    if not _number(doc["learned_at"]):
        raise Rejected("garbage", f"line {n}: learned_at is not a finite number")
    count = doc["learned_count"]
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
        raise Rejected("garbage", f"line {n}: learned_count is not an integer")
    return doc


def _check_kind(n: int, doc: dict[str, Any]) -> None:
    """A bucket line (a direction and a bucket > 0) or an allowance line (both null, a figure given); the
    allowance figures, on either, null or > 0."""
    for f in ALLOWANCE_FIELDS:
        if doc.get(f) is not None and not _finite_positive(doc[f]):
            raise Rejected("garbage", f"line {n}: {f} is not a finite number > 0")
    if is_allowance_line(doc):
        if all(doc.get(f) is None for f in ALLOWANCE_FIELDS):
            raise Rejected("garbage", f"line {n}: neither a bucket nor an allowance")
    elif doc["direction"] not in DIRECTIONS:
        raise Rejected("garbage", f"line {n}: direction {doc['direction']!r}")
    elif not _finite_positive(doc["bucket_bytes"]):
        raise Rejected("garbage", f"line {n}: bucket_bytes {doc['bucket_bytes']!r} is not a finite number > 0")


def parse_object(key: str, body: bytes, instance_type: str) -> list[LearnedRecord]:
    """The records of one object of `instance_type`'s partition; raises Rejected when any line is not
    a valid burstwatch-learned/1 record of that type (the object is taken whole or not at all)."""
    if not _in_partition(key, instance_type):
        raise Rejected("foreign", f"{key} is outside the {instance_type} partition")
    if len(body) > MAX_OBJECT_BYTES:
        raise Rejected("garbage", f"{len(body)} bytes, more than {MAX_OBJECT_BYTES}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected("garbage", f"not UTF-8: {exc}") from None
    name = key.rsplit("/", 1)[-1]
    fallback_id = name.rsplit("-", 1)[0] if "-" in name else name
    out: list[LearnedRecord] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError as exc:             # JSONDecodeError, and NaN/huge-number oddities
            raise Rejected("garbage", f"line {n} is not JSON: {exc}") from None
        doc = _check_line(n, raw)
        if doc["instance_type"] != instance_type:
            raise Rejected("foreign", f"line {n} is for {doc['instance_type']!r}, not {instance_type!r}")
        base, nbytes = doc["baseline_bytes_per_second"], doc["bucket_bytes"]
        pps, size = doc.get(ALLOWANCE_FIELDS[0]), doc.get(ALLOWANCE_FIELDS[1])
        out.append(LearnedRecord(doc["instance_id"] or fallback_id, doc["direction"],
                                 float(nbytes) if nbytes is not None else None,
                                 float(doc["learned_at"]), float(base) if base is not None else None, key,
                                 float(pps) if pps is not None else None, float(size) if size is not None else None))
    if not out:
        raise Rejected("garbage", "no records")
    return out


# -- the consensus -----------------------------------------------------------------------------------------
def consensus(records: Iterable[LearnedRecord], *, min_instances: int, now: float,
              max_age_seconds: float) -> Optional[Consensus]:
    """The fleet's bucket for a type, or None unless `min_instances` distinct instances agree.

    Only the latest record per (instance, direction) counts, records older than `max_age_seconds` are
    dropped first, and each instance contributes one value, the median of its directions' latest (so one
    instance publishing every day counts once, and an instance that learned both directions is not worth
    two). Instances whose value lies outside [median / OUTLIER_FACTOR, median x OUTLIER_FACTOR] are
    outliers; the answer is the median of the rest."""
    oldest = now - max_age_seconds
    latest: dict[tuple[str, str], LearnedRecord] = {}
    for r in records:
        if r.learned_at < oldest or r.direction is None or r.bucket_bytes is None:
            continue                          # too old, or an allowance line (allowance_consensus)
        k = (r.instance_id, r.direction)
        cur = latest.get(k)
        if cur is None or (r.learned_at, r.key) > (cur.learned_at, cur.key):
            latest[k] = r
    per_instance: dict[str, list[LearnedRecord]] = {}
    for (iid, _d), r in latest.items():
        per_instance.setdefault(iid, []).append(r)
    if not per_instance:
        return None
    values = {iid: statistics.median(float(r.bucket_bytes or 0.0) for r in rs) for iid, rs in per_instance.items()}
    kept = _agreeing(values)
    if len(kept) < max(1, min_instances):
        return None
    median = statistics.median(kept.values())
    newest = max(r.learned_at for iid in kept for r in per_instance[iid])
    return Consensus(float(median), len(kept), len(values) - len(kept),
                     (max(kept.values()) - min(kept.values())) / median, newest,
                     low=float(min(kept.values())), high=float(max(kept.values())))


def _agreeing(values: dict[str, float]) -> dict[str, float]:
    """The instances whose value lies within OUTLIER_FACTOR of the median of all."""
    mid = statistics.median(values.values())
    return {iid: v for iid, v in values.items() if mid / OUTLIER_FACTOR <= v <= mid * OUTLIER_FACTOR}


def allowance_consensus(records: Iterable[LearnedRecord], *, min_instances: int, now: float,
                        max_age_seconds: float) -> AllowanceConsensus:
    """The fleet's PPS ceiling and conntrack size for a type, each on its own and by the bucket's rule: records
    older than `max_age_seconds` dropped, each instance's latest value of the figure (from any line that has
    it: an allowance line, or a bucket line it rode on), outliers beyond OUTLIER_FACTOR of the median out,
    the median of the rest when `min_instances` agree. Independent of the bucket consensus: a type whose
    instances never exhaust a bucket still gets its allowances."""
    fresh = [r for r in records if r.learned_at >= now - max_age_seconds]
    pps = _figure(fresh, "pps_ceiling", min_instances)
    size = _figure(fresh, "conntrack_size", min_instances)
    return AllowanceConsensus(pps[0], pps[1], size[0], size[1])


def _figure(records: list[LearnedRecord], field: str, min_instances: int) -> tuple[Optional[float], int]:
    """(median, instances) of `field` by the rule above; (None, 0) when too few agree."""
    latest: dict[str, LearnedRecord] = {}
    for r in records:
        if getattr(r, field) is None:
            continue
        cur = latest.get(r.instance_id)
        if cur is None or (r.learned_at, r.key) > (cur.learned_at, cur.key):
            latest[r.instance_id] = r
    if not latest:
        return None, 0
    kept = _agreeing({iid: float(getattr(r, field)) for iid, r in latest.items()})
    if len(kept) < max(1, min_instances):
        return None, 0
    return float(statistics.median(kept.values())), len(kept)


# -- when to publish ---------------------------------------------------------------------------------------
# A learned value is worth a PUT when it is new, moved by this much from the last published value (the
# estimator's own learned values wander by a few percent between exhaustions; 5 % keeps those to one
# object), or when the last publication is old enough that it would soon fall out of readers' max_age.
PUBLISH_CHANGE = 0.05
REPUBLISH_AGE = 30 * 86400.0
# Only a size learned at an exhaustion (docs/credits.md, "Exhaustion needs evidence") is a measurement of
# the bucket. An unshaped overrun only says the bucket is larger than the model's (a lower bound that grows
# until the exhaustion that ends the episode settles it); shared, it would drag the fleet's median down.
PUBLISHED_METHODS = ("exhaustion",)


def publishable(method: str) -> bool:
    """Whether a size learned by `method` is a measurement worth sharing with the fleet."""
    return method in PUBLISHED_METHODS


def worth_publishing(last_bytes: Optional[float], last_at: Optional[float], bucket_bytes: float,
                     now: float) -> bool:
    """Whether a learned value should be published, given the last one published for its direction."""
    if last_bytes is None or last_at is None or last_bytes <= 0:
        return True
    if abs(bucket_bytes - last_bytes) / last_bytes >= PUBLISH_CHANGE:
        return True
    return now - last_at >= REPUBLISH_AGE
