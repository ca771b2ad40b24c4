"""The fleet service through moto in server mode: publishing, outages and the spool, bounded reads, consensus."""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from agent import aws
from agent.config import FleetConfig
from agent.fleet.service import STATE_FILE, FleetService
from agent.models.fleet import (
    AllowanceConsensus,
    Consensus,
    allowance_record,
    encode,
    learned_record,
    object_key,
    type_prefix,
)
from tests.conftest import free_port, wait_until
from tests.probes.test_archive import Gate

REGION = "us-east-1"
BUCKET = "fleet"
PREFIX = "bw/"
TYPE = "m5.large"
ME = "i-0000000000000000a"
DAY = 86400.0


def s3(url: str) -> Any:
    return aws.client("s3", REGION, url)


def rec(iid: str = ME, direction: str = "out", bucket: float = 3.375e11, at: Optional[float] = None,
        itype: str = TYPE) -> dict[str, Any]:
    return learned_record(instance_type=itype, instance_id=iid, region=REGION, availability_zone="us-east-1a",
                          direction=direction, bucket_bytes=bucket, method="exhaustion", learned_count=1,
                          baseline_bytes_per_second=9.375e7, baseline_source="catalogue",
                          peak_bytes_per_second=1.25e9, peak_source="catalogue", driver="ena",
                          driver_version="2.8.1g", learned_at=time.time() - 60 if at is None else at,
                          agent_version="0.x")


def arec(iid: str = ME, pps: Optional[float] = None, size: Optional[float] = None,
         at: Optional[float] = None) -> dict[str, Any]:
    return allowance_record(instance_type=TYPE, instance_id=iid, region=REGION, learned_at=time.time() - 60
                            if at is None else at, pps_ceiling_packets_per_second=pps, conntrack_size_entries=size,
                            agent_version="0.x")


def cfg(url: str, **over: Any) -> FleetConfig:
    base: dict[str, Any] = dict(enabled=True, bucket=BUCKET, prefix=PREFIX, region=REGION, endpoint_url=url,
                                refresh_interval=1.0, publish_interval=0.0, min_instances=3)
    base.update(over)
    return FleetConfig(**base)


class Counting:
    """A boto3 S3 client that counts its calls (by method) and the threads that made them."""

    def __init__(self, client: Any, calls: dict[str, int], threads: set[str]) -> None:
        self._client, self._calls, self._threads = client, calls, threads

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls[name] = self._calls.get(name, 0) + 1
            self._threads.add(threading.current_thread().name)
            return attr(*args, **kwargs)
        return call


class Harness:
    def __init__(self, url: str, state_dir: Path, **over: Any) -> None:
        self.url, self.state_dir = url, state_dir
        self.calls: dict[str, int] = {}
        self.threads: set[str] = set()
        self.adopted: list[Optional[Consensus]] = []
        self.over = over
        self.svc: Optional[FleetService] = None

    def start(self, url: Optional[str] = None, instance_id: str = ME, **kw: Any) -> FleetService:
        target = url or self.url

        def factory() -> Any:
            return Counting(aws.client("s3", REGION, target, max_attempts=1, connect_timeout=1.0, read_timeout=2.0),
                            self.calls, self.threads)

        self.svc = FleetService(cfg(target, **self.over), instance_type=TYPE, instance_id=instance_id,
                                region=REGION, state_dir=str(self.state_dir), on_consensus=self.adopted.append,
                                client_factory=factory, retry_pause=0.1, retry_pause_max=0.3, **kw)
        self.svc.start()
        return self.svc

    def stop(self) -> None:
        if self.svc is not None:
            self.svc.stop(3.0)
            self.svc = None


def judged(svc: FleetService, timeout: float = 10.0) -> None:
    """Wait until the service has taken every pending record and judged it (published or not worth it), and
    the uploads are done: proof, not a pause, before asserting that something was not published."""
    wait_until(lambda: not svc._has_pending(), timeout, "the pending records judged")
    assert svc.flush(timeout), svc.snapshot()


