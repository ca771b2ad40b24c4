"""Check: is the connection-tracking allowance (or the link-local one) dropping packets, and who fills the table?"""

from __future__ import annotations

import logging
from typing import Any, Optional

from agent.checks.base import precheck
from agent.checks.context import CheckContext
from agent.models.checks import FAIL, OK, SKIP, WARN, Verdict
from agent.models.ena import ALLOWANCE_STATS, CONNTRACK_AVAILABLE
from agent.models.flows import REMEDIES, FlowOwner, top_owners
from agent.readers.flows import Flow

log = logging.getLogger(__name__)

NAME = "conntrack"
LINKLOCAL = "linklocal"
# Owners the verdict names, with their busiest peers (docs/allowances.md, "Who fills it").
OWNERS = 3
CONNTRACK_EXCEEDED = ALLOWANCE_STATS["conntrack"]
LINKLOCAL_EXCEEDED = ALLOWANCE_STATS["linklocal"]
# docs/allowances.md, "Link-local": 1,024 packets/s per ENI to the Amazon DNS resolver, IMDS and Time Sync
# (the VPC DNS quotas; the ENA statistics' definitions, docs/ec2-network-facts.md).
LINKLOCAL_CAUSE = ("more than 1,024 packets/s went to link-local services (Amazon DNS resolver, IMDS, Time Sync); "
                   "the usual cause is DNS: many uncached lookups, or many containers resolving through one ENI")
LINKLOCAL_REMEDY = ("# run a local DNS cache: systemd-resolved, dnsmasq, unbound or nscd (NodeLocal DNSCache on "
                    "Kubernetes)\n# read IMDS less often; spread DNS queries over ENIs\nresolvectl statistics")
CONNTRACK_REMEDY = "\n".join(f"# {r}" for r in REMEDIES)


def host_flows() -> list[Flow]:
    """This host's flows: sock_diag in the check's child process (docs/architecture.md: pyroute2 stays out of
    the daemon), procfs when netlink is not available."""
    from agent.readers.flows import DiagFlowSource, ProcFlowSource

    try:
        src = DiagFlowSource()
    except Exception as exc:  # no pyroute2, or netlink refused: procfs sees the same sockets
        log.debug("sock_diag unavailable (%s); reading /proc/net", exc)
        return ProcFlowSource().flows()
    try:
        return src.flows()
    finally:
        src.close()


def _owners_text(owners: list[FlowOwner]) -> str:
    parts = []
    for o in owners:
        peers = ", ".join(f"{p} ({n})" for p, n in o.peers)
        more = f" and {o.peer_count - len(o.peers)} more" if o.peer_count > len(o.peers) else ""
        parts.append(f"{o.protocol} {o.direction} port {o.port}: {o.count} flows, peers {peers}{more}")
    return "; ".join(parts)


def _increase(ctx: CheckContext, ifname: str, stat: str) -> Optional[int]:
    before, after = ctx.before.get(ifname), ctx.after.get(ifname)
    if before is None or after is None or stat not in before.ethtool or stat not in after.ethtool:
        return None
    return max(0, after.ethtool[stat] - before.ethtool[stat])


def _level(total: int, rising: Optional[int]) -> str:
    if rising:
        return FAIL
    return WARN if total else OK


def run(ctx: CheckContext) -> list[Verdict]:
    out: list[Verdict] = []
    owners: Optional[list[FlowOwner]] = None
    for ifname in ctx.interfaces:
        pre = precheck(ctx, NAME, ifname, "the connection-tracking check")
        if pre is not None:
            out.append(pre)
            continue
        stats = ctx.stats(ifname) or {}
        if CONNTRACK_EXCEEDED not in stats:
            out.append(Verdict(NAME, ifname, SKIP, "the driver reports no conntrack_allowance_exceeded "
                               "(ENA >= 2.2.10 does)", {}))
        else:
            if owners is None:
                try:
                    owners = top_owners(host_flows(), OWNERS)
                except (OSError, ValueError) as exc:
                    log.warning("reading this host's flows failed: %s", exc)
                    owners = []
            out.append(_conntrack(ctx, ifname, stats, owners))
        if LINKLOCAL_EXCEEDED in stats:
            out.append(_linklocal(ctx, ifname, stats))
    return out


def _conntrack(ctx: CheckContext, ifname: str, stats: dict[str, int], owners: list[FlowOwner]) -> Verdict:
    total = stats[CONNTRACK_EXCEEDED]
    rising = _increase(ctx, ifname, CONNTRACK_EXCEEDED)
    available = stats.get(CONNTRACK_AVAILABLE)
    ev: dict[str, Any] = {"exceeded_total": total, "exceeded_increase": rising, "available": available,
                          "owners": [{"protocol": o.protocol, "direction": o.direction, "port": o.port,
                                      "flows": o.count, "peers": [list(p) for p in o.peers],
                                      "peer_count": o.peer_count} for o in owners]}
    level = ("no conntrack_allowance_available (ENA >= 2.8.1 with the device capability reports it)"
             if available is None else f"{available} tracked connections still available")
    busiest = f"; busiest: {_owners_text(owners)}" if owners else ""
    status = _level(total, rising)
    if status == FAIL:
        head = f"new connections are being dropped now ({rising} packets in the check's window): the table is full"
    elif status == WARN:
        head = f"{total} packets dropped for the connection-tracking allowance since the driver loaded"
    else:
        head = "no drops for the connection-tracking allowance"
    return Verdict(NAME, ifname, status, f"{head}; {level}{busiest}", ev,
                   CONNTRACK_REMEDY if status != OK else "")


def _linklocal(ctx: CheckContext, ifname: str, stats: dict[str, int]) -> Verdict:
    total = stats[LINKLOCAL_EXCEEDED]
    rising = _increase(ctx, ifname, LINKLOCAL_EXCEEDED)
    status = _level(total, rising)
    ev = {"exceeded_total": total, "exceeded_increase": rising}
    if status == OK:
        return Verdict(LINKLOCAL, ifname, OK, "no link-local packets dropped (DNS, IMDS, Time Sync)", ev)
    when = f"now ({rising} packets in the check's window)" if rising else f"since the driver loaded ({total})"
    return Verdict(LINKLOCAL, ifname, status, f"link-local packets dropped {when}: {LINKLOCAL_CAUSE}", ev,
                   LINKLOCAL_REMEDY)
