"""Tag discovery against moto in server mode over HTTP, plus the pure parser on a DescribeInstances shape."""

from __future__ import annotations

from typing import Any

import pytest

from agent import aws
from agent.readers import ec2_tags
from agent.readers.ec2_tags import describe_filters, parse_tag_spec, parse_tagged_instances
from tests.conftest import free_port

REGION = "us-east-1"
TAG = "burstwatch:peer"
AMI = "ami-12c6146b"   # moto accepts any image id unless EC2_ENABLE_AMI_VALIDATION is set


def _launch(ec2: Any, subnet: str, itype: str, tags: dict[str, str], count: int = 1) -> list[dict[str, Any]]:
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []
    kw: dict[str, Any] = {"TagSpecifications": spec} if spec else {}
    return ec2.run_instances(ImageId=AMI, MinCount=count, MaxCount=count, InstanceType=itype, SubnetId=subnet,
                             **kw)["Instances"]


@pytest.fixture()
def fleet(moto: str) -> dict[str, Any]:
    """A VPC with tagged, untagged, wrongly-valued and stopped instances, another VPC with a tagged one."""
    ec2 = aws.client("ec2", REGION, moto)
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24")["Subnet"]["SubnetId"]
    other_vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
    other_subnet = ec2.create_subnet(VpcId=other_vpc, CidrBlock="10.30.1.0/24")["Subnet"]["SubnetId"]
    me = _launch(ec2, subnet, "m5.large", {TAG: "true"})[0]
    peers = _launch(ec2, subnet, "m5.large", {TAG: "true", "Name": "peer"}, count=2)
    peers += _launch(ec2, subnet, "c5n.xlarge", {TAG: "true"})
    untagged = _launch(ec2, subnet, "m5.large", {"Name": "not-a-peer"})
    wrong_value = _launch(ec2, subnet, "t3.micro", {TAG: "false"})
    stopped = _launch(ec2, subnet, "m5.large", {TAG: "true"})
    ec2.stop_instances(InstanceIds=[stopped[0]["InstanceId"]])
    elsewhere = _launch(ec2, other_subnet, "m5.large", {TAG: "true"})
    return {"url": moto, "vpc": vpc, "me": me, "peers": peers, "untagged": untagged, "wrong": wrong_value,
            "stopped": stopped, "elsewhere": elsewhere}


def _ips(instances: list[dict[str, Any]]) -> set[str]:
    return {i["PrivateIpAddress"] for i in instances}


def test_only_running_tagged_instances_in_the_vpc_come_back(fleet: dict[str, Any]) -> None:
    found = ec2_tags.discover(f"{TAG}=true", fleet["vpc"], REGION, fleet["url"],
                              self_instance_id=fleet["me"]["InstanceId"])
    assert {t.private_ip for t in found} == _ips(fleet["peers"])
    assert {t.instance_id for t in found} == {i["InstanceId"] for i in fleet["peers"]}
    assert sorted(t.instance_type or "" for t in found) == ["c5n.xlarge", "m5.large", "m5.large"]
    assert all(t.vpc_id == fleet["vpc"] for t in found)


def test_key_only_tag_matches_any_value(fleet: dict[str, Any]) -> None:
    found = ec2_tags.discover(TAG, fleet["vpc"], REGION, fleet["url"], self_instance_id=fleet["me"]["InstanceId"])
    assert {t.private_ip for t in found} == _ips(fleet["peers"]) | _ips(fleet["wrong"])


def test_self_is_excluded_by_address_too(fleet: dict[str, Any]) -> None:
    found = ec2_tags.discover(f"{TAG}=true", fleet["vpc"], REGION, fleet["url"],
                              self_ips=[fleet["me"]["PrivateIpAddress"]])
    assert {t.private_ip for t in found} == _ips(fleet["peers"])
    with_self = ec2_tags.discover(f"{TAG}=true", fleet["vpc"], REGION, fleet["url"])
    assert {t.private_ip for t in with_self} == _ips(fleet["peers"]) | {fleet["me"]["PrivateIpAddress"]}


def test_without_a_vpc_every_vpc_counts(fleet: dict[str, Any]) -> None:
    found = ec2_tags.discover(f"{TAG}=true", None, REGION, fleet["url"], self_instance_id=fleet["me"]["InstanceId"])
    assert {t.private_ip for t in found} == _ips(fleet["peers"]) | _ips(fleet["elsewhere"])


def test_nothing_tagged_is_an_empty_list(moto: str) -> None:
    assert ec2_tags.discover("nobody=here", None, REGION, moto) == []


def test_unreachable_endpoint_raises_for_the_caller_to_handle() -> None:
    port = free_port()   # nothing listens there
    client = aws.client("ec2", REGION, f"http://127.0.0.1:{port}", max_attempts=1, connect_timeout=0.5)
    with pytest.raises(Exception) as info:
        ec2_tags.discover(f"{TAG}=true", "vpc-1", REGION, client=client)
    assert "Could not connect" in str(info.value)


@pytest.mark.parametrize("spec,key,value", [
    ("burstwatch:peer=true", "burstwatch:peer", "true"),
    ("burstwatch:peer", "burstwatch:peer", None),
    ("role=probe=yes", "role", "probe=yes"),
    ("env=", "env", ""),
])
def test_parse_tag_spec(spec: str, key: str, value: Any) -> None:
    assert parse_tag_spec(spec) == (key, value)


def test_parse_tag_spec_needs_a_key() -> None:
    with pytest.raises(ValueError):
        parse_tag_spec("=true")


def test_filters() -> None:
    assert describe_filters("k", "v", "vpc-1") == [
        {"Name": "instance-state-name", "Values": ["running"]},
        {"Name": "tag:k", "Values": ["v"]},
        {"Name": "vpc-id", "Values": ["vpc-1"]}]
    assert describe_filters("k", None, None)[1] == {"Name": "tag-key", "Values": ["k"]}


def test_parser_rechecks_what_the_filters_asked_for() -> None:
    """A trimmed DescribeInstances response shape (botocore's parsed dict)."""
    def inst(iid: str, ip: Any, state: str = "running", vpc: str = "vpc-a", itype: str = "m5.large") -> dict:
        d: dict[str, Any] = {"InstanceId": iid, "InstanceType": itype, "State": {"Code": 16, "Name": state},
                             "VpcId": vpc}
        if ip:
            d["PrivateIpAddress"] = ip
        return d

    reservations = [
        {"Instances": [inst("i-1", "10.0.0.10"), inst("i-2", "10.0.0.9"), inst("i-3", None)]},
        {"Instances": [inst("i-4", "10.0.0.11", state="stopping"), inst("i-5", "10.1.0.5", vpc="vpc-b"),
                       inst("i-6", "10.0.0.12"), inst("i-1", "10.0.0.10")]},
    ]
    got = parse_tagged_instances(reservations, "vpc-a", exclude_ids=["i-6"])
    assert [(t.instance_id, t.private_ip) for t in got] == [("i-2", "10.0.0.9"), ("i-1", "10.0.0.10")]
