"""Lab stand-ins for the ENA PPS and conntrack allowances: nftables limiters' counters and conntrack entries.

Not an ENA reader. `[allowances] source = "nft"` reads it, the way `shaping_source = "tc"` reads qdiscs
(docs/allowances.md, "The lab"). In one `nft -j list table FAMILY NAME` the rule holding a `limit rate over`
expression stands in for `pps_allowance_exceeded` (its counter's packets) and the rule holding a
`ct count over N` expression for `conntrack_allowance_exceeded` (its counter) and its size N; the entries that
limit applies to are counted in /proc/net/nf_conntrack (the reader's own namespace).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any, NamedTuple, Optional

from agent.readers.errors import NotSupported

# One `nft -j list table` of a handful of rules takes a few ms; a hung nft must not stall the sampler.
NFT_TIMEOUT = 2.0
# nf_conncount treats a TCP connection in these states as gone (net/netfilter/nf_conncount.c
# already_closed()), so the `ct count` limit does not count them.
CLOSED_TCP = ("TIME_WAIT", "CLOSE")


class NftCounters(NamedTuple):
    """What the lab's limiters counted: packets dropped by each, and the conntrack limit's N."""

    pps_dropped: Optional[int]          # the `limit rate over` rule's counter; None without such a rule
    conntrack_dropped: Optional[int]    # the `ct count over N` rule's counter; None without such a rule
    conntrack_limit: Optional[int]      # N


def _rule_kind(exprs: list[Any]) -> tuple[Optional[str], Optional[int], Optional[int]]:
    """(pps | conntrack | None, the counter's packets, N of `ct count over N`) of one rule's expressions."""
    kind: Optional[str] = None
    limit: Optional[int] = None
    packets: Optional[int] = None
    for e in exprs:
        if not isinstance(e, dict):
            continue
        if isinstance(e.get("limit"), dict) and e["limit"].get("inv"):
            kind = "pps"
        count = e.get("ct count")
        if isinstance(count, dict) and count.get("inv"):
            kind, limit = "conntrack", int(count.get("val", 0))
        if isinstance(e.get("counter"), dict):
            packets = int(e["counter"].get("packets", 0))
    return kind, packets, limit


def parse_nft_table(text: str) -> NftCounters:
    """`nft -j list table` JSON -> the limiters' counters (the first rule of each kind; a rule without a
    counter counts as absent). ValueError on text that is not nft's JSON."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not an nft JSON document")
    pps: Optional[int] = None
    ct: Optional[int] = None
    n: Optional[int] = None
    for item in doc.get("nftables", []):
        rule = item.get("rule") if isinstance(item, dict) else None
        if not isinstance(rule, dict):
            continue
        kind, packets, limit = _rule_kind(rule.get("expr", []))
        if packets is None:
            continue
        if kind == "pps" and pps is None:
            pps = packets
        elif kind == "conntrack" and ct is None:
            ct, n = packets, limit
    return NftCounters(pps, ct, n)


def parse_nf_conntrack(text: str) -> int:
    """/proc/net/nf_conntrack -> entries a `ct count` limit counts: not a closed TCP connection, not loopback
    (loopback never crosses an ENI; the lab's own scrapes of /metrics run over it)."""
    n = 0
    for line in text.splitlines():
        v = line.split()
        if len(v) < 6:
            continue
        if v[2] == "tcp" and v[5] in CLOSED_TCP:
            continue
        if "src=127.0.0.1" in v or "src=::1" in v:
            continue
        n += 1
    return n


class NftReader:
    """One table's limiter counters (`nft -j`, a subprocess: no netlink library in the resident daemon) and
    the namespace's conntrack entries (procfs)."""

    def __init__(self, table: str, procfs: str = "/proc", nft: Optional[str] = None) -> None:
        family, _, name = table.partition(" ")
        self.family, self.name = (family, name) if name else ("inet", family)
        self.procfs = procfs
        self.nft = nft or shutil.which("nft") or "/usr/sbin/nft"

    def read_table(self) -> str:
        try:
            out = subprocess.run([self.nft, "-j", "list", "table", self.family, self.name], capture_output=True,
                                 text=True, timeout=NFT_TIMEOUT, check=False)
        except FileNotFoundError:
            raise NotSupported(f"no nft command ({self.nft})") from None
        if out.returncode != 0:
            raise NotSupported(f"nft list table {self.family} {self.name}: {out.stderr.strip()[:200]}")
        return out.stdout

    def read_conntrack(self) -> str:
        try:
            with open(os.path.join(self.procfs, "net/nf_conntrack"), encoding="ascii") as f:
                return f.read()
        except FileNotFoundError:
            return ""       # no entry yet: nf_conntrack not loaded in this namespace

    def counters(self) -> NftCounters:
        return parse_nft_table(self.read_table())

    def conntrack_entries(self) -> int:
        return parse_nf_conntrack(self.read_conntrack())
