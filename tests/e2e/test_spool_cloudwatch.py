"""Nothing lost across restarts: the real daemon is killed (kill -9, or stopped) during a CloudWatch outage,
started again with the endpoint back, and every period it closed arrives in CloudWatch (moto) exactly once."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from agent import aws
from agent.cloudwatch.backlog import decode_batch
from agent.writers.spool import Spool
from tests.conftest import ROOT, free_port, scrape_metrics, wait_port, wait_until
from tests.support.daemon_config import daemon_config
from tests.support.throttle_proxy import ThrottleProxy

pytestmark = pytest.mark.slow  # the real daemon and moto on loopback, ~30 s a case

NS = "Burstwatch"
# Lab timings, scaled down from the EC2 defaults so a test runs in ~30 s: sample_interval 0.25 s (default
# 1 s), period 1 s (default 60 s, high resolution below 60), flush_interval 1 s (default max(period, 10 s)).
SAMPLE, PERIOD = 0.25, 1
PER_PERIOD = round(PERIOD / SAMPLE)


def _config(tmp: Path, endpoint: str, port: int) -> Path:
    return daemon_config(tmp, sample_interval=SAMPLE, metrics={"listen": f"127.0.0.1:{port}"},
                         instance={"type": "m5.large"},
                         cloudwatch={"enabled": True, "endpoint_url": endpoint, "region": "us-east-1",
                                     "period": PERIOD, "flush_interval": 1})


def _start(cfg: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    wait_port("127.0.0.1", port)
    return proc




def _spool_files(spool: Path) -> list[str]:
    return sorted(n.name for n in spool.glob("*.rec")) if spool.exists() else []


def _stats(cw: Any, metric: str, dims: list[dict[str, str]], start: float, end: float) -> dict[float, dict]:
    resp = cw.get_metric_statistics(Namespace=NS, MetricName=metric, Dimensions=dims,
                                    StartTime=datetime.fromtimestamp(start, tz=timezone.utc),
                                    EndTime=datetime.fromtimestamp(end, tz=timezone.utc), Period=PERIOD,
                                    Statistics=["SampleCount", "Sum", "Minimum", "Maximum"])
    return {p["Timestamp"].timestamp(): p for p in resp["Datapoints"]}


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_restart_during_an_outage_loses_no_period_and_sends_none_twice(
        moto: str, proxy: ThrottleProxy, tmp_path: Path, how: signal.Signals) -> None:
    port = free_port()
    cfg = _config(tmp_path, proxy.url, port)
    log = tmp_path / "agent.log"
    spool = tmp_path / "state" / "spool" / "cloudwatch"
    cw = aws.client("cloudwatch", "us-east-1", moto)
    first = _start(cfg, port, log)
    try:
        wait_until(lambda: scrape_metrics(port).get("burstwatch_cloudwatch_datapoints_published_total", 0) > 0, 20,
              "publishing before the outage")
        time.sleep(2 * PERIOD)
        # The outage: first every call is answered 503 without reaching moto, then the endpoint goes away
        # (connections refused). Answering first means no request is half-way to moto when the endpoint
        # drops: such a request would be delivered and still count as failed (at least once, not exactly).
        proxy.fail_next(10**9, code="ServiceUnavailable", status=503, message="Service Unavailable")
        time.sleep(1.0)
        proxy.down()
        wait_until(lambda: len(_spool_files(spool)) >= 4, 30, "four flushes waiting in the spool")
        assert scrape_metrics(port)["burstwatch_cloudwatch_backlog_datapoints"] > 0
        first.send_signal(how)
        assert first.wait(10) == (-9 if how == signal.SIGKILL else 0)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(5)

    # What the first run left: the datums of every flush CloudWatch did not take, whole (no torn file).
    records = Spool(spool, "cloudwatch", 10**6, 1 << 34).load()
    assert len(records) >= 4
    spooled: dict[tuple[str, tuple, float], tuple[float, float, float, float]] = {}
    for _rid, payload in records:
        namespace, datums = decode_batch(payload)
        assert namespace == NS
        for d in datums:
            key = (d.name, d.dims, d.timestamp)
            assert key not in spooled, f"{key} spooled twice"
            spooled[key] = (d.sample_count, d.total, d.minimum, d.maximum)
    assert all(n <= PER_PERIOD + 1 for n, *_ in spooled.values())

    proxy.faults.clear()
    proxy.up()
    second = _start(cfg, port, log)
    try:
        wait_until(lambda: not _spool_files(spool), 30, "the spool to drain after the restart")
        m = scrape_metrics(port)
        assert m['burstwatch_spool_replayed_records_total{spool="cloudwatch"}'] == len(records)
        assert m['burstwatch_state_write_errors_total{file="spool/cloudwatch"}'] == 0
    finally:
        second.terminate()
        assert second.wait(10) == 0
    text = log.read_text()
    assert f"from {len(records)} spooled flushes to send first" in text

    # Every spooled datum is in CloudWatch exactly once: the same statistic set, not doubled.
    series = {(name, dims) for name, dims, _ in spooled}
    t0 = min(t for *_, t in spooled) - 60
    t1 = max(t for *_, t in spooled) + 60
    for name, dims in series:
        got = _stats(cw, name, [{"Name": k, "Value": v} for k, v in dims], t0, t1)
        for (n2, d2, ts), (count, total, lo, hi) in spooled.items():
            if (n2, d2) != (name, dims):
                continue
            assert ts in got, f"{name} {dims} @ {ts} lost"
            p = got[ts]
            assert (p["SampleCount"], p["Minimum"], p["Maximum"]) == (count, lo, hi), (name, dims, ts, p)
            assert p["Sum"] == pytest.approx(total, rel=1e-9)

    # And no period is missing between the first published one and the last spooled one, nor doubled.
    dims = next(dims for name, dims in series if name == "CreditRemainingRatio" and ("Direction", "in") in dims)
    got = _stats(cw, "CreditRemainingRatio", [{"Name": k, "Value": v} for k, v in dims], t0 - 600, t1)
    last_spooled = max(t for name, d, t in spooled if (name, d) == ("CreditRemainingRatio", dims))
    before_kill = sorted(t for t in got if t <= last_spooled)
    assert before_kill == [float(t) for t in range(int(before_kill[0]), int(last_spooled) + 1, PERIOD)], \
        "a period is missing"
    assert all(got[t]["SampleCount"] <= PER_PERIOD + 1 for t in before_kill), "a period arrived twice"
    assert math.isclose(got[last_spooled]["SampleCount"],
                        spooled[("CreditRemainingRatio", dims, last_spooled)][0])


# -- the publisher's bookkeeping, without a network (fast) ------------------------------------------------
class FlakyClient:
    """put_metric_data that takes the first `ok` calls and then fails as an unreachable endpoint would."""

    def __init__(self, ok: int) -> None:
        self.ok = ok
        self.sent: list[list[dict[str, Any]]] = []

    def put_metric_data(self, Namespace: str, MetricData: list[dict[str, Any]]) -> None:
        from botocore.exceptions import EndpointConnectionError

        if len(self.sent) >= self.ok:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
        self.sent.append(MetricData)


def _publisher(spool_dir: Path, client: FlakyClient, **cfg: Any) -> Any:
    import dataclasses

    from agent.cloudwatch.publisher import CloudWatchPublisher
    from agent.config import CloudWatchConfig

    # Every period per instance and no group metrics: these tests pin the spool, not the publish policy.
    cfg = {"per_instance": "always", "aggregation_dimensions": [], **cfg}
    c = dataclasses.replace(CloudWatchConfig(), enabled=True, region="us-east-1", period=60, **cfg)
    return CloudWatchPublisher(c, instance_id="i-0123456789abcdef0", instance_type="m5.large",
                               client_factory=lambda *_a, **_k: client, spool_dir=spool_dir,
                               wall=lambda: 1_800_000_000.0)


def _feed(pub: Any, periods: int) -> None:
    from tests.cloudwatch.test_publisher import reading, snapshot

    t0 = 1_800_000_000.0 - 60 * (periods + 1)
    for k in range(periods * 6):                  # 6 samples a period
        t = t0 + 10 * k
        pub.observe(snapshot(t, {d: reading(d, 0.5, 100.0 + k, 1e6 + k) for d in ("in", "out")},
                             {"in": 1e6 + k, "out": 2e6 + k}))


def _key(d: dict[str, Any]) -> tuple:
    return (d["MetricName"], tuple((x["Name"], x["Value"]) for x in d.get("Dimensions", [])),
            d["Timestamp"].timestamp(), tuple(sorted(d["StatisticValues"].items())))


def test_a_flush_sent_in_part_leaves_exactly_the_rest_in_the_spool(tmp_path: Path) -> None:
    first = FlakyClient(ok=1)
    pub = _publisher(tmp_path, first)
    pub.limits.max_datums = 7                     # one request takes 7 datums, then the endpoint dies
    pub._setup()
    _feed(pub, 3)
    pub._flush(1_800_000_000.0, final=False)
    total = pub.snapshot().backlog + 7
    assert len(first.sent) == 1 and len(first.sent[0]) == 7 and total > 7
    files = sorted(tmp_path.glob("*.rec"))
    assert len(files) == 1                        # one flush, one record, rewritten without the 7 sent

    # "Restart": a new publisher on the same spool sends exactly what was not accepted, once.
    second = FlakyClient(ok=100)
    again = _publisher(tmp_path, second)
    again._setup()                                # replays the spool and sends it at once
    sent = [_key(d) for batch in first.sent + second.sent for d in batch]
    assert len(sent) == total and len(set(sent)) == total, "a datum was lost or sent twice"
    assert not list(tmp_path.glob("*.rec"))
    assert again.snapshot().backlog == 0


def test_the_spool_bound_drops_the_oldest_from_disk_and_memory_alike(tmp_path: Path) -> None:
    pub = _publisher(tmp_path, FlakyClient(ok=0), spool_max_batches=2)
    pub._setup()
    sizes: list[int] = []
    for _ in range(4):                            # four flushes during an outage, two kept
        _feed(pub, 1)
        pub._flush(1_800_000_000.0 + 60 * len(sizes), final=False)
        sizes.append(pub.snapshot().backlog)
    assert len(list(tmp_path.glob("*.rec"))) == 2
    c = sizes[0]
    st = pub.snapshot()
    assert c > 0 and sizes == [c, 2 * c, 2 * c, 2 * c] and st.dropped["backlog_full"] == 2 * c
    again = _publisher(tmp_path, FlakyClient(ok=0))
    again._setup()
    assert again.snapshot().backlog == st.backlog     # memory held what the disk held
