"""Read this host's TCP and UDP flows (procfs, or sock_diag through pyroute2) for "who fills the conntrack table"."""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from typing import Any, Iterable, NamedTuple, Optional

# /proc/net/tcp "st" column (include/net/tcp_states.h). UDP sockets use 01 when connected, 07 when not.
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING",
              12: "NEW_SYN_RECV"}
LISTEN = 10
UDP_CONNECTED = 1
PROC_FILES = (("tcp", "net/tcp"), ("tcp", "net/tcp6"), ("udp", "net/udp"), ("udp", "net/udp6"))


class Flow(NamedTuple):
    """One socket as the kernel lists it. `remote_port` 0 and an unspecified `remote` mean not connected."""

    protocol: str           # tcp | udp
    local: str
    local_port: int
    remote: str
    remote_port: int
    state: str              # TCP_STATES name; for UDP, ESTABLISHED (connected) or CLOSE (not)


# A host's sockets share few addresses (its own, a handful of peers): caching the conversion makes a read of
# thousands of sockets several times cheaper in the resident daemon (every [allowances] flows_interval).
@functools.lru_cache(maxsize=1024)
def _address(hexaddr: str) -> str:
    """/proc/net hex address -> text. The kernel prints each 32-bit word in host byte order (%08X of a
    __be32 read as a u32, net/ipv4/tcp_ipv4.c get_tcp4_sock, net/ipv6/tcp_ipv6.c get_tcp6_sock)."""
    raw = bytes.fromhex(hexaddr)
    if len(raw) not in (4, 16):
        raise ValueError(f"address {hexaddr[:40]!r} is neither IPv4 nor IPv6")
    words = b"".join(int.from_bytes(raw[i:i + 4], "little").to_bytes(4, "big") for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def read_proc_net_flows(procfs: str = "/proc") -> dict[str, str]:
    """The raw text of /proc/net/{tcp,tcp6,udp,udp6} (the reader's own network namespace), keyed by file;
    a missing file (IPv6 disabled) is left out."""
    out: dict[str, str] = {}
    for _proto, rel in PROC_FILES:
        try:
            with open(os.path.join(procfs, rel), encoding="ascii") as f:
                out[rel] = f.read()
        except FileNotFoundError:
            continue
    return out


def parse_proc_net(text: str, protocol: str) -> list[Flow]:
    """One /proc/net/{tcp,udp}[6] text -> its sockets. The header line and short lines are skipped;
    ValueError on a malformed address."""
    flows: list[Flow] = []
    for line in text.split("\n")[1:]:
        v = line.split()
        if len(v) < 4 or ":" not in v[1] or ":" not in v[2]:
            continue
        laddr, lport = v[1].rsplit(":", 1)
        raddr, rport = v[2].rsplit(":", 1)
        st = int(v[3], 16)
        state = TCP_STATES.get(st, str(st)) if protocol == "tcp" else (
            "ESTABLISHED" if st == UDP_CONNECTED else "CLOSE")
        flows.append(Flow(protocol, _address(laddr), int(lport, 16), _address(raddr), int(rport, 16), state))
    return flows


def parse_proc_net_flows(texts: dict[str, str]) -> list[Flow]:
    """read_proc_net_flows()'s texts -> every socket in them."""
    protocol = dict((rel, proto) for proto, rel in PROC_FILES)
    flows: list[Flow] = []
    for rel, text in texts.items():
        flows.extend(parse_proc_net(text, protocol.get(rel, "tcp" if "tcp" in rel else "udp")))
    return flows


@functools.lru_cache(maxsize=1024)
def is_local(address: str) -> bool:
    """Loopback (and IPv4-mapped loopback) peers never cross an ENI, so AWS never tracks them."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


class ProcFlowSource:
    """The default source: procfs text, no netlink (keeps pyroute2 out of the resident daemon)."""

    def __init__(self, procfs: str = "/proc") -> None:
        self.procfs = procfs

    def flows(self) -> list[Flow]:
        return parse_proc_net_flows(read_proc_net_flows(self.procfs))


# sock_diag: inet_diag_req_v2 states bitmask, one bit per TCP state (all of them).
ALL_STATES = 0xFFF


def parse_diag(msgs: Iterable[Any], protocol: str) -> list[Flow]:
    """pyroute2 inet_diag messages (dict-like: idiag_src, idiag_sport, idiag_dst, idiag_dport, idiag_state)
    -> sockets. UDP sockets report state 7 (unconnected) or 1 (connected), as in procfs."""
    flows = []
    for m in msgs:
        st = int(m["idiag_state"])
        state = TCP_STATES.get(st, str(st)) if protocol == "tcp" else (
            "ESTABLISHED" if st == UDP_CONNECTED else "CLOSE")
        flows.append(Flow(protocol, str(m["idiag_src"]), int(m["idiag_sport"]), str(m["idiag_dst"]),
                          int(m["idiag_dport"]), state))
    return flows


class DiagFlowSource:
    """sock_diag through pyroute2's DiagSocket (works in Debian 12's 0.7.2: TCP and UDP, both families).
    About 23 MB of RSS on import (docs/architecture.md), so for the check child and the CLI, not the daemon."""

    def __init__(self) -> None:
        from pyroute2 import DiagSocket

        self._ds: Optional[Any] = DiagSocket()
        self._ds.bind()

    def flows(self) -> list[Flow]:
        assert self._ds is not None
        out: list[Flow] = []
        for protocol, proto_num in (("tcp", socket.IPPROTO_TCP), ("udp", socket.IPPROTO_UDP)):
            for family in (socket.AF_INET, socket.AF_INET6):
                msgs = self._ds.get_sock_stats(family=family, protocol=proto_num, states=ALL_STATES)
                out.extend(parse_diag(msgs, protocol))
        return out

    def close(self) -> None:
        if self._ds is not None:
            self._ds.close()
            self._ds = None
