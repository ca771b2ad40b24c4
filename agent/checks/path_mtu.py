"""Check: the measured path MTU to each configured peer, and MTU black holes on the way."""

from __future__ import annotations

from agent.checks.context import CheckContext
from agent.models.checks import FAIL, OK, SKIP, WARN, Verdict

NAME = "path_mtu"
SLOW = True   # sends probes and waits for silence: the daemon runs it less often than the others


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
    if res.method is None:
        return Verdict(NAME, peer, SKIP, f"cannot probe {peer}: {res.detail}", ev,
                       "# allow ping sockets: sysctl -w net.ipv4.ping_group_range='0 2147483647'")
    if not res.reachable or res.path_mtu is None:
        return Verdict(NAME, peer, SKIP, f"path MTU to {peer} not measured: {res.detail}", ev,
                       f"ping -c 3 {res.address or peer}   # the peer's security group must allow ICMP echo "
                       "(or UDP to port 33434) from this instance")
    gw = f" via {route.gateway}" if route and route.gateway else ""
    dev = f" dev {ifname}" if ifname else ""
    if res.black_hole:
        return Verdict(NAME, peer, FAIL,
                       f"MTU black hole to {peer}{via}: {if_mtu}-byte packets vanish without ICMP "
                       f"\"fragmentation needed\"; {res.path_mtu} bytes get through. TCP connections stall "
                       "after the handshake when they send full-size segments", ev,
                       f"sudo ip route replace {res.address}/32{gw}{dev} mtu lock {res.path_mtu}\n"
                       "sudo sysctl -w net.ipv4.tcp_mtu_probing=1   # TCP finds the size itself\n"
                       "# and find what drops ICMP type 3 code 4 on the path (NACL, firewall, appliance)")
    if if_mtu is not None and res.path_mtu < if_mtu:
        how = (f"routers {', '.join(res.reporters)} reported {res.reported_mtu}" if res.reporters
               else "learnt earlier from ICMP and cached by the kernel" if route and route.mtu
               else "found by probing")
        return Verdict(NAME, peer, WARN,
                       f"path MTU to {peer} is {res.path_mtu}, below {ifname or 'the interface'}'s {if_mtu} ({how}): "
                       "path MTU discovery works, but every new path pays a round trip and UDP senders must "
                       "stay below it", ev,
                       f"sudo ip route replace {res.address}/32{gw}{dev} mtu {res.path_mtu}   # optional: "
                       "skip the discovery")
    return Verdict(NAME, peer, OK, f"path MTU to {peer} is {res.path_mtu}{via}, the interface's full MTU", ev)
