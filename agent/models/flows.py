"""Who fills the connection-tracking table: this host's flows grouped by protocol, direction and service port (pure)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from agent.readers.flows import Flow, is_local

# Sockets that hold no live tracked flow: a TCP listener, and a TCP connection already closed (TIME_WAIT lingers
# 60 s on Linux; CLOSE). Whether AWS keeps an entry for a closed flow is not documented; netfilter's own
# connection limit does not count one (nf_conncount.c already_closed()), and counting them made the lab's
# in-use count, and so the learned size, 33 % high under connection churn. Unconnected UDP sockets are no
# flow either (remote port 0): their peers are not in the socket table.
NOT_FLOWS = frozenset({"LISTEN", "TIME_WAIT", "CLOSE"})
# How many peers an owner names in status (the rest are counted, not listed).
TOP_PEERS = 3

# The remedies AWS documents for a table that fills (EC2 user guide, "Amazon EC2 security group connection
# tracking" and "Connection tracking timeouts"; docs/allowances.md).
REMEDIES = (
    "untrack it: a TCP/UDP flow is untracked when the security group allows all traffic from and to "
    "0.0.0.0/0 (and ::/0) on all ports, inbound and outbound",
    "shorten idle timeouts on the ENI (ConnectionTrackingSpecification): TCP established 60-432,000 s "
    "(default 432,000), UDP 30-60 s (default 30), UDP stream 60-180 s (default 180)",
    "traffic through an NLB, NAT gateway, GWLB, Global Accelerator, Network Firewall or PrivateLink, and all "
    "ICMP, is always tracked: untracking rules do not help there",
)


@dataclass(frozen=True)
class FlowOwner:
    """One group of flows: `port` is the service port (the remote port of a flow this host opened, the
    local port of one it accepted)."""

    protocol: str
    direction: str          # out (this host connected) | in (a peer connected to a listening port)
    port: int
    count: int
    peers: tuple[tuple[str, int], ...]     # the TOP_PEERS busiest peers and their flow counts
    peer_count: int


def is_flow(f: Flow) -> bool:
    """A socket that stands for a tracked connection on the ENI: connected, not a listener, not loopback."""
    if f.state in NOT_FLOWS or f.remote_port == 0:
        return False
    return not (is_local(f.remote) or is_local(f.local))


def listening_ports(flows: Iterable[Flow]) -> set[tuple[str, int]]:
    """(protocol, port) of this host's listeners: TCP in LISTEN, UDP bound but not connected."""
    return {(f.protocol, f.local_port) for f in flows
            if f.state == "LISTEN" or (f.protocol == "udp" and f.remote_port == 0 and f.local_port != 0)}


def top_owners(flows: Iterable[Flow], n: int = 5) -> list[FlowOwner]:
    """The `n` groups with the most flows, by (protocol, direction, service port), largest first (ties by
    protocol and port, so the order is stable). A flow whose local port is a listener's is inbound; every
    other one was opened from here."""
    flows = list(flows)
    listeners = listening_ports(flows)
    groups: dict[tuple[str, str, int], Counter[str]] = {}
    for f in flows:
        if not is_flow(f):
            continue
        if (f.protocol, f.local_port) in listeners:
            key = (f.protocol, "in", f.local_port)
        else:
            key = (f.protocol, "out", f.remote_port)
        groups.setdefault(key, Counter())[f.remote] += 1
    owners = [FlowOwner(proto, direction, port, sum(peers.values()),
                        tuple(sorted(peers.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_PEERS]), len(peers))
              for (proto, direction, port), peers in groups.items()]
    owners.sort(key=lambda o: (-o.count, o.protocol, o.direction, o.port))
    return owners[:n]


def flow_count(flows: Iterable[Flow]) -> int:
    """Flows that can hold a conntrack entry: an independent count of the table's use (ConntrackModel's
    `in_use`). An estimate: untracked flows are counted, and flows of other namespaces (containers) or
    forwarded ones are not."""
    return sum(1 for f in flows if is_flow(f))
