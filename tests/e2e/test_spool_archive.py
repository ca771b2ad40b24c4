"""Nothing lost across restarts, S3 side: the real daemon probes an iperf3 server while S3 is unreachable,
is killed with kill -9, and once started again with S3 back, every spooled probe document arrives once."""

from __future__ import annotations

import gzip
import json
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from agent import aws
from agent.probes.archive import parse_spool_record
from agent.writers.spool import Spool
from tests.conftest import ROOT, _real_create_connection, require_root_tools, wait_until
from tests.support.credit_lab import parse_metrics
from tests.support.daemon_config import daemon_config
from tests.support.lab import Lab, run_in_ns

pytestmark = pytest.mark.netns

BUCKET = "probe-archive"
IPERF_PORT = 5301


class NsForwarder:
    """TCP from 127.0.0.1:`port` inside namespace `ns` to `upstream` in the test's own namespace (moto):
    the listening socket is made in the namespace, the connections upstream from here. down() refuses new
    connections and cuts the open ones, as a dead endpoint would; up() listens again on the same port."""

    def __init__(self, ns: str, upstream: tuple[str, int]) -> None:
        self.ns, self.upstream = ns, upstream
        self.port = 0
        self._listener: Optional[socket.socket] = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def up(self) -> None:
        def listen() -> socket.socket:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.port))
            s.listen(16)
            return s

        self._listener = run_in_ns(self.ns, listen)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def down(self) -> None:
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)   # wakes the accept() (close alone does not)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                up = _real_create_connection(self.upstream, timeout=10)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns += [conn, up]
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _config(tmp: Path, s3_port: int) -> Path:
    # Lab timings: [probe] interval 10 s (EC2 default 900 s; 10 s is the smallest allowed), duration 1 s
    # (default 5 s), one stream (default 4); the S3 retry pause stays at its default (2 s, doubling).
    return daemon_config(
        tmp, metrics={"listen": "127.0.0.1:9786"},
        instance={"type": "lab.archive", "bandwidth": {"baseline_gbps": 0.05, "peak_gbps": 0.05}},
        probe={"peers": [f"127.0.0.1:{IPERF_PORT}"], "interval": 10.0, "duration": 1.0, "streams": 1,
               "credit_floor": 0.0,
               "archive": {"enabled": True, "bucket": BUCKET, "region": "us-east-1",
                           "endpoint_url": f"http://127.0.0.1:{s3_port}"}})


def _records(spool: Path) -> list[Path]:
    """The record files (read without the Spool class, which would tidy temp files under the daemon)."""
    return sorted(spool.glob("*.rec")) if spool.exists() else []