@pytest.fixture()
def bucket(moto: str) -> str:
    s3(moto).create_bucket(Bucket=BUCKET)
    return moto


@pytest.fixture()
def harness(bucket: str, tmp_path: Path) -> Any:
    hs: list[Harness] = []

    def make(**over: Any) -> Harness:
        h = Harness(bucket, tmp_path, **over)
        hs.append(h)
        return h
    yield make
    for h in hs:
        h.stop()


def objects(url: str, prefix: str = PREFIX) -> dict[str, bytes]:
    client = s3(url)
    listing = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listing}


def put(url: str, key: str, body: bytes) -> None:
    s3(url).put_object(Bucket=BUCKET, Key=key, Body=body)


def peer(url: str, iid: str, bucket: float, itype: str = TYPE, at: Optional[float] = None) -> str:
    r = rec(iid, bucket=bucket, itype=itype, at=at)
    key = object_key(PREFIX, itype, iid, r["learned_at"])
    put(url, key, encode([r]))
    return key


KEY_RE = re.compile(rf"^{re.escape(PREFIX)}learned/type=m5\.large/{ME}-(\d+)\.json$")


# -- publishing ----------------------------------------------------------------------------------------------
def test_publish_puts_one_object_at_the_documented_key_off_the_callers_thread(harness: Any) -> None:
    h = harness(refresh_interval=3600.0)
    svc = h.start()
    records = [rec(direction="in", bucket=3.0e11), rec(direction="out")]
    svc.publish(records)                                            # returns at once: the proof is below
    assert svc.flush(15.0), svc.snapshot()
    got = objects(h.url)
    assert len(got) == 1
    (key, body), = got.items()
    m = KEY_RE.match(key)
    assert m, key
    assert abs(int(m.group(1)) - time.time()) < 30
    assert body == encode(records)                                  # both directions in one object
    assert [json.loads(line)["direction"] for line in body.splitlines()] == ["in", "out"]
    st = svc.snapshot()
    assert (st.published, st.publish_failures, st.backlog, st.dropped) == (1, 0, 0, 0)
    assert st.requests["put"] == 1
    assert "MainThread" not in h.threads                            # S3 is only touched by the service's threads


def test_publish_rules_change_age_and_interval(harness: Any, tmp_path: Path) -> None:
    # The service's wall clock is the test's: publish_interval passes when the test says so, not when a sleep
    # happens to have lasted long enough.
    now = [float(int(time.time()))]
    state = tmp_path / STATE_FILE

    def pending_out() -> Optional[float]:
        """The held-back record the service thread last saved: proof that it saw the publish and held it."""
        doc = json.loads(state.read_text()) if state.exists() else {}
        return (doc.get("pending") or {}).get("out", {}).get("bucket_bytes")

    h = harness(refresh_interval=3600.0, publish_interval=2.0)
    svc = h.start(wall=lambda: now[0])
    svc.publish([rec(bucket=1.00e11)])
    assert svc.flush(15.0)
    assert len(objects(h.url)) == 1
    now[0] += 1.0                                       # within publish_interval
    svc.publish([rec(bucket=1.20e11)])                  # worth it, but publish_interval holds it back...
    svc.publish([rec(bucket=1.30e11)])                  # ...and the latest wins meanwhile
    wait_until(lambda: pending_out() == 1.30e11, 10.0, "the held-back record in the state file")
    assert len(objects(h.url)) == 1
    now[0] += 1.5                                       # publish_interval has passed
    svc.publish([])                                     # wakes the service thread
    assert svc.flush(15.0)
    bodies = sorted(objects(h.url).items())
    assert [json.loads(b)["bucket_bytes"] for _k, b in bodies] == [1.0e11, 1.3e11]
    k1, k2 = (int(KEY_RE.match(k).group(1)) for k, _b in bodies)   # type: ignore[union-attr]
    assert k2 - k1 >= 2
    now[0] += 2.5
    svc.publish([rec(bucket=1.34e11)])                  # moved < 5 %: not worth an object
    judged(svc)
    assert len(objects(h.url)) == 2 and pending_out() is None
    h.stop()
    saved = json.loads(state.read_text())
    assert saved["published"]["out"]["bucket_bytes"] == 1.3e11

    # A restart remembers what was published: the same value again is not re-published.
    h2 = harness(refresh_interval=3600.0, publish_interval=0.0)
    svc2 = h2.start(wall=lambda: now[0])
    svc2.publish([rec(bucket=1.31e11)])
    judged(svc2)
    assert len(objects(h.url)) == 2 and svc2.snapshot().published == 0


