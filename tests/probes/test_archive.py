"""The S3 probe archive through moto in server mode: key layout, gzip, seed 001's fields, outages, Athena DDL."""

from __future__ import annotations

import copy
import gzip
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from agent import aws
from agent.iperf3.client import ProbeRequest, run_probe
from agent.probes.archive import S3Archive, archive_document, encode, object_key
from tests.support.iperf3 import free_port, iperf3_server

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "iperf3" / "fixtures"
DOC = ROOT / "docs" / "probe-scheduling.md"
REGION = "us-east-1"
BUCKET = "probe-archive"


def fixture_doc(name: str) -> dict[str, Any]:
    """An iperf3 --json document captured from Debian's iperf3 3.12 (the file's _source says how)."""
    return json.loads((FIXTURES / name).read_text())["doc"]


def s3(url: str) -> Any:
    return aws.client("s3", REGION, url)


def fetch_all(url: str, prefix: str = "") -> dict[str, bytes]:
    client = s3(url)
    listing = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listing}


def wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.02)


# -- keys and documents ------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix,itype,ts,iid,key", [
    ("", "c4.2xlarge", 1523348026, None, "d=2018-04-10/c4.2xlarge-1523348026.json.gz"),      # seed 001's own
    ("burstwatch/", "r4.8xlarge", 1523381053, None, "burstwatch/d=2018-04-10/r4.8xlarge-1523381053.json.gz"),
    ("burstwatch", "m5.large", 1523379049.9, "i-0abc", "burstwatch/d=2018-04-10/m5.large-1523379049-i-0abc.json.gz"),
    ("p/", "unknown", 86399, None, "p/d=1970-01-01/unknown-86399.json.gz"),                  # UTC day boundary
    ("p/", "x/../y", 86400, None, "p/d=1970-01-02/x_.._y-86400.json.gz"),
])
def test_object_key(prefix: str, itype: str, ts: float, iid: Optional[str], key: str) -> None:
    assert object_key(prefix, itype, ts, iid) == key


def test_encoded_document_is_one_gzipped_json_line_with_seed_fields() -> None:
    doc = fixture_doc("iperf3-3.12-tcp-forward.json")
    body = encode(archive_document(doc, "m5.large", "eu-west-1"))
    text = gzip.decompress(body).decode()
    assert text.count("\n") == 1 and text.endswith("\n")
    out = json.loads(text)
    assert out["instanceType"] == "m5.large" and out["region"] == "eu-west-1"
    assert out["intervals"] == doc["intervals"] and out["end"] == doc["end"]
    assert "instanceType" not in doc                     # the caller's document is left alone


# -- through moto ------------------------------------------------------------------------------------------
@pytest.fixture()
def bucket(moto: str) -> str:
    s3(moto).create_bucket(Bucket=BUCKET)
    return moto


def test_objects_land_under_the_documented_layout(bucket: str) -> None:
    archive = S3Archive(BUCKET, prefix="burstwatch/", instance_type="m5.large", region="eu-west-1",
                        instance_id="i-0123456789abcdef0", endpoint_url=bucket, bucket_region=REGION)
    archive.start()
    try:
        fwd, rev = fixture_doc("iperf3-3.12-tcp-forward.json"), fixture_doc("iperf3-3.12-tcp-reverse.json")
        keys = [archive.submit(fwd), archive.submit(rev)]
        assert archive.flush(20.0)
    finally:
        archive.stop(2.0)
    objects = fetch_all(bucket)
    assert sorted(objects) == sorted(keys)
    pattern = re.compile(r"^burstwatch/d=(\d{4}-\d{2}-\d{2})/m5\.large-(\d+)-i-0123456789abcdef0\.json\.gz$")
    for key, body in objects.items():
        m = pattern.match(key)
        assert m, key
        doc = json.loads(gzip.decompress(body))
        ts = doc["start"]["timestamp"]["timesecs"]
        # The name carries the probe's start, the partition its UTC date.
        assert int(m.group(2)) in (ts, ts + 1)
        assert m.group(1) == time.strftime("%Y-%m-%d", time.gmtime(ts))
        assert doc["instanceType"] == "m5.large" and doc["region"] == "eu-west-1"
        assert doc["intervals"] and doc["end"]["sum_received"]["bits_per_second"] > 0
    st = archive.snapshot()
    assert (st.uploaded, st.failed, st.dropped, st.backlog) == (2, 0, 0, 0)
    assert st.last_success_timestamp > 0


def test_two_probes_in_one_second_keep_both(bucket: str) -> None:
    archive = S3Archive(BUCKET, instance_type="m5.large", region=REGION, endpoint_url=bucket)
    archive.start()
    try:
        doc = fixture_doc("iperf3-3.12-tcp-forward.json")
        k1, k2 = archive.submit(doc), archive.submit(doc)
        assert archive.flush(20.0)
    finally:
        archive.stop(2.0)
    assert k1 != k2
    assert sorted(fetch_all(bucket)) == sorted([k1, k2])


