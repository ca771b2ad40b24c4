"""A fleet that publishes to one central Region keeps AutoScalingGroupName (issue 30): the real daemon, an IMDS
saying the instance lives in eu-west-1, moto in server mode holding its Auto Scaling group there, and
[cloudwatch] region = us-east-1. DescribeTags must ask eu-west-1: us-east-1 answers the unknown id with no tags."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import aws
from agent.readers.autoscaling import CACHE_FILE
from tests.conftest import ROOT, free_port, wait_port
from tests.support.daemon_config import daemon_config
from tests.support.imds_server import ImdsServer, metadata_tree

pytestmark = pytest.mark.slow  # the real daemon, IMDS and moto on loopback, ~10 s

HOME, CENTRAL = "eu-west-1", "us-east-1"


def _group_instance(moto: str, region: str) -> str:
    asg = aws.client("autoscaling", region, moto)
    asg.create_launch_configuration(LaunchConfigurationName="lc", ImageId="ami-12c6146b", InstanceType="m5.large")
    asg.create_auto_scaling_group(AutoScalingGroupName="web-asg", LaunchConfigurationName="lc", MinSize=1,
                                  MaxSize=1, DesiredCapacity=1, AvailabilityZones=[f"{region}a"])
    return str(asg.describe_auto_scaling_instances()["AutoScalingInstances"][0]["InstanceId"])


def test_group_metrics_keep_the_group_when_cloudwatch_is_in_another_region(moto: str, tmp_path: Path) -> None:
    iid = _group_instance(moto, HOME)
    # the premise: the central Region does not know the instance, and says so with an empty answer, no error
    central = aws.client("ec2", CENTRAL, moto).describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}])
    assert central["Tags"] == []
    port = free_port()
    with ImdsServer(metadata_tree(instance_id=iid, region=HOME, availability_zone=f"{HOME}a",
                                  availability_zone_id="euw1-az1")) as imds:
        cfg = daemon_config(tmp_path, metrics={"listen": f"127.0.0.1:{port}"},
                            imds={"endpoint": imds.url, "timeout": 1.0, "retries": 0},
                            instance={"ec2_endpoint_url": moto},
                            cloudwatch={"enabled": True, "endpoint_url": moto, "region": CENTRAL, "period": 1,
                                        "flush_interval": 2})
        log = tmp_path / "agent.log"
        proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
        try:
            wait_port("127.0.0.1", port)
            cw = aws.client("cloudwatch", CENTRAL, moto)
            deadline = time.monotonic() + 30
            metrics: list[dict] = []
            while time.monotonic() < deadline and not metrics:
                assert proc.poll() is None, log.read_text()[-3000:]
                metrics = cw.list_metrics(Namespace="Burstwatch", MetricName="CreditRemainingRatio")["Metrics"]
                time.sleep(0.5)
            assert metrics, log.read_text()[-3000:]
            dims = [{d["Name"]: d["Value"] for d in m["Dimensions"]} for m in metrics]
            groups = [d for d in dims if "InstanceId" not in d]
            assert groups and all(d.get("AutoScalingGroupName") == "web-asg" for d in groups), dims
            # nothing landed in the instance's own Region: the publisher uses [cloudwatch] region
            assert aws.client("cloudwatch", HOME, moto).list_metrics(Namespace="Burstwatch")["Metrics"] == []
        finally:
            proc.terminate()
            assert proc.wait(10) == 0
    cached = json.loads((tmp_path / "state" / CACHE_FILE).read_text())
    assert (cached["instance_id"], cached["region"], cached["group"]) == (iid, HOME, "web-asg")
    assert "not cached" not in log.read_text()
