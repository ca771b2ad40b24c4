"""The fleet end to end (docs/fleet.md): three real daemons, one real S3 API (moto in server mode).

All of it lives in the credit lab's instance namespace: the learner shapes eth0 with tbf like EC2's
bucket; two adopters of the same type watch `lo` (they never see that traffic, so they cannot learn);
each daemon has its own IMDS server (its own instance id); moto listens on the namespace's loopback.

1. S3 is down while the learner learns the bucket from a real exhaustion: the object waits (spooled).
2. S3 comes back holding one agreeing object from another instance, garbage and a foreign object: the
   learner's object arrives; the adopters, which need two instances to agree, adopt the median as their
   bucket prior (source "fleet") and count the garbage and the foreign object.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from agent.models.fleet import encode, learned_record, object_key
from tests.conftest import MOTO_SERVER, require_root_tools
from tests.support.credit_lab import ROOT, CreditLab, LabProfile, parse_metrics
from tests.support.daemon_config import daemon_config, toml_text
from tests.support.imds_server import ImdsServer, metadata_tree
from tests.support.lab import run_in_ns

pytestmark = [pytest.mark.netns, pytest.mark.slow]

TYPE = "lab.shaper"
BUCKET = "fleet-bucket"
PREFIX = "fleet/"
MOTO_PORT = 5055                      # inside the lab's own namespace
ENDPOINT = f"http://127.0.0.1:{MOTO_PORT}"
ADOPTER_PORTS = (9787, 9788)


def fleet_table(min_instances: int = 2) -> dict[str, Any]:
    # Lab time scale: reads every second, no hold between publications (EC2 defaults: 3 h and a day).
    return {"enabled": True, "bucket": BUCKET, "prefix": PREFIX, "region": "us-east-1", "endpoint_url": ENDPOINT,
            "refresh_interval": 1.0, "publish_interval": 0.0, "min_instances": min_instances}


def series(m: dict[str, float], name: str, **labels: str) -> Optional[float]:
    """The value of the one series of `name` carrying all of `labels` (None when absent)."""
    for key, value in m.items():
        base, _, rest = key.partition("{")
        if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            return value
    return None


def bucket_source(m: dict[str, float], direction: str = "out") -> Optional[str]:
    for key, value in m.items():
        if key.startswith("burstwatch_credit_bucket_info{") and f'direction="{direction}"' in key and value == 1:
            found = re.search(r'source="([^"]*)"', key)
            return found.group(1) if found else None
    return None


def s3(cl: CreditLab) -> Any:
    """A boto3 client whose sockets live in the lab namespace (moto listens on its loopback)."""
    import boto3
    from botocore.config import Config

    return run_in_ns(cl.inst, lambda: boto3.client("s3", region_name="us-east-1", endpoint_url=ENDPOINT,
                                                   config=Config(retries={"max_attempts": 1})))


def in_ns(cl: CreditLab, fn: Any) -> Any:
    return run_in_ns(cl.inst, fn)


@pytest.fixture(autouse=True)
def _tools() -> None:
    require_root_tools("ip", "tc", "ethtool")
    if not MOTO_SERVER.exists():
        pytest.fail(f"{MOTO_SERVER} missing: run `make test-deps`")


def test_one_learns_and_publishes_through_an_outage_two_adopt_the_fleet_median(tmp_path: Path) -> None:
    p = LabProfile()
    cl = CreditLab(p, configured_bucket_mbit=2 * p.bucket_mbit, trust_configured_bucket=False,
                   state_dir=str(tmp_path / "learner"))
    imds = [ImdsServer(metadata_tree(instance_id=f"i-0fleet00000000{n:03d}", instance_type=TYPE, enis=()))
            for n in range(3)]
    adopters: list[subprocess.Popen] = []
    moto: Optional[subprocess.Popen] = None
    try:
        for server in imds:
            in_ns(cl, server.start)
        # The learner: the lab's config with its own IMDS and the fleet on.
        text = cl.config.read_text()
        for old, new in (("[imds]\nenabled = false", f'[imds]\nendpoint = "{imds[0].url}"\ntimeout = 0.5'),
                         (f'[instance]\ntype = "{TYPE}"', f'[instance]\ntype = "{TYPE}"\ndescribe_api = false')):
            assert old in text, (old, text)
            text = text.replace(old, new)
        cl.config.write_text(text + toml_text({"fleet": fleet_table()}))
        cl.start_agent()
        for n, port in enumerate(ADOPTER_PORTS, start=1):
            cfg = daemon_config(
                tmp_path, f"adopter{n}", sample_interval=p.sample_interval, state_dir=tmp_path / f"adopter{n}",
                metrics={"listen": f"127.0.0.1:{port}"}, imds={"endpoint": imds[n].url, "timeout": 0.5},
                instance={"describe_api": False,
                          "bandwidth": {"baseline_gbps": p.baseline_mbit / 1000, "peak_gbps": p.peak_mbit / 1000}},
                credits={"shaping_source": "none"}, fleet=fleet_table())
            adopters.append(cl.lab.popen(cl.inst, sys.executable, "-m", "agent", "run", "--config", str(cfg),
                                         cwd=str(ROOT), stdout=subprocess.DEVNULL,
                                         stderr=open(tmp_path / f"adopter{n}.log", "ab")))

        def adopter(port: int) -> dict[str, float]:
            return parse_metrics(cl.lab.http_get(cl.inst, f"http://127.0.0.1:{port}/metrics"))

        for port in ADOPTER_PORTS:
            cl.lab.wait_http(cl.inst, f"http://127.0.0.1:{port}/metrics", timeout=20)
        for port in ADOPTER_PORTS:
            assert bucket_source(adopter(port)) == "default", adopter(port)

        # 1. S3 down: a real exhaustion teaches the learner its bucket; the object waits.
        tr = cl.traffic("out")
        tr.start()
        t0 = cl.wait_drain_start("out")
        cl.wait_clamp("out", t0)
        _wait(lambda: cl.credit("out")["bucket_learned_total"] >= 1, 10, "the learner learning its bucket")
        tr.stop()
        learned = cl.credit("out")["bucket_bytes"]
        assert abs(learned / p.bucket - 1.0) <= 0.25, (learned, p.bucket)
        _wait(lambda: (series(cl.metrics(), "burstwatch_fleet_backlog_objects") or 0) >= 1, 10,
              "the learned object waiting for S3")
        assert (series(cl.metrics(), "burstwatch_fleet_published_total") or 0) == 0
        for port in ADOPTER_PORTS:
            m = adopter(port)
            assert bucket_source(m) == "default", m
            assert series(m, "burstwatch_fleet_consensus_instances") == 0, m

        # 2. S3 comes back with one agreeing instance, garbage and a foreign object in the partition.
        moto = cl.lab.popen(cl.inst, str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(MOTO_PORT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cl.lab.wait_http(cl.inst, f"{ENDPOINT}/moto-api/", timeout=20)
        client = s3(cl)
        in_ns(cl, lambda: client.create_bucket(Bucket=BUCKET))
        other = learned_record(
            instance_type=TYPE, instance_id="i-0fleetother0000001", region="us-east-1",
            availability_zone="us-east-1b", direction="out", bucket_bytes=p.bucket * 1.04, method="exhaustion",
            learned_count=1, baseline_bytes_per_second=p.baseline, baseline_source="config",
            peak_bytes_per_second=p.peak, peak_source="config", driver="ena", driver_version="2.8.1g",
            learned_at=time.time() - 3600, agent_version="test")
        foreign = dict(other, instance_type="m5.large", instance_id="i-0fleetforeign00001",
                       bucket_bytes=p.bucket * 40)
        puts = {object_key(PREFIX, TYPE, "i-0fleetother0000001", int(time.time()) - 3600): encode([other]),
                object_key(PREFIX, TYPE, "i-0fleetforeign00001", int(time.time()) - 60): encode([foreign]),
                f"{PREFIX}learned/type={TYPE}/i-0garbage-1.json": b"\x00not json at all",
                f"{PREFIX}learned/type={TYPE}/i-0garbage-2.json": json.dumps({"format": "other/9"}).encode()}
        for key, body in puts.items():
            in_ns(cl, lambda key=key, body=body: client.put_object(Bucket=BUCKET, Key=key, Body=body))

        # The learner's object arrives (after its retry pause), at its key, with the learned figure.
        _wait(lambda: (series(cl.metrics(), "burstwatch_fleet_published_total") or 0) >= 1, 40,
              "the learner's object uploaded once S3 is back")
        keys = [o["Key"] for o in in_ns(cl, lambda: client.list_objects_v2(Bucket=BUCKET))["Contents"]]
        pattern = rf"{PREFIX}learned/type={re.escape(TYPE)}/i-0fleet00000000000-\d+\.json"
        mine = [k for k in keys if re.fullmatch(pattern, k)]
        assert len(mine) == 1, keys
        body = in_ns(cl, lambda: client.get_object(Bucket=BUCKET, Key=mine[0])["Body"].read())
        rows = [json.loads(line) for line in body.decode().splitlines()]
        out = [r for r in rows if r["direction"] == "out"]
        assert out and abs(out[0]["bucket_bytes"] / learned - 1) < 0.01, rows
        assert out[0]["instance_type"] == TYPE and out[0]["method"] == "exhaustion", rows
        assert out[0]["baseline_bytes_per_second"] == pytest.approx(p.baseline), rows

        # Two instances agree now: both adopters take the median as their prior.
        want = (learned + p.bucket * 1.04) / 2
        for port in ADOPTER_PORTS:
            _wait(lambda port=port: bucket_source(adopter(port)) == "fleet", 20, f"adopter :{port} adopting")
            m = adopter(port)
            assert series(m, "burstwatch_fleet_consensus_instances") == 2, m
            assert series(m, "burstwatch_credit_bucket_bytes", direction="out") == pytest.approx(want, rel=0.02)
            assert (series(m, "burstwatch_fleet_objects_rejected_total", reason="garbage") or 0) >= 2, m
            assert (series(m, "burstwatch_fleet_objects_rejected_total", reason="foreign") or 0) >= 1, m
        # The learner keeps what it learned itself (own learned outranks the fleet).
        assert bucket_source(cl.metrics()) == "learned"
    finally:
        for proc in adopters:
            proc.terminate()
        for proc in adopters:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if moto is not None:
            moto.terminate()
        for server in imds:
            server.stop()
        cl.close()


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except (OSError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.2)