def test_kill_9_while_s3_is_down_then_every_spooled_document_arrives_once(moto: str, tmp_path: Path) -> None:
    require_root_tools("ip", "tc", "iperf3")
    s3 = aws.client("s3", "us-east-1", moto)
    s3.create_bucket(Bucket=BUCKET)
    host, port = moto.rsplit("//", 1)[1].split(":")
    spool = tmp_path / "state" / "spool" / "probe-archive"
    with Lab() as lab:
        ns = lab.host("arc")
        # Probes run over this namespace's loopback, shaped to 50 Mbit/s so they cost ~6 MB, not a core.
        lab.tbf(ns, "lo", 50_000_000, 200_000, limit_bytes=1_000_000)
        lab.popen(ns, "iperf3", "-s", "-p", str(IPERF_PORT))
        fwd = NsForwarder(ns, (host, int(port)))
        fwd.up()
        fwd.down()                                   # S3 unreachable from the start (its port refuses)
        cfg = _config(tmp_path, fwd.port)
        log = open(tmp_path / "agent.log", "ab")
        first = lab.popen(ns, sys.executable, "-m", "agent", "run", "--config", str(cfg), cwd=str(ROOT),
                          stdout=log, stderr=log)
        lab.wait_http(ns, "http://127.0.0.1:9786/metrics")
        wait_until(lambda: len(_records(spool)) >= 2, 60, "two probe documents in the spool", interval=0.2)
        first.send_signal(signal.SIGKILL)
        first.wait(5)
        records = Spool(spool, "probe-archive", 10**6, 1 << 34).load()
        spooled = dict(parse_spool_record(p) for _rid, p in records)
        assert len(spooled) == len(records) >= 2
        assert not s3.list_objects_v2(Bucket=BUCKET).get("KeyCount")

        fwd.up()                                     # S3 is back; the daemon starts again
        second = lab.popen(ns, sys.executable, "-m", "agent", "run", "--config", str(cfg), cwd=str(ROOT),
                           stdout=log, stderr=log)
        try:
            def metrics() -> dict[str, float]:
                return parse_metrics(lab.http_get(ns, "http://127.0.0.1:9786/metrics"))

            def uploaded_once(m: dict[str, float]) -> bool:
                """The spooled documents and this run's own probes' ones uploaded, each once (a probe of this
                run may be finishing: then the figures agree a moment later)."""
                runs = sum(v for k, v in m.items() if k.startswith("burstwatch_probe_runs_total")
                           and 'result="success"' in k)
                return m["burstwatch_probe_archive_backlog"] == 0 and \
                    m["burstwatch_probe_archive_uploaded_total"] == len(records) + runs

            lab.wait_http(ns, "http://127.0.0.1:9786/metrics")
            wait_until(lambda: not _records(spool), 30, "the spool to drain", interval=0.2)
            wait_until(lambda: uploaded_once(metrics()), 20, "every document uploaded once", interval=0.2)
            m = metrics()
            stored = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}
            assert set(spooled) <= stored
            for key, body in spooled.items():
                got = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
                assert got == body
                doc = json.loads(gzip.decompress(got))
                assert doc["instanceType"] == "lab.archive" and "end" in doc
            assert m['burstwatch_spool_replayed_records_total{spool="probe-archive"}'] == len(records)
            assert m['burstwatch_state_write_errors_total{file="spool/probe-archive"}'] == 0
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(10)
            fwd.down()
            log.close()


# -- the archive's bookkeeping, without a network (fast) --------------------------------------------------
class FakeS3:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.keys: list[str] = []

    def put_object(self, Bucket: str, Key: str, Body: bytes, ContentType: str) -> None:
        if self.fail:
            raise ConnectionRefusedError("S3 down")
        self.keys.append(Key)


def _doc(ts: int) -> dict[str, Any]:
    return {"start": {"timestamp": {"timesecs": ts}}, "end": {}}


def test_spooled_documents_go_first_in_order_and_bounds_drop_the_oldest_everywhere(tmp_path: Path) -> None:
    from agent.probes.archive import S3Archive

    def archive(client: FakeS3, backlog: int = 10, objects: int = 10) -> S3Archive:
        a = S3Archive(BUCKET, instance_type="m5.large", client=client, backlog=backlog, retry_pause=0.05,
                      retry_pause_max=0.05)
        a.use_spool(Spool(tmp_path, "probe-archive", objects, 1 << 20))
        return a

    down = FakeS3(fail=True)
    a = archive(down, backlog=3, objects=10)
    keys = [a.submit(_doc(1_700_000_000 + i)) for i in range(5)]   # memory holds 3: the 2 oldest dropped
    assert a.snapshot().dropped == 2 and len(_records(tmp_path)) == 3
    b = archive(down, backlog=10, objects=2)                        # the spool now holds 2: 1 more dropped
    assert b.snapshot().backlog == 2 and len(_records(tmp_path)) == 2
    b.submit(_doc(1_700_000_100))                                   # evicts the oldest, from memory too
    assert b.snapshot().backlog == 2 and b.snapshot().dropped == 1

    up = FakeS3(fail=False)
    c = archive(up)
    late = c.submit(_doc(1_700_000_200))
    c.start()
    try:
        assert c.flush(5.0)
    finally:
        c.stop(1.0)
    assert up.keys == [keys[4], object_key_for(1_700_000_100), late]    # spooled first, oldest first
    assert not _records(tmp_path)


def object_key_for(ts: int) -> str:
    from agent.probes.archive import object_key

    return object_key("", "m5.large", ts)
