"""One config line turns CloudWatch on: the real daemon publishes its default set to moto (server mode), per
group (here its instance type: no IMDS, no Auto Scaling group), one value per period."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from agent import aws
from tests.conftest import ROOT, free_port, wait_port
from tests.support.daemon_config import daemon_config

pytestmark = pytest.mark.slow  # the real daemon and moto on loopback, ~10 s


def test_daemon_publishes_the_default_set(moto: str, tmp_path: Path) -> None:
    port = free_port()
    cfg = daemon_config(tmp_path, metrics={"listen": f"127.0.0.1:{port}"}, instance={"type": "m5.large"},
                        cloudwatch={"enabled": True, "endpoint_url": moto, "region": "us-east-1", "period": 1,
                                    "flush_interval": 2, "dimensions": {"Environment": "lab"}})
    proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb"))
    try:
        wait_port("127.0.0.1", port)
        cw = aws.client("cloudwatch", "us-east-1", moto)
        deadline = time.monotonic() + 30
        names: set[str] = set()
        while time.monotonic() < deadline:
            names = {m["MetricName"] for m in cw.list_metrics(Namespace="Burstwatch")["Metrics"]}
            if {"CreditRemainingRatio", "CreditExhaustionSeconds", "ThroughputBytesPerSecond"} <= names:
                break
            time.sleep(1)
        assert {"CreditRemainingRatio", "CreditExhaustionSeconds", "ThroughputBytesPerSecond"} <= names, names
        metrics = cw.list_metrics(Namespace="Burstwatch", MetricName="CreditRemainingRatio")["Metrics"]
        group = [m for m in metrics if {d["Name"] for d in m["Dimensions"]} == {"InstanceType", "Direction"}]
        assert group, metrics
        dims = {d["Name"]: d["Value"] for d in group[0]["Dimensions"]}
        assert dims["InstanceType"] == "m5.large" and dims["Direction"] in ("in", "out")
        now = datetime.now(timezone.utc)
        stats = cw.get_metric_statistics(Namespace="Burstwatch", MetricName="CreditRemainingRatio",
                                         Dimensions=group[0]["Dimensions"], StartTime=now - timedelta(minutes=5),
                                         EndTime=now + timedelta(minutes=1), Period=1,
                                         Statistics=["Minimum", "SampleCount"])
        # lo is shared with whatever else runs on the host, so the bucket need not be exactly full
        assert stats["Datapoints"] and 0.5 < stats["Datapoints"][0]["Minimum"] <= 1.0
        # (Not SampleCount: moto matches a query's dimensions as a subset, so per-instance metrics sent in an
        # hour with an alarm condition would count too; CloudWatch matches them exactly.)
        import urllib.request

        from tests.support.metrics_doc import undocumented

        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "burstwatch_cloudwatch_datapoints_published_total" in text
        assert not undocumented(text), undocumented(text)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    assert "cloudwatch" in (tmp_path / "agent.log").read_text().lower()