def test_held_back_record_survives_a_restart(harness: Any, tmp_path: Path) -> None:
    h = harness(refresh_interval=3600.0, publish_interval=600.0)
    svc = h.start()
    svc.publish([rec(bucket=1.0e11)])
    assert svc.flush(10.0)
    svc.publish([rec(bucket=2.0e11)])                   # waits 600 s
    state = tmp_path / STATE_FILE                       # written by the service thread, atomically
    wait_until(lambda: state.exists() and json.loads(state.read_text()).get("pending"), 5.0,
               "pending record saved")
    h.stop()
    h2 = harness(refresh_interval=3600.0, publish_interval=0.0)
    svc2 = h2.start()
    # The object is in S3 a moment before the uploader counts it: wait for both.
    wait_until(lambda: len(objects(h.url)) == 2 and svc2.snapshot().published == 1, 10.0,
               "the held-back record published after the restart")


@pytest.mark.slow
def test_s3_down_during_publication_then_back(harness: Any, bucket: str) -> None:
    gate = Gate(bucket)
    try:
        h = harness(refresh_interval=3600.0)
        svc = h.start(url=gate.url)
        svc.publish([rec()])
        wait_until(lambda: svc.snapshot().publish_failures >= 2, 20.0, "failed uploads while S3 is down")
        st = svc.snapshot()
        assert st.published == 0 and st.backlog == 1 and objects(bucket) == {}
        assert gate.refused >= 2
        gate.up = True
        assert svc.flush(20.0), svc.snapshot()
        assert len(objects(bucket)) == 1 and svc.snapshot().published == 1
    finally:
        gate.close()


