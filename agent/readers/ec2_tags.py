"""Find probe peers: running instances carrying a tag in this VPC (ec2:DescribeInstances through boto3)."""

from __future__ import annotations

import logging
from typing import Any, Iterable, NamedTuple, Optional

from agent import aws

log = logging.getLogger(__name__)

# One discovery is one DescribeInstances page of up to 1,000 instances (the API's most), never more: a
# paginated, filtered call draws one token from EC2's Describe* bucket (100 tokens, 20/s refill per account
# and Region; docs/ec2-network-facts.md, "EC2 API request throttling"), and a page holds far more peers than
# the schedule visits between two discoveries.
PAGE_SIZE = 1000


class TaggedInstance(NamedTuple):
    instance_id: str
    private_ip: str
    instance_type: Optional[str]
    vpc_id: Optional[str]
    zone: Optional[str] = None          # Placement.AvailabilityZone


def parse_tag_spec(spec: str) -> tuple[str, Optional[str]]:
    """'burstwatch:peer=true' -> ('burstwatch:peer', 'true'); 'burstwatch:peer' -> (key, None), any value.
    Split at the first '=' (AWS allows '=' in values; a key holding '=' cannot be expressed)."""
    key, sep, value = spec.partition("=")
    key = key.strip()
    if not key:
        raise ValueError(f"tag {spec!r} has no key (expected KEY or KEY=VALUE)")
    return key, (value if sep else None)


def describe_filters(tag_key: str, tag_value: Optional[str], vpc_id: Optional[str],
                     zone: Optional[str] = None) -> list[dict[str, Any]]:
    """Server-side filters: running, tagged (any value when tag_value is None), in the VPC and the
    Availability Zone when known."""
    filters: list[dict[str, Any]] = [{"Name": "instance-state-name", "Values": ["running"]}]
    if tag_value is None:
        filters.append({"Name": "tag-key", "Values": [tag_key]})
    else:
        filters.append({"Name": f"tag:{tag_key}", "Values": [tag_value]})
    if vpc_id:
        filters.append({"Name": "vpc-id", "Values": [vpc_id]})
    if zone:
        filters.append({"Name": "availability-zone", "Values": [zone]})
    return filters


def read_tagged_instances(client: Any, tag_key: str, tag_value: Optional[str], vpc_id: Optional[str],
                          zone: Optional[str] = None) -> list[dict[str, Any]]:
    """The raw Reservations of one filtered DescribeInstances page (MaxResults PAGE_SIZE)."""
    page = client.describe_instances(Filters=describe_filters(tag_key, tag_value, vpc_id, zone),
                                     MaxResults=PAGE_SIZE)
    return list(page.get("Reservations", []))


def parse_tagged_instances(reservations: Iterable[dict[str, Any]], vpc_id: Optional[str] = None,
                           exclude_ids: Iterable[str] = (), exclude_ips: Iterable[str] = ()) -> list[TaggedInstance]:
    """Peers from DescribeInstances reservations: running, with a private IPv4, in `vpc_id` when given
    (checked again here, so a server that ignored a filter cannot widen the set), minus this instance
    (by id or by any of its addresses). Sorted by address; duplicates dropped."""
    skip_ids, skip_ips = set(exclude_ids), set(exclude_ips)
    found: dict[str, TaggedInstance] = {}
    for res in reservations:
        for inst in res.get("Instances", []):
            state = (inst.get("State") or {}).get("Name")
            ip = inst.get("PrivateIpAddress")
            iid = inst.get("InstanceId", "")
            if state != "running" or not ip or iid in skip_ids or ip in skip_ips:
                continue
            if vpc_id and inst.get("VpcId") != vpc_id:
                continue
            zone = (inst.get("Placement") or {}).get("AvailabilityZone")
            found.setdefault(ip, TaggedInstance(iid, ip, inst.get("InstanceType"), inst.get("VpcId"), zone))
    return sorted(found.values(), key=lambda t: tuple(int(x) if x.isdigit() else 0 for x in t.private_ip.split(".")))


def discover(tag: str, vpc_id: Optional[str], region: Optional[str], endpoint_url: Optional[str] = None,
             self_instance_id: Optional[str] = None, self_ips: Iterable[str] = (),
             client: Any = None, zone: Optional[str] = None) -> list[TaggedInstance]:
    """Tagged running instances in the VPC (and `zone`, when given), excluding this one: one page. Raises
    on API errors (botocore's
    ClientError, EndpointConnectionError, NoCredentialsError): the caller keeps its last good list."""
    key, value = parse_tag_spec(tag)
    if client is None:
        client = aws.client("ec2", region, endpoint_url)
    reservations = read_tagged_instances(client, key, value, vpc_id, zone)
    peers = parse_tagged_instances(reservations, vpc_id, [self_instance_id] if self_instance_id else [],
                                   self_ips)
    log.debug("tag=%s vpc=%s zone=%s: %d peer(s) discovered", tag, vpc_id or "any", zone or "any", len(peers))
    return peers
