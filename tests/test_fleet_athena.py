"""docs/fleet.md's Athena table and query, run on DuckDB over objects written the way the fleet service writes them."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any, Optional

import pytest

from agent.models.fleet import (
    ALLOWANCE_FIELDS,
    FIELDS,
    FORMAT,
    Rejected,
    allowance_consensus,
    allowance_record,
    encode,
    learned_record,
    object_key,
    parse_object,
)

try:
    import duckdb  # a test dependency only (Makefile PIP_TEST / PIP39), never the daemon's
except ImportError:  # installed by `make test-deps`: fail loudly rather than skip the doc's query
    pytest.fail("duckdb missing: `make test-deps` installs duckdb==1.1.3", pytrace=False)

DOC = Path(__file__).resolve().parents[1] / "docs" / "fleet.md"
PREFIX = "burstwatch/"
T0 = 1_763_900_000.0
M5_BASE = 93_750_000.0           # m5.large baseline, 0.75 Gbit/s in bytes/s
C5N_BASE = 625_000_000.0         # c5n.large baseline, 5 Gbit/s

# The Athena -> DuckDB dialect translation, applied to the query text as it stands in the doc (the DDL is
# translated by ddl_to_duckdb below). Both percentile functions return one of the input values (no
# interpolation), so with an odd number of instances both give the exact median.
QUERY_TRANSLATION = (
    ("approx_percentile(", "quantile_disc("),   # Trino's approximate percentile -> DuckDB's discrete one
    ("from_unixtime(", "to_timestamp("),         # unix seconds -> timestamp with time zone
)
HIVE_TO_DUCKDB = {"string": "VARCHAR", "double": "DOUBLE", "bigint": "BIGINT"}


def region(name: str) -> str:
    text = DOC.read_text()
    m = re.search(rf"<!-- region: {name}\b.*?-->(.*?)<!-- end region: {name} -->", text, re.S)
    assert m, f"no {name} region in {DOC}"
    return m.group(1)


def sql_blocks() -> tuple[str, str]:
    blocks = re.findall(r"```sql\n(.*?)```", region("athena"), re.S)
    ddl = next(b for b in blocks if "CREATE EXTERNAL TABLE" in b)
    query = next(b for b in blocks if b.lstrip().startswith(("WITH", "SELECT")))
    return ddl, query


def parse_ddl(ddl: str) -> tuple[str, dict[str, str], dict[str, str], str]:
    """(table, columns, partition columns, LOCATION) of the flat CREATE EXTERNAL TABLE statement."""
    m = re.match(r"\s*CREATE EXTERNAL TABLE (\w+) \((.*?)\n\)\nPARTITIONED BY \((.*?)\)\n(.*)", ddl, re.S)
    assert m, ddl
    table, body, parts, tail = m.groups()

    def cols(text: str) -> dict[str, str]:
        out = {}
        for item in text.split(","):
            name, typ = item.split()
            out[name.strip("`")] = typ.lower()
        return out

    loc = re.search(r"LOCATION '([^']+)'", tail)
    assert loc and "org.openx.data.jsonserde.JsonSerDe" in tail
    return table, cols(body), cols(parts), loc.group(1)


def ddl_to_duckdb(ddl: str, root: Path) -> str:
    """The table as a DuckDB view: read_json over the same files, columns as declared, the Hive partition
    column from the directory names, and unreadable lines as all-null rows (Athena: ignore.malformed.json)."""
    table, columns, parts, location = parse_ddl(ddl)
    assert "'ignore.malformed.json' = 'true'" in ddl
    path = location.replace("s3://", str(root) + "/", 1)
    spec = ", ".join(f"'{c}': '{HIVE_TO_DUCKDB[t]}'" for c, t in columns.items())
    hive = ", ".join(f"'{c}': '{HIVE_TO_DUCKDB[t]}'" for c, t in parts.items())
    return (f"CREATE VIEW {table} AS SELECT * FROM read_json('{path}*/*.json', format = 'newline_delimited', "
            f"columns = {{{spec}}}, hive_partitioning = true, hive_types = {{{hive}}}, ignore_errors = true)")


def translate(query: str) -> str:
    for athena, duck in QUERY_TRANSLATION:
        assert athena in query, f"{athena} no longer in the doc's query: update QUERY_TRANSLATION"
        query = query.replace(athena, duck)
    return query.strip().rstrip(";")


# -- the objects -------------------------------------------------------------------------------------------
# The other allowances two m5.large instances learned (docs/allowances.md): PPS ceiling, conntrack size.
ALLOWANCES = {"i-0aaaaaaaaaaaaaaa1": (100_000.0, 80_000.0), "i-0bbbbbbbbbbbbbbb2": (110_000.0, 82_000.0)}


def rec(itype: str, iid: Optional[str], direction: str, nbytes: float, at: float, base: Optional[float]) -> dict:
    pps, conntrack = ALLOWANCES.get(iid or "", (None, None))
    return learned_record(instance_type=itype, instance_id=iid, region="us-east-1", availability_zone="us-east-1a",
                          direction=direction, bucket_bytes=nbytes, method="exhaustion", learned_count=1,
                          baseline_bytes_per_second=base, baseline_source="catalogue" if base else "none",
                          peak_bytes_per_second=1.25e9, peak_source="catalogue", driver="ena",
                          driver_version="2.8.1g", learned_at=at, agent_version="0.x",
                          pps_ceiling_packets_per_second=pps, conntrack_size_entries=conntrack)


def put(root: Path, key: str, body: bytes) -> None:
    path = root / "BUCKET" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)


def publish(root: Path, records: list[dict]) -> str:
    """One object as the service writes it: both directions learned together, keyed by the newest."""
    first = records[0]
    key = object_key(PREFIX, first["instance_type"], first["instance_id"], max(r["learned_at"] for r in records))
    put(root, key, encode(records))
    return key


GOOD = [  # (type, instance, [(direction, bytes, learned_at)], baseline): one object each
    ("m5.large", "i-0aaaaaaaaaaaaaaa1", [("out", 337.5e9, T0 - 9000)], M5_BASE),              # superseded
    ("m5.large", "i-0aaaaaaaaaaaaaaa1", [("out", 340.0e9, T0 - 100), ("in", 330.0e9, T0 - 100)], M5_BASE),
    ("m5.large", "i-0bbbbbbbbbbbbbbb2", [("out", 300.0e9, T0 - 200), ("in", 310.0e9, T0 - 200)], M5_BASE),
    ("m5.large", "i-0ccccccccccccccc3", [("out", 400.0e9, T0 - 300)], None),                  # no baseline known
    ("m5.large", "i-0ccccccccccccccc3", [("in", 420.0e9, T0 - 50)], None),
    ("c5n.large", "i-0ddddddddddddddd4", [("out", 2.25e12, T0 - 5000), ("in", 2.0e12, T0 - 5000)], C5N_BASE),
]


# Allowance lines (no bucket: docs/fleet.md, "The object"), one object each: (type, instance, PPS ceiling,
# conntrack size, learned_at). c6in.32xlarge never learns a bucket; its instances only learn allowances.
ALLOWANCE_ONLY = [
    ("m5.large", "i-0aaaaaaaaaaaaaaa1", 105_000.0, None, T0 - 40),       # supersedes its bucket lines' 100k PPS
    ("m5.large", "i-0ccccccccccccccc3", 120_000.0, None, T0 - 60),       # no conntrack size learned
    ("c6in.32xlarge", "i-0123456789abcde01", 1_500_000.0, 900_000.0, T0 - 7000),    # superseded
    ("c6in.32xlarge", "i-0123456789abcde01", 2_000_000.0, 1_000_000.0, T0 - 700),
    ("c6in.32xlarge", "i-0123456789abcde02", 2_200_000.0, 1_100_000.0, T0 - 600),
    ("c6in.32xlarge", "i-0123456789abcde03", 1_900_000.0, None, T0 - 500),
]


def expected(good: list) -> dict[str, dict[str, Any]]:
    """The bucket figures the query must print, computed here without SQL (first/last seen over every line)."""
    latest: dict[tuple[str, str, str], tuple[float, float, Optional[float]]] = {}
    seen: dict[str, list[float]] = {}
    for itype, _iid, _pps, _size, at in ALLOWANCE_ONLY:
        seen.setdefault(itype, []).append(at)
    for itype, iid, dirs, base in good:
        for d, b, at in dirs:
            seen.setdefault(itype, []).append(at)
            if (itype, iid, d) not in latest or latest[(itype, iid, d)][1] < at:
                latest[(itype, iid, d)] = (b, at, base)
    per: dict[str, dict[str, list[tuple[float, Optional[float]]]]] = {}
    for (itype, iid, _d), (b, _at, base) in latest.items():
        per.setdefault(itype, {}).setdefault(iid, []).append((b, b / base if base else None))
    out = {}
    for itype, insts in per.items():
        values = [statistics.mean(b for b, _s in v) for v in insts.values()]
        secs = [statistics.mean(s for _b, s in v if s is not None) for v in insts.values() if v[0][1] is not None]
        med = statistics.median(values)   # odd counts below: the percentile functions give it exactly
        assert len(values) % 2 == 1
        out[itype] = {"median_gbit": round(med * 8 / 1e9, 2),
                      # an even count: either middle value (neither engine interpolates)
                      "median_baseline_seconds": {round(statistics.median_low(secs)),
                                                  round(statistics.median_high(secs))},
                      "spread": round((max(values) - min(values)) / med, 3), "instances": len(insts),
                      "first_seen": min(seen[itype]), "last_seen": max(seen[itype])}
    return out


def write_fleet(root: Path) -> dict[str, str]:
    """The good objects, and the ones the query must not count (returned as name -> key)."""
    for itype, iid, dirs, base in GOOD:
        publish(root, [rec(itype, iid, d, b, at, base) for d, b, at in dirs])
    for itype, iid, pps, size, at in ALLOWANCE_ONLY:
        publish(root, [allowance_record(instance_type=itype, instance_id=iid, region="us-east-1", learned_at=at,
                                        pps_ceiling_packets_per_second=pps, conntrack_size_entries=size,
                                        agent_version="0.x")])
    bad = {}
    # Another type's record placed in m5.large's partition: 100x the bucket, would move every figure.
    foreign = rec("c5.large", "i-0fffffffffffffff6", "out", 33e12, T0 + 500, M5_BASE)
    bad["foreign"] = object_key(PREFIX, "m5.large", "i-0fffffffffffffff6", T0 + 500)
    put(root, bad["foreign"], encode([foreign]))
    # Not JSON, and not even UTF-8.
    bad["garbage"] = object_key(PREFIX, "m5.large", "i-0eeeeeeeeeeeeeee5", T0)
    put(root, bad["garbage"], b"\xff\xfe<html>not json</html>\n{\"format\": \"burstwatch-learned/1\",\n")
    # A future format, and a negative size: whole lines the query must leave out.
    other = dict(rec("m5.large", "i-0999999999999999a", "out", 9e12, T0 + 900, M5_BASE), format="burstwatch-learned/2")
    bad["format"] = object_key(PREFIX, "m5.large", "i-0999999999999999a", T0 + 900)
    put(root, bad["format"], (json.dumps(other) + "\n").encode())
    negative = dict(rec("m5.large", "i-0888888888888888b", "in", 1.0, T0 + 901, M5_BASE), bucket_bytes=-5.0)
    bad["negative"] = object_key(PREFIX, "m5.large", "i-0888888888888888b", T0 + 901)
    put(root, bad["negative"], (json.dumps(negative) + "\n").encode())
    # An allowance line without any figure, and one with a negative figure: neither kind of line.
    empty = dict(allowance_record(instance_type="m5.large", instance_id="i-0777777777777777c", learned_at=T0 + 902,
                                  pps_ceiling_packets_per_second=1.0), pps_ceiling_packets_per_second=None)
    bad["empty allowance"] = object_key(PREFIX, "m5.large", "i-0777777777777777c", T0 + 902)
    put(root, bad["empty allowance"], (json.dumps(empty) + "\n").encode())
    minus = dict(empty, conntrack_size_entries=-9e9, learned_at=T0 + 903)
    bad["negative allowance"] = object_key(PREFIX, "m5.large", "i-0666666666666666d", T0 + 903)
    put(root, bad["negative allowance"], (json.dumps(minus) + "\n").encode())
    return bad


# -- the tests ---------------------------------------------------------------------------------------------
def test_ddl_declares_exactly_the_fields_the_service_writes() -> None:
    ddl, _query = sql_blocks()
    table, columns, parts, location = parse_ddl(ddl)
    assert table == "burstwatch_learned"
    record = rec("m5.large", "i-0aaaaaaaaaaaaaaa1", "out", 1.0, T0, M5_BASE)
    assert set(columns) == set(FIELDS) | set(ALLOWANCE_FIELDS) == set(record), set(columns) ^ set(record)
    kinds = {"string": (str,), "double": (float,), "bigint": (int,)}
    for name, typ in columns.items():
        assert isinstance(record[name], kinds[typ]), (name, typ, record[name])
    # The partition column is the key's `type=` directory, under LOCATION = s3://BUCKET/<prefix>learned/.
    assert parts == {"type": "string"}
    key = object_key(PREFIX, "m5.large", "i-0aaaaaaaaaaaaaaa1", T0)
    assert location == f"s3://BUCKET/{PREFIX}learned/"
    assert ("s3://BUCKET/" + key).startswith(location + "type=m5.large/")
    assert record["format"] == FORMAT and f"'{FORMAT}'" in sql_blocks()[1]


def test_query_on_duckdb_matches_figures_computed_in_python(tmp_path: Path) -> None:
    bad = write_fleet(tmp_path)
    # The fleet's own parser rejects each of them too: the query and the consensus count the same objects.
    reasons = {}
    for name, key in bad.items():
        with pytest.raises(Rejected) as exc:
            parse_object(key, (tmp_path / "BUCKET" / key).read_bytes(), "m5.large")
        reasons[name] = exc.value.reason
    assert reasons == {"foreign": "foreign", "garbage": "garbage", "format": "garbage", "negative": "garbage",
                       "empty allowance": "garbage", "negative allowance": "garbage"}

    ddl, query = sql_blocks()
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(ddl_to_duckdb(ddl, tmp_path))
    # All the objects are read (the junk ones as null or filtered rows), so the query does the filtering.
    total = con.execute("SELECT count(*), count(DISTINCT \"type\") FROM burstwatch_learned").fetchone()
    assert total is not None and total[0] >= 21 and total[1] == 3
    # Timestamps come back as epoch seconds (DuckDB hands TIMESTAMPTZ to Python only through pytz).
    wrapped = (f"SELECT * REPLACE (epoch(first_seen) AS first_seen, epoch(last_seen) AS last_seen) "
               f"FROM ({translate(query)})")
    cur = con.execute(wrapped)
    names = [d[0] for d in cur.description]
    assert names == ["instance_type", "median_gbit", "median_baseline_seconds", "spread", "instances",
                     "median_pps_ceiling", "pps_instances", "median_conntrack_size", "conntrack_instances",
                     "first_seen", "last_seen"]
    got = {row[0]: dict(zip(names[1:], row[1:])) for row in cur.fetchall()}
    want = expected(GOOD)
    assert set(got) == {"m5.large", "c5n.large", "c6in.32xlarge"}
    for itype, w in want.items():
        g = got[itype]
        assert g["instances"] == w["instances"], itype
        assert g["median_gbit"] == pytest.approx(w["median_gbit"], abs=0.006), itype
        assert g["median_baseline_seconds"] in w["median_baseline_seconds"], itype
        assert g["spread"] == pytest.approx(w["spread"], abs=0.0011), itype
        assert g["first_seen"] == pytest.approx(w["first_seen"], abs=0.001), itype
        assert g["last_seen"] == pytest.approx(w["last_seen"], abs=0.001), itype
    # The figures themselves, so a wrong `expected` cannot hide a wrong query: m5.large's instances are
    # 335, 305 and 410 GB (latest per direction, averaged): median 335 GB = 2680 Gbit, spread 105/335;
    # seconds of baseline from the two with a baseline, 3573 s and 3253 s: the median of an even pair is
    # one of them (quantile_disc, as approx_percentile).
    m5 = got["m5.large"]
    assert (m5["instances"], m5["median_gbit"], m5["spread"]) == (3, 2680.0, round(105 / 335, 3))
    assert m5["median_baseline_seconds"] in (round(335e9 / M5_BASE), round(305e9 / M5_BASE))
    assert m5["last_seen"] == T0 - 40 and m5["first_seen"] == T0 - 9000
    assert got["c5n.large"]["instances"] == 1 and got["c5n.large"]["median_gbit"] == 17000.0
    # The other allowances, each instance's latest from bucket and allowance lines alike: PPS 105k (a's
    # allowance line supersedes its bucket lines' 100k), 110k and 120k (c's allowance line); conntrack from
    # the bucket lines of a and b only (an even pair: one of them). None for c5n.large.
    assert (m5["median_pps_ceiling"], m5["pps_instances"]) == (110_000.0, 3)
    assert m5["median_conntrack_size"] in (80_000.0, 82_000.0) and m5["conntrack_instances"] == 2
    c5n = got["c5n.large"]
    assert (c5n["median_pps_ceiling"], c5n["pps_instances"], c5n["conntrack_instances"]) == (None, 0, 0)
    # A type that never learned a bucket is listed by its allowances alone.
    c6 = got["c6in.32xlarge"]
    assert (c6["median_gbit"], c6["median_baseline_seconds"], c6["spread"], c6["instances"]) == (None, None, None, 0)
    assert (c6["median_pps_ceiling"], c6["pps_instances"]) == (2_000_000.0, 3)
    assert c6["median_conntrack_size"] in (1_000_000.0, 1_100_000.0) and c6["conntrack_instances"] == 2
    assert (c6["first_seen"], c6["last_seen"]) == (T0 - 7000, T0 - 500)
    # The agents' consensus over the same objects agrees (no outliers here; odd counts give the exact median).
    for itype, row in got.items():
        files = sorted((tmp_path / "BUCKET" / PREFIX / "learned" / f"type={itype}").glob("*.json"))
        records = []
        for f in files:
            try:
                records += parse_object(str(f.relative_to(tmp_path / "BUCKET")), f.read_bytes(), itype)
            except Rejected:
                continue
        a = allowance_consensus(records, min_instances=1, now=T0, max_age_seconds=90 * 86400.0)
        assert (a.pps_instances, a.conntrack_instances) == (row["pps_instances"], row["conntrack_instances"]), itype
        if a.pps_instances % 2:
            assert a.pps_ceiling == row["median_pps_ceiling"], itype