@pytest.mark.slow
def test_s3_down_across_a_restart_the_spool_delivers(harness: Any, bucket: str, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"          # nothing listens there
    h = harness(refresh_interval=3600.0)
    svc = h.start(url=closed)
    svc.publish([rec(direction="in", bucket=2e11), rec(direction="out", bucket=3e11)])
    wait_until(lambda: svc.snapshot().publish_failures >= 1, 20.0, "a failed upload")
    h.stop()
    spooled = list((tmp_path / "spool" / "fleet").glob("*.rec"))
    assert len(spooled) == 1
    h2 = harness(refresh_interval=3600.0)
    svc2 = h2.start()
    assert svc2.flush(20.0), svc2.snapshot()
    got = objects(bucket)
    assert len(got) == 1
    body = next(iter(got.values()))
    assert [json.loads(line)["bucket_bytes"] for line in body.splitlines()] == [2e11, 3e11]
    assert not list((tmp_path / "spool" / "fleet").glob("*.rec"))
    svc2.publish([rec(direction="out", bucket=3e11)])   # already published (by the spool): nothing new
    assert svc2.flush(5.0)
    assert len(objects(bucket)) == 1


# -- reading -------------------------------------------------------------------------------------------------
def test_garbage_and_foreign_objects_are_ignored_and_counted(harness: Any, bucket: str) -> None:
    part = type_prefix(PREFIX, TYPE)
    for i, value in enumerate((3.3e11, 3.4e11, 3.5e11)):
        peer(bucket, f"i-00000000000000{i:03d}", value)
    put(bucket, part + "i-junk-1.json", b"{not json")
    put(bucket, part + "i-binary-1.json", b"\xff\xfe\x00")
    put(bucket, part + "i-huge-1.json", b" " * (64 * 1024 + 1))
    put(bucket, part + "i-v2-1.json", json.dumps({**rec(), "format": "burstwatch-learned/2"}).encode())
    put(bucket, part + "i-other-1.json", encode([rec("i-other", itype="c5.large")]))    # foreign record
    put(bucket, part + "nested/i-x-1.json", encode([rec("i-x")]))                         # foreign key
    peer(bucket, "i-c5", 1e9, itype="c5.large")          # another type's partition: never even listed
    h = harness(refresh_interval=3600.0)
    svc = h.start()
    wait_until(lambda: svc.snapshot().refreshes >= 1, 15.0, "the first refresh")
    st = svc.snapshot()
    assert st.rejected == {"garbage": 4, "foreign": 2}
    assert st.objects_read == 3 + 4                      # the huge one and the nested one were never fetched
    assert h.calls.get("get_object") == 7 and st.requests == {"list": 1, "get": 7, "put": 0}
    assert st.consensus is not None and st.consensus.instances == 3 and st.consensus.bucket_bytes == 3.4e11
    assert h.adopted == [st.consensus]
    assert st.refresh_errors == {}


@pytest.mark.slow
def test_consensus_needs_min_instances_and_second_refresh_gets_only_new_keys(harness: Any, bucket: str) -> None:
    peer(bucket, "i-001", 3.3e11)
    peer(bucket, "i-002", 3.5e11)
    peer(bucket, "i-002", 3.6e11, at=time.time() - DAY)       # the same instance again: counts once
    h = harness(refresh_interval=1.0)
    svc = h.start()
    wait_until(lambda: svc.snapshot().refreshes >= 2, 15.0, "two refreshes")
    assert h.adopted == [] and svc.snapshot().consensus is None
    gets = h.calls["get_object"]
    assert gets == 3                                          # the second refresh listed, fetched nothing
    peer(bucket, "i-003", 3.4e11)
    wait_until(lambda: h.adopted, 15.0, "consensus adopted once three instances agree")
    c = h.adopted[-1]
    assert c is not None and c.instances == 3
    assert h.calls["get_object"] == gets + 1                 # only the new key
    refreshes = svc.snapshot().refreshes
    wait_until(lambda: svc.snapshot().refreshes >= refreshes + 1, 15.0, "another refresh")
    assert h.calls["get_object"] == gets + 1 and len(h.adopted) == 1
    # The consensus goes away when the objects behind it do: on_consensus(None).
    client = s3(bucket)
    for o in client.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]:
        if "i-003" in o["Key"]:
            client.delete_object(Bucket=BUCKET, Key=o["Key"])
    wait_until(lambda: h.adopted[-1] is None, 15.0, "consensus withdrawn")
    assert svc.snapshot().consensus is None


@pytest.mark.slow
def test_a_big_partition_is_sampled_in_one_bounded_window(harness: Any, bucket: str) -> None:
    for i in range(12):
        peer(bucket, f"i-{i:017x}", 3.4e11 + i * 1e9)
    h = harness(refresh_interval=1.0, max_objects=5, min_instances=5)
    svc = h.start(rng=random.Random(7))
    wait_until(lambda: svc.snapshot().refreshes >= 3, 20.0, "three refreshes")
    st = svc.snapshot()
    assert h.calls["get_object"] == 5                        # one window of 5 keys, fetched once
    # The first refresh found the partition bigger than a page (1 LIST) and moved to its random window;
    # each later refresh lists that window again (1 LIST, 2 when it wraps past the end).
    assert st.requests["list"] <= 1 + 2 * st.refreshes
    assert svc.reader.start_after is not None
    assert st.consensus is not None and st.consensus.instances == 5


