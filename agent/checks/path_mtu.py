"""Check: the measured path MTU to each configured peer (IPv4 or IPv6), and MTU black holes on the way."""

from __future__ import annotations

from typing import NamedTuple

from agent.checks.context import CheckContext
from agent.models.checks import FAIL, OK, SKIP, WARN, Verdict

NAME = "path_mtu"
# Its cadence in the daemon (hourly) is in agent/checks/__init__.py's INTERVALS.


class _Words(NamedTuple):
    """What the verdicts say differently for an IPv4 and an IPv6 peer."""

    ip: str             # the `ip` command with its family flag
    host_prefix: int    # a host route's prefix length
    too_big: str        # the router's "your packet is too big" message
    echo: str           # what the peer's security group must allow for the probes


V4 = _Words("ip", 32, 'ICMP "fragmentation needed"', "ICMP echo")
V6 = _Words("ip -6", 128, 'ICMPv6 "packet too big"', "ICMPv6 echo request")


def run(ctx: CheckContext) -> list[Verdict]:
    peers = list(ctx.config.probe.peers)
    if not peers:
        return [Verdict(NAME, "", SKIP, "no [probe] peers configured: nothing to measure", {},
                        "# add peers: [probe] peers = [\"10.0.1.23\"]")]
    if ctx.path_mtu is None:
        return [Verdict(NAME, p, SKIP, "no path MTU prober in this context", {}) for p in peers]
    return [_one(ctx, peer) for peer in peers]


def _one(ctx: CheckContext, peer: str) -> Verdict:
    assert ctx.path_mtu is not None
    res = ctx.path_mtu(peer)
    route = ctx.route_to(res.address) if ctx.route_to and res.address else None
    ifname = route.interface if route else None
    link = ctx.links.get(ifname) if ifname else None
    if_mtu = link.mtu if link else res.route_mtu
    ev = {"address": res.address, "method": res.method, "interface": ifname, "interface_mtu": if_mtu,
          "route_mtu": res.route_mtu, "cached_pmtu": route.mtu if route else None, "path_mtu": res.path_mtu,
          "reported_mtu": res.reported_mtu, "reporters": list(res.reporters), "black_hole": res.black_hole,
          "rtt_seconds": res.rtt, "probes": res.probes, "detail": res.detail}
    via = f" via {ifname}" if ifname else ""
    words = V6 if res.address and ":" in res.address else V4
    if res.method is None:
        return Verdict(NAME, peer, SKIP, f"cannot probe {peer}: {res.detail}", ev,
                       "# allow ping sockets: sysctl -w net.ipv4.ping_group_range='0 2147483647'")
    if not res.reachable or res.path_mtu is None:
        return Verdict(NAME, peer, SKIP, f"path MTU to {peer} not measured: {res.detail}", ev,
                       f"ping -c 3 {res.address or peer}   # the peer's security group must allow {words.echo} "
                       "(or UDP to port 33434) from this instance")
    gw = f" via {route.gateway}" if route and route.gateway else ""
    dev = f" dev {ifname}" if ifname else ""
    host = f"{res.address}/{words.host_prefix}"
    if res.black_hole:
        # What to open: the VPC guide's "Path MTU Discovery" names ICMPv6 type 2 as IPv6's signal and asks for
        # IPv4's type 3 code 4 in network ACLs both ways; NACLs are stateless, so type 2 needs the same, while
        # security groups let it in as a reply (docs/ec2-network-facts.md, "MTU over IPv6").
        opening = ("# and allow ICMPv6 Packet Too Big (type 2) on the path: network ACLs inbound and outbound "
                   "(security groups let it in as a reply), host firewalls, appliances" if words is V6 else
                   "# and find what drops ICMP type 3 code 4 on the path (NACL, firewall, appliance)")
        return Verdict(NAME, peer, FAIL,
                       f"MTU black hole to {peer}{via}: {if_mtu}-byte packets vanish and no {words.too_big} "
                       f"comes back (blocked on the path, or a hop that drops big frames silently); "
                       f"{res.path_mtu} bytes get through. TCP connections stall after the handshake when they "
                       "send full-size segments", ev,
                       f"sudo {words.ip} route replace {host}{gw}{dev} mtu lock {res.path_mtu}\n"
                       # tcp_* sysctls under net.ipv4 apply to IPv6 TCP too (Linux ip-sysctl.rst, IPv6 part)
                       "sudo sysctl -w net.ipv4.tcp_mtu_probing=1   # TCP finds the size itself\n" + opening)
    if if_mtu is not None and res.path_mtu < if_mtu:
        how = (f"routers {', '.join(res.reporters)} reported {res.reported_mtu}" if res.reporters
               else "learnt earlier from ICMP and cached by the kernel" if route and route.mtu
               else "found by probing")
        return Verdict(NAME, peer, WARN,
                       f"path MTU to {peer} is {res.path_mtu}, below {ifname or 'the interface'}'s {if_mtu} ({how}): "
                       "path MTU discovery works, but every new path pays a round trip and UDP senders must "
                       "stay below it", ev,
                       f"sudo {words.ip} route replace {host}{gw}{dev} mtu {res.path_mtu}   # optional: "
                       "skip the discovery")
    return Verdict(NAME, peer, OK, f"path MTU to {peer} is {res.path_mtu}{via}, the interface's full MTU", ev)