class Gate:
    """A TCP forwarder in front of moto that can be cut: while down, connections are accepted and closed
    at once (what a dead load balancer or a blackholed VPC endpoint looks like to botocore)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit("/", 1)[-1].rsplit(":", 1)
        self.target = (host, int(port))
        self.up = False
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.refused = 0
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if not self.up:
                self.refused += 1
                conn.close()
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def test_backlog_survives_an_endpoint_outage_newest_kept(bucket: str) -> None:
    gate = Gate(bucket)
    client = aws.client("s3", REGION, gate.url, max_attempts=2, connect_timeout=1.0, read_timeout=2.0)
    archive = S3Archive(BUCKET, prefix="o/", instance_type="c5.large", region=REGION, backlog=3, client=client,
                        retry_pause=0.2, retry_pause_max=0.5)
    archive.start()
    try:
        base = fixture_doc("iperf3-3.12-tcp-forward.json")
        keys = []
        for i in range(5):
            doc = copy.deepcopy(base)
            doc["start"]["timestamp"]["timesecs"] = 1_700_000_000 + 10 * i
            t0 = time.monotonic()
            keys.append(archive.submit(doc))
            assert time.monotonic() - t0 < 1.0          # queued, not uploaded (with retries) on the probe's thread
        wait(lambda: archive.snapshot().failed >= 2, 20.0, "failed uploads during the outage")
        st = archive.snapshot()
        assert st.uploaded == 0 and st.backlog == 3 and st.dropped == 2
        assert gate.refused >= 2                         # botocore really tried, and retried
        assert fetch_all(bucket) == {}
        gate.up = True
        assert archive.flush(30.0), archive.snapshot()
    finally:
        archive.stop(2.0)
        gate.close()
    # The three newest made it; the two oldest were dropped and counted.
    assert sorted(fetch_all(bucket)) == sorted(keys[2:])
    st = archive.snapshot()
    assert (st.uploaded, st.dropped, st.backlog) == (3, 2, 0)


def test_missing_bucket_counts_failures_and_keeps_the_document(moto: str) -> None:
    archive = S3Archive("no-such-bucket", instance_type="m5.large", region=REGION, endpoint_url=moto,
                        retry_pause=0.1, retry_pause_max=0.2)
    archive.start()
    try:
        archive.submit(fixture_doc("iperf3-3.12-tcp-forward.json"))
        wait(lambda: archive.snapshot().failed >= 2, 20.0, "failed uploads")
        assert archive.snapshot().backlog == 1 and archive.snapshot().uploaded == 0
    finally:
        archive.stop(2.0)


# -- the Athena DDL and query in docs/ against what the archive writes ----------------------------------------
def _sql_blocks() -> tuple[str, str]:
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    ddl = next(b for b in blocks if "CREATE EXTERNAL TABLE" in b)
    query = next(b for b in blocks if b.lstrip().startswith("SELECT"))
    return ddl, query


def _tokens(text: str) -> list[str]:
    return re.findall(r"`[^`]+`|\w+|[<>:,()]", text)


def _parse_type(tokens: list[str], i: int) -> tuple[Any, int]:
    """A Hive type: ('struct', {name: type}), ('array', type) or a scalar name; returns (type, next index)."""
    word = tokens[i].lower()
    if word in ("struct", "array"):
        assert tokens[i + 1] == "<"
        i += 2
        if word == "array":
            inner, i = _parse_type(tokens, i)
            assert tokens[i] == ">"
            return ("array", inner), i + 1
        fields: dict[str, Any] = {}
        while True:
            name = tokens[i].strip("`")
            assert tokens[i + 1] == ":", tokens[i:i + 3]
            fields[name.lower()], i = _parse_type(tokens, i + 2)
            if tokens[i] == ">":
                return ("struct", fields), i + 1
            assert tokens[i] == ","
            i += 1
    if i + 1 < len(tokens) and tokens[i + 1] == "(":          # decimal(38,6)
        i = tokens.index(")", i)
    return word, i + 1


def parse_ddl(ddl: str) -> tuple[dict[str, Any], dict[str, str], str]:
    """(columns, partition columns, LOCATION) of a CREATE EXTERNAL TABLE statement."""
    head, _, rest = ddl.partition("(")
    body, _, tail = rest.partition("\nPARTITIONED BY")
    tokens = _tokens(body.rsplit(")", 1)[0])
    columns: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        name = tokens[i].strip("`").lower()
        columns[name], i = _parse_type(tokens, i + 1)
        if i < len(tokens):
            assert tokens[i] == ",", tokens[i:i + 3]
            i += 1
    part = re.search(r"^\s*\((\w+) (\w+)\)", tail)
    assert part, tail
    location = re.search(r"LOCATION '([^']+)'", tail)
    assert location
    return columns, {part.group(1): part.group(2)}, location.group(1)


def _check(value: Any, tp: Any, path: str) -> None:
    """The document's value at `path` has the declared type (what the JsonSerDe would need)."""
    if isinstance(tp, tuple) and tp[0] == "struct":
        assert isinstance(value, dict), f"{path} is not an object"
        for name, sub in tp[1].items():
            match = [k for k in value if k.lower() == name]      # the SerDe matches names case-insensitively
            assert match, f"{path}.{name} is missing"
            _check(value[match[0]], sub, f"{path}.{name}")
    elif isinstance(tp, tuple) and tp[0] == "array":
        assert isinstance(value, list) and value, f"{path} is not a non-empty array"
        for n, item in enumerate(value):
            _check(item, tp[1], f"{path}[{n}]")
    elif tp in ("bigint", "int"):
        assert isinstance(value, int) and not isinstance(value, bool), f"{path} = {value!r} is not an integer"
    elif tp in ("double", "float") or tp.startswith("decimal"):
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{path} = {value!r} not a number"
    elif tp == "string":
        assert isinstance(value, str), f"{path} = {value!r} is not a string"
    else:
        raise AssertionError(f"{path}: type {tp} not handled by this test")