def test_access_denied_is_counted_by_kind_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from botocore.exceptions import ClientError

    class Denied:
        def list_objects_v2(self, **_kw: Any) -> Any:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, "ListObjectsV2")

    adopted: list[Optional[Consensus]] = []
    svc = FleetService(cfg("http://127.0.0.1:1"), instance_type=TYPE, instance_id=ME, region=REGION,
                       state_dir=str(tmp_path), on_consensus=adopted.append, client_factory=Denied)
    caplog.set_level(logging.DEBUG, logger="agent.fleet")
    assert svc.refresh() is False and svc.refresh() is False
    st = svc.snapshot()
    assert st.refresh_errors == {"credentials": 2} and st.refreshes == 0 and adopted == []
    denied = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(denied) == 1
    msg = denied[0].getMessage()
    assert "s3:ListBucket" in msg and f"s3://{BUCKET}/{PREFIX}learned/type={TYPE}/" in msg
    assert "docs/fleet.md#iam" in msg


# -- allowances without a bucket (issue 22) ------------------------------------------------------------------
def lines(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines()]


def test_allowances_are_published_alone_by_the_buckets_rules(harness: Any, tmp_path: Path) -> None:
    h = harness(refresh_interval=3600.0)
    svc = h.start()
    svc.publish_allowances(arec(pps=1.0e6))
    assert svc.flush(15.0), svc.snapshot()
    (body,) = objects(h.url).values()
    assert lines(body) == [arec(pps=1.0e6, at=lines(body)[0]["learned_at"])]         # one allowance line
    svc.publish_allowances(arec(pps=1.04e6))                 # moved < 5 %: not worth an object
    judged(svc)
    assert len(objects(h.url)) == 1
    svc.publish_allowances(arec(pps=1.04e6, size=9e5))       # a new figure: worth it
    assert svc.flush(10.0)
    wait_until(lambda: len(objects(h.url)) == 2, 10.0, "the allowance object with a new figure")
    # A bucket learned meanwhile: the figures ride on its lines, and never beside them as a line of their own
    # (a reader of before allowance lines rejects an object whole; the bucket lines must reach it).
    with svc._cond:                                          # both pending at once (the lock is re-entrant)
        svc.publish([rec(direction="in", bucket=3e11)])
        svc.publish_allowances(arec(pps=2e6, size=9e5))
    wait_until(lambda: len(objects(h.url)) == 3, 10.0, "the bucket object")
    newest = lines(sorted(objects(h.url).items())[-1][1])
    assert len(newest) == 1 and newest[0]["direction"] == "in"
    assert (newest[0]["pps_ceiling_packets_per_second"], newest[0]["conntrack_size_entries"]) == (2e6, 9e5)
    h.stop()
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["published_allowances"]["pps_ceiling_packets_per_second"]["value"] == 2e6
    # A restart remembers: the same figures again are not re-published.
    h2 = harness(refresh_interval=3600.0)
    svc2 = h2.start()
    svc2.publish_allowances(arec(pps=2.01e6, size=9.1e5))
    judged(svc2)
    assert len(objects(h.url)) == 3 and svc2.snapshot().published == 0


def test_allowance_consensus_without_any_bucket_is_handed_to_on_allowances(harness: Any, bucket: str) -> None:
    for i, pps in enumerate((2.0e6, 2.1e6, 1.9e6)):
        iid = f"i-00000000000000{i:03d}"
        r = arec(iid, pps=pps, size=9e5 if i else None)
        put(bucket, object_key(PREFIX, TYPE, iid, r["learned_at"]), encode([r]))
    got: list[AllowanceConsensus] = []
    h = harness(refresh_interval=3600.0)
    svc = h.start(on_allowances=got.append)
    wait_until(lambda: svc.snapshot().refreshes >= 1, 15.0, "the first refresh")
    st = svc.snapshot()
    assert st.rejected == {"garbage": 0, "foreign": 0} and st.objects_read == 3
    assert st.consensus is None and h.adopted == []           # no bucket, no bucket consensus
    assert got == [AllowanceConsensus(2.0e6, 3, None, 0)] == [st.allowances]
