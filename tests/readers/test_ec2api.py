"""DescribeInstanceTypes via moto in server mode over HTTP: figures, cache, fallbacks when denied or down."""

from __future__ import annotations

import json
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest

from agent.models.catalogue import TypeEntry, entry_from_describe
from agent.readers import ec2api
from agent.readers.ec2api import lookup_instance_type, parse_describe_instance_types
from tests.conftest import free_port

# Shaped like AWS's own DescribeInstanceTypes XML (EC2 API reference; lower-case booleans, the members
# botocore 1.29 drops); m5.large's figures as docs/ec2-network-facts.md ("Published bandwidth figures") quotes them.
AWS_XML = """<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstanceTypesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>6b9d9bd4-5ba7-4a63-a1b3-0f2a2d6c1b1f</requestId>
  <instanceTypeSet>
    <item>
      <instanceType>m5.large</instanceType>
      <currentGeneration>true</currentGeneration>
      <vCpuInfo><defaultVCpus>2</defaultVCpus><defaultCores>1</defaultCores></vCpuInfo>
      <networkInfo>
        <networkPerformance>Up to 10 Gigabit</networkPerformance>
        <maximumNetworkInterfaces>3</maximumNetworkInterfaces>
        <maximumNetworkCards>1</maximumNetworkCards>
        <defaultNetworkCardIndex>0</defaultNetworkCardIndex>
        <networkCards>
          <item>
            <networkCardIndex>0</networkCardIndex>
            <networkPerformance>Up to 10 Gigabit</networkPerformance>
            <maximumNetworkInterfaces>3</maximumNetworkInterfaces>
            <baselineBandwidthInGbps>0.75</baselineBandwidthInGbps>
            <peakBandwidthInGbps>10.0</peakBandwidthInGbps>
            <defaultEnaQueueCountPerInterface>2</defaultEnaQueueCountPerInterface>
            <maximumEnaQueueCount>8</maximumEnaQueueCount>
          </item>
        </networkCards>
        <enaSupport>required</enaSupport>
        <enaSrdSupported>false</enaSrdSupported>
      </networkInfo>
    </item>
  </instanceTypeSet>
</DescribeInstanceTypesResponse>
"""


def _entry(res: ec2api.ApiLookup) -> TypeEntry:
    """The reader hands back the raw InstanceTypeInfo; discovery turns it into the model's TypeEntry."""
    assert res.info is not None
    return entry_from_describe(res.info)


def _factory(endpoint: str, calls: list[str] | None = None) -> ec2api.ClientFactory:
    make = ec2api.client_factory(endpoint)

    def factory(region: str) -> Any:
        if calls is not None:
            calls.append(region)
        return make(region)

    return factory


