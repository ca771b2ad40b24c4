"""The group alarm fires before the bucket empties, in the credit lab's drain, on what CloudWatch received.

The real daemon runs in the credit lab's instance namespace (tbf shapes eth0 like EC2's bucket) with its own
IMDS (an instance id, and the `aws:autoscaling:groupName` tag) and [cloudwatch] at its defaults except the
lab's time scale (1-s periods, a 30-s steady flush, a 12-s alarm horizon) and per_instance = "never": moto
matches a query's dimensions as a subset, so the per-instance metrics (InstanceId, ..., AutoScalingGroupName)
would be read as the group's; CloudWatch matches them exactly. moto (server mode) listens on the
namespace's loopback. While the bucket drains, the test polls moto and evaluates the group alarm's rule
the way CloudWatch does (docs/cloudwatch.md, "Alarms": MIN of the two forecasts, each the group's Minimum,
under the horizon) on the datapoints received so far; the moment the first breaching datapoint is there
is when the alarm can fire. It must be before the shaper clamps to the baseline.

Lab scale: the drain lasts 24 s (1,200 Mbit at 150 - 100 Mbit/s); the horizon is half of it, as 600 s is
about two full-speed drains of an r4.large on EC2 (docs/alerting.md, "Tuning")."""

from __future__ import annotations

import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.conftest import MOTO_SERVER, require_root_tools
from tests.support.credit_lab import CreditLab, LabProfile
from tests.support.daemon_config import toml_text
from tests.support.imds_server import ImdsServer, metadata_tree
from tests.support.lab import run_in_ns

pytestmark = [pytest.mark.netns, pytest.mark.slow]

TYPE = "lab.shaper"
GROUP = "lab-asg"
IID = "i-0cwlab0000000001"
MOTO_PORT = 5056
ENDPOINT = f"http://127.0.0.1:{MOTO_PORT}"
PROFILE = LabProfile(peak_mbit=150.0)          # a 24-s drain
HORIZON = 12.0


@pytest.fixture(autouse=True)
def _tools() -> None:
    require_root_tools("ip", "tc", "ethtool")


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def group_minimum(cw: Any, metric: str, start: float, end: float) -> dict[float, float]:
    resp = cw.get_metric_statistics(
        Namespace="Burstwatch", MetricName=metric, StartTime=utc(start), EndTime=utc(end), Period=1,
        Statistics=["Minimum", "SampleCount"],
        Dimensions=[{"Name": "AutoScalingGroupName", "Value": GROUP}, {"Name": "Direction", "Value": "out"}])
    return {p["Timestamp"].timestamp(): p["Minimum"] for p in resp["Datapoints"]}


def first_breach(cw: Any, start: float, end: float) -> Optional[float]:
    """The first period in which MIN(instant, trend) of the group's Minimum is under the horizon."""
    instant = group_minimum(cw, "CreditExhaustionSeconds", start, end)
    trend = group_minimum(cw, "CreditExhaustionTrendSeconds", start, end)
    for ts in sorted(set(instant) | set(trend)):
        if min(instant.get(ts, float("inf")), trend.get(ts, float("inf"))) < HORIZON:
            return ts
    return None


def test_the_group_alarm_fires_before_the_bucket_empties(tmp_path: Path) -> None:
    import boto3

    cl = CreditLab(PROFILE, state_dir=str(tmp_path / "state"))
    tree = metadata_tree(instance_id=IID, instance_type=TYPE, enis=())
    tree["meta-data/tags/instance/aws:autoscaling:groupName"] = GROUP
    imds = ImdsServer(tree)
    moto: Optional[subprocess.Popen] = None
    try:
        run_in_ns(cl.inst, imds.start)
        moto = cl.lab.popen(cl.inst, str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(MOTO_PORT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cl.lab.wait_http(cl.inst, f"{ENDPOINT}/moto-api/", timeout=20)
        text = cl.config.read_text()
        old = "[imds]\nenabled = false"
        assert old in text, text
        text = text.replace(old, f'[imds]\nendpoint = "{imds.url}"\ntimeout = 0.5')
        cl.config.write_text(text + toml_text({"cloudwatch": {
            "enabled": True, "endpoint_url": ENDPOINT, "region": "us-east-1", "period": 1,
            "flush_interval": 30.0, "alarm_horizon": HORIZON, "per_instance": "never"}}))
        cl.start_agent()
        cw = run_in_ns(cl.inst, lambda: boto3.client("cloudwatch", region_name="us-east-1", endpoint_url=ENDPOINT))

        def in_ns(fn: Any) -> Any:
            return run_in_ns(cl.inst, fn)

        time.sleep(4)                                   # idle: nothing per instance, group data waits
        tr = cl.traffic("out")
        tr.start()
        t0 = cl.wait_drain_start("out")
        arrived: Optional[float] = None
        breach: Optional[float] = None
        deadline = t0 + PROFILE.bucket / (PROFILE.peak - PROFILE.baseline) + 10
        while time.time() < deadline and breach is None:
            breach = in_ns(lambda: first_breach(cw, t0 - 5, time.time() + 2))
            arrived = time.time() if breach is not None else None
            time.sleep(0.2)
        clamp = cl.wait_clamp("out", t0)
        tr.stop()
        assert breach is not None and arrived is not None, "no breaching datapoint reached CloudWatch"
        lead = clamp - arrived
        drain = clamp - t0
        print(f"\ndrain {drain:.1f} s; first breaching period {breach - t0:+.1f} s after the drain began, "
              f"at CloudWatch {arrived - t0:.1f} s after it; lead time {lead:.1f} s before the clamp "
              f"({lead / drain:.0%} of the drain; horizon {HORIZON:g} s)")
        assert lead > 0.25 * HORIZON, (lead, drain)

        # Only the group's metrics: the group's name came from the IMDS tag.
        metrics = in_ns(lambda: cw.list_metrics(Namespace="Burstwatch")["Metrics"])
        dims = [{d["Name"]: d["Value"] for d in m["Dimensions"]} for m in metrics]
        assert dims and all("InstanceId" not in d for d in dims), dims
        assert any(d.get("AutoScalingGroupName") == GROUP for d in dims), dims
    finally:
        if moto is not None:
            moto.terminate()
        imds.stop()
        cl.close()