def _resolve(columns: dict[str, Any], path: list[str]) -> Any:
    tp = columns.get(path[0].lower())
    assert tp is not None, f"query uses column {path[0]!r}, which the DDL does not define"
    for part in path[1:]:
        if isinstance(tp, tuple) and tp[0] == "array":
            tp = tp[1]
        assert isinstance(tp, tuple) and tp[0] == "struct" and part.lower() in tp[1], \
            f"query uses {'.'.join(path)}, which the DDL does not define"
        tp = tp[1][part.lower()]
    return tp


def test_query_uses_only_what_the_ddl_defines() -> None:
    ddl, query = _sql_blocks()
    columns, partitions, _ = parse_ddl(ddl)
    columns = {**columns, **{k: v for k, v in partitions.items()}}
    unnest = re.search(r"UNNEST\((\w+)\) WITH ORDINALITY AS \w+\((\w+), \w+\)", query)
    assert unnest, "the query flattens the intervals as seed 001 does"
    array_col, alias = unnest.groups()
    assert _resolve(columns, [array_col])[0] == "array"
    text = re.sub(r"'[^']*'", "''", query)
    dotted = re.findall(r'"?[A-Za-z_]\w*"?(?:\."?[A-Za-z_]\w*"?)+', text)
    assert dotted
    for ref in dotted:
        path = [p.strip('"') for p in ref.split(".")]
        if path[0] == alias:
            path = [array_col, *path[1:]]
        tp = _resolve(columns, path)
        assert not isinstance(tp, tuple), f"{ref} is not a scalar"
    group = re.search(r"GROUP BY (.*?)\n", text)
    assert group
    for item in group.group(1).split(","):
        _resolve(columns, [p.strip('"') for p in item.strip().split(".")])
    for name in re.findall(r"WHERE (\w+) >=", text):
        assert name in partitions                       # the filter prunes by the d= partition


@pytest.fixture(scope="module")
def engine_docs() -> list[dict[str, Any]]:
    """Documents from burstwatch's own engine against Debian's iperf3 -s, forward and reverse."""
    docs = []
    for reverse in (False, True):
        # A fresh server per test: iperf3 -s answers "busy" to a test that follows the last one too closely.
        port = free_port()
        with iperf3_server(port):
            docs.append(run_probe(ProbeRequest("127.0.0.1", port, streams=2, duration=2.0, reverse=reverse,
                                               interval=1.0)))
    return docs


def test_athena_ddl_and_query_match_what_the_archive_writes(bucket: str, engine_docs: list[dict[str, Any]]) -> None:
    ddl, _ = _sql_blocks()
    columns, partitions, location = parse_ddl(ddl)
    prefix = location.split("/", 3)[3]                       # s3://BUCKET/<prefix>
    archive = S3Archive(BUCKET, prefix=prefix, instance_type="m5.large", region="eu-west-1",
                        instance_id="i-0abc", endpoint_url=bucket)
    archive.start()
    try:
        sources = [fixture_doc("iperf3-3.12-tcp-forward.json"), fixture_doc("iperf3-3.12-tcp-reverse.json"),
                   *engine_docs]
        for doc in sources:
            archive.submit(doc)
        assert archive.flush(20.0)
    finally:
        archive.stop(2.0)
    objects = fetch_all(bucket, prefix)
    assert len(objects) == 4
    for key, body in objects.items():
        # The partition column comes from the key (Hive layout under LOCATION), the rest from the JSON.
        (pname,) = partitions
        assert re.match(rf"^{re.escape(prefix)}{pname}=\d{{4}}-\d{{2}}-\d{{2}}/[^/]+\.json\.gz$", key), key
        doc = json.loads(gzip.decompress(body))
        for name, tp in columns.items():
            match = [k for k in doc if k.lower() == name]
            assert match, f"{key}: column {name} missing"
            _check(doc[match[0]], tp, f"{key}:{name}")
