"""Check: interface MTU against the VPC's 9001, routes with their own MTU, and ENA Express's 8900 rule."""

from __future__ import annotations

from agent.checks.base import ENA, IXGBEVF, missing
from agent.checks.context import CheckContext
from agent.models.checks import OK, SKIP, WARN, Verdict
from agent.models.ena import ena_features
from agent.readers.links import RouteInfo

NAME = "mtu"

# AWS "Network maximum transmission unit (MTU) for your EC2 instance" (docs/ec2-network-facts.md, "MTU"):
VPC_JUMBO = 9001        # every current-generation type, inside a VPC
ENA_EXPRESS_MTU = 8900  # with ENA Express and jumbo frames, AWS says set 8900
ETHERNET = 1500         # internet gateway, VPN, inter-region (except through a transit gateway)
PERSIST = ("# to keep it across reboots: MTU=... in the interface's config (ifcfg/netplan/systemd-networkd), "
           "or drop the DHCP option that sets it")


def run(ctx: CheckContext) -> list[Verdict]:
    return [_one(ctx, ifname) for ifname in ctx.interfaces]


def _one(ctx: CheckContext, ifname: str) -> Verdict:
    link = ctx.links.get(ifname)
    if link is None:
        return missing(NAME, ifname)
    mtu = link.mtu
    driver = ctx.driver_name(ifname)
    routes = [r for r in ctx.routes if r.interface == ifname and r.mtu]
    ev: dict = {"mtu": mtu, "driver": driver,
                "routes": [{"dst": r.dst, "gateway": r.gateway, "mtu": r.mtu, "locked": r.mtu_locked}
                           for r in routes]}
    if driver not in (ENA, IXGBEVF):
        return Verdict(NAME, ifname, SKIP, f"MTU {mtu}; the VPC's 9001/1500 rules apply to ENA interfaces and "
                       f"{ifname} uses {driver or 'no known driver'}", ev)
    stats = ctx.stats(ifname) or {}
    express = ena_features(stats).ena_express_enabled
    ev["ena_express"] = express
    low = next((r for r in routes if r.mtu is not None and r.mtu < ETHERNET), None)
    if low is not None:
        return Verdict(NAME, ifname, WARN, f"route {low.dst} has MTU {low.mtu}, below Ethernet's {ETHERNET}", ev,
                       f"ip route show dev {ifname}   # then: sudo ip route change {low.dst}"
                       + (f" via {low.gateway}" if low.gateway else "") + f" dev {ifname} mtu {ETHERNET}")
    notes = [_route_note(r, mtu) for r in routes]
    tail = ("; " + "; ".join(notes)) if notes else ""
    return _mtu_verdict(ifname, mtu, express, tail, ev)


def _route_note(r: RouteInfo, mtu: int) -> str:
    if r.dst == "default" and r.mtu == ETHERNET:
        return f"default route at {ETHERNET} (normal for internet-bound traffic through an internet gateway)"
    if r.mtu is not None and r.mtu > mtu:
        return f"route {r.dst} MTU {r.mtu} exceeds the interface's {mtu} (the interface wins)"
    return f"route {r.dst} at MTU {r.mtu}"


def _mtu_verdict(ifname: str, mtu: int, express: bool, tail: str, ev: dict) -> Verdict:
    """The interface's MTU against the VPC's rules, once no route is below Ethernet's."""
    if express and mtu > ENA_EXPRESS_MTU:
        return Verdict(NAME, ifname, WARN,
                       f"MTU {mtu} with ENA Express on: AWS says use {ENA_EXPRESS_MTU} with ENA Express and jumbo "
                       f"frames (larger packets do not use SRD){tail}", ev,
                       f"sudo ip link set dev {ifname} mtu {ENA_EXPRESS_MTU}\n{PERSIST}")
    if mtu > VPC_JUMBO:
        return Verdict(NAME, ifname, WARN, f"MTU {mtu} is above the VPC maximum of {VPC_JUMBO}: larger frames are "
                       f"dropped{tail}", ev, f"sudo ip link set dev {ifname} mtu {VPC_JUMBO}\n{PERSIST}")
    if mtu < ETHERNET:
        return Verdict(NAME, ifname, WARN, f"MTU {mtu} is below Ethernet's {ETHERNET}: every packet carries less "
                       f"than it could{tail}", ev, f"sudo ip link set dev {ifname} mtu {VPC_JUMBO}\n{PERSIST}")
    if mtu == ETHERNET:
        return Verdict(NAME, ifname, WARN, f"MTU {ETHERNET}: jumbo frames are off, traffic inside the VPC could use "
                       f"{VPC_JUMBO} (fewer packets per byte, higher throughput per flow){tail}", ev,
                       f"sudo ip link set dev {ifname} mtu {VPC_JUMBO}\n{PERSIST}")
    if mtu == VPC_JUMBO or (express and mtu == ENA_EXPRESS_MTU):
        return Verdict(NAME, ifname, OK, f"MTU {mtu}" + (" (ENA Express)" if express else " (VPC jumbo frames)")
                       + tail, ev)
    return Verdict(NAME, ifname, OK, f"MTU {mtu}: between {ETHERNET} and {VPC_JUMBO} (e.g. 8500 for transit "
                   f"gateway or inter-region peering paths){tail}", ev)