def _moto_auth(moto_url: str, count: str) -> None:
    """moto's IAM enforcement: after `count` more unauthenticated actions, requests are checked against
    IAM users and policies ("inf" turns it off again)."""
    req = urllib.request.Request(f"{moto_url}/moto-api/reset-auth", data=count.encode(), method="POST",
                                 headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(req, timeout=5).read()


@contextmanager
def _iam_user(moto_url: str, monkeypatch: pytest.MonkeyPatch, allowed: list[str]) -> Iterator[None]:
    """Credentials of an IAM user allowed only `allowed`, with moto enforcing IAM meanwhile."""
    _moto_auth(moto_url, "3")  # CreateUser, CreateAccessKey, PutUserPolicy go through unauthenticated
    try:
        iam = boto3.client("iam", region_name="us-east-1", endpoint_url=moto_url)
        iam.create_user(UserName="burstwatch")
        key = iam.create_access_key(UserName="burstwatch")["AccessKey"]
        iam.put_user_policy(UserName="burstwatch", PolicyName="agent", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": allowed, "Resource": "*"}]}))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        yield
    finally:
        _moto_auth(moto_url, "inf")


def test_parse_aws_xml() -> None:
    (info,) = parse_describe_instance_types(AWS_XML)
    assert info == {
        "InstanceType": "m5.large",
        "VCpuInfo": {"DefaultVCpus": 2},
        "NetworkInfo": {"NetworkPerformance": "Up to 10 Gigabit", "EnaSupport": "required",
                        "EnaSrdSupported": False, "MaximumNetworkCards": 1, "DefaultNetworkCardIndex": 0,
                        "NetworkCards": [{"NetworkCardIndex": 0, "NetworkPerformance": "Up to 10 Gigabit",
                                          "MaximumNetworkInterfaces": 3, "BaselineBandwidthInGbps": 0.75,
                                          "PeakBandwidthInGbps": 10.0,
                                          "DefaultEnaQueueCountPerInterface": 2}]},
    }


def test_botocore_model_drops_the_bandwidth_fields(moto: str) -> None:
    """Why the reader parses the raw XML: what the installed botocore makes of moto's answer."""
    c = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto)
    info = c.describe_instance_types(InstanceTypes=["m5.large"])["InstanceTypes"][0]
    card = info["NetworkInfo"]["NetworkCards"][0]
    raw = parse_describe_instance_types(ec2api.read_describe_instance_types(c, "m5.large"))
    assert raw[0]["NetworkInfo"]["NetworkCards"][0]["BaselineBandwidthInGbps"] == 0.75
    if "BaselineBandwidthInGbps" not in card:   # Debian 12's botocore 1.29: the members are not in its model
        assert set(card) == {"NetworkCardIndex", "NetworkPerformance", "MaximumNetworkInterfaces"}


def test_lookup_picks_up_baseline_and_peak_and_caches(moto: str, tmp_path: Path) -> None:
    calls: list[str] = []
    res = lookup_instance_type("m5.large", "us-east-1", str(tmp_path), _factory(moto, calls))
    assert res.status == "fresh" and calls == ["us-east-1"]
    entry = _entry(res)
    assert (entry.baseline_gbps, entry.peak_gbps) == (0.75, 10.0)
    assert (entry.vcpus, entry.ena_support, entry.maximum_network_cards) == (2, "required", 1)
    cache = tmp_path / "instance-type-m5.large.json"
    doc = json.loads(cache.read_text())
    assert doc["format"] == ec2api.CACHE_FORMAT and doc["instance_type"] == "m5.large"

    # A fresh cache answers without calling, even with the endpoint gone.
    dead = _factory(f"http://127.0.0.1:{free_port()}", calls)
    again = lookup_instance_type("m5.large", "us-east-1", str(tmp_path), dead)
    assert again.status == "cached" and _entry(again) == entry and calls == ["us-east-1"]

    # Too old to trust: the API is asked; down, so the stale answer still beats the bundled table.
    stale = lookup_instance_type("m5.large", "us-east-1", str(tmp_path), dead, max_age=0.0)
    assert stale.status == "stale_cache" and _entry(stale) == entry and len(calls) == 2
    assert "unreachable" in stale.detail


def test_denied_falls_back(moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _iam_user(moto, monkeypatch, ["ec2:DescribeInstances"]):
        res = lookup_instance_type("m5.large", "us-east-1", str(tmp_path), _factory(moto))
    assert res.info is None and res.status == "denied"
    assert "AccessDenied" in res.detail          # real EC2 says UnauthorizedOperation; both count as denied
    assert not list(tmp_path.iterdir())          # nothing cached


def test_allowed_user_gets_the_figures(moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _iam_user(moto, monkeypatch, ["ec2:DescribeInstanceTypes"]):
        res = lookup_instance_type("c5.4xlarge", "us-east-1", str(tmp_path), _factory(moto))
    assert res.status == "fresh"
    assert (_entry(res).baseline_gbps, _entry(res).peak_gbps) == (5.0, 10.0)


def test_endpoint_down_falls_back_quickly(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = lookup_instance_type("m5.large", "us-east-1", str(tmp_path),
                               _factory(f"http://127.0.0.1:{free_port()}"))
    elapsed = time.monotonic() - t0
    assert res.info is None and res.status == "unreachable"
    # API_ATTEMPTS (2) refused connections plus botocore's standard-mode backoff (rand(0, 1) s before the
    # 2nd attempt); measured 0.5-2 s, bound generously for CI.
    assert elapsed < 10.0


def test_unknown_type(moto: str, tmp_path: Path) -> None:
    res = lookup_instance_type("zz9.plural", "us-east-1", str(tmp_path), _factory(moto))
    assert res.info is None and res.status == "unknown_type"


def test_no_credentials(moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    res = lookup_instance_type("m5.large", "us-east-1", str(tmp_path), _factory(moto))
    assert res.info is None and res.status == "no_credentials"


def test_corrupt_cache_is_set_aside(moto: str, tmp_path: Path) -> None:
    (tmp_path / "instance-type-m5.large.json").write_text("{not json")
    res = lookup_instance_type("m5.large", "us-east-1", str(tmp_path), _factory(moto))
    assert res.status == "fresh"
    assert [p.name for p in tmp_path.iterdir() if ".bad-" in p.name]


def test_a_cache_in_another_shape_is_set_aside(moto: str, tmp_path: Path) -> None:
    (tmp_path / "instance-type-m5.large.json").write_text(json.dumps({
        "format": ec2api.CACHE_FORMAT, "instance_type": "m5.large", "fetched": time.time(),
        "info": {"InstanceType": "m5.large", "NetworkInfo": {"NetworkCards": "eight"}}}))
    res = lookup_instance_type("m5.large", "us-east-1", str(tmp_path), _factory(moto))
    assert res.status == "fresh" and _entry(res).peak_gbps == 10.0
    assert [p.name for p in tmp_path.iterdir() if ".bad-" in p.name]


@pytest.mark.parametrize("code,status,want", [
    ("UnauthorizedOperation", 403, "denied"),          # what EC2 itself answers
    ("AccessDenied", 403, "denied"),                   # what moto answers
    ("RequestExpired", 400, "denied"),                 # clock skew: the signature is refused
    ("InvalidInstanceType", 400, "unknown_type"),
    ("RequestLimitExceeded", 503, "error"),
    ("InternalError", 500, "error"),
])
def test_failure_status_of_api_answers(code: str, status: int, want: str) -> None:
    from botocore.exceptions import ClientError

    exc = ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                      "DescribeInstanceTypes")
    got, detail = ec2api.failure_status(exc)
    assert got == want and detail.startswith(code)
