"""Where discovered peers come from: one filtered DescribeInstances page, or the fleet bucket's registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

from agent.probes.scheduler import Peer

if TYPE_CHECKING:
    from agent.config import FleetConfig, ProbeConfig
    from agent.discovery import InstanceInfo

Discover = Callable[[], Sequence[Peer]]


def own_zone(instance: Optional[InstanceInfo], registry: bool) -> Optional[str]:
    """This instance's zone as its discovery names peers' zones: the AZ ID for the registry (it names the
    same physical zone in every account), the AZ name for DescribeInstances (Placement.AvailabilityZone)."""
    ident = instance.identity if instance is not None else None
    if ident is None:
        return None
    if registry:
        return ident.availability_zone_id or ident.availability_zone
    return ident.availability_zone


def tag_discovery(cfg: ProbeConfig, instance: Optional[InstanceInfo], responder_port: int) -> Discover:
    """Tagged running instances of this VPC, one DescribeInstances page; of this zone only while
    cross_az_share is 0 (docs/probes.md, "Same-AZ peers")."""
    from agent.readers import ec2_tags

    assert cfg.discover_tag
    tag, endpoint_url = cfg.discover_tag, cfg.discover_endpoint_url
    ident = instance.identity if instance is not None else None
    enis = instance.enis if instance is not None else []
    vpc_id = enis[0].vpc_id if enis else None
    self_ips = [ip for e in enis for ip in e.local_ipv4s]
    zone = own_zone(instance, registry=False) if cfg.cross_az_share <= 0 else None

    def discover() -> Sequence[Peer]:
        found = ec2_tags.discover(tag, vpc_id, ident.region if ident else None, endpoint_url,
                                  ident.instance_id if ident else None, self_ips, zone=zone)
        return [Peer(t.private_ip, responder_port, t.instance_type, "discovered", t.zone) for t in found]

    return discover


def registry_discovery(cfg: ProbeConfig, fleet: FleetConfig, instance: Optional[InstanceInfo],
                       responder_port: int, instance_type: Optional[str]) -> Discover:
    """This agent registered in the fleet bucket and its zone's agents listed there (agent/probes/registry.py);
    ValueError when this instance's identity, zone or address is unknown."""
    from agent import __version__, aws
    from agent.probes.registry import PeerRegistry

    ident = instance.identity if instance is not None else None
    zone = own_zone(instance, registry=True)
    ips = [ip for e in (instance.enis if instance is not None else []) for ip in e.local_ipv4s]
    if ident is None or zone is None or not ips or not fleet.bucket:
        raise ValueError("probe.registry needs this instance's id, zone and private IPv4 (IMDS) and fleet.bucket")
    region = fleet.region or ident.region
    reg = PeerRegistry(lambda: aws.client("s3", region, fleet.endpoint_url), fleet.bucket, fleet.prefix,
                       zone=zone, instance_id=ident.instance_id, host=ips[0], port=responder_port,
                       instance_type=instance_type or ident.instance_type, region=ident.region,
                       agent_version=__version__, cross_az_share=cfg.cross_az_share)

    def discover() -> Sequence[Peer]:
        return [Peer(e.host, e.port, e.instance_type, "discovered", e.zone) for e in reg.discover()]

    return discover
