"""Read a qdisc's shaping counters (overlimits) over netlink, for hosts and labs that shape with tc."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional


class QdiscStats(NamedTuple):
    kind: str
    bytes: int
    packets: int
    drops: int
    overlimits: int


def parse_qdisc(msg: Any) -> Optional[QdiscStats]:
    """A pyroute2 tcmsg (root qdisc) -> its counters; TCA_STATS2/TCA_STATS_QUEUE wins over legacy TCA_STATS."""
    kind = msg.get_attr("TCA_KIND") or "?"
    basic = queue = None
    stats2 = msg.get_attr("TCA_STATS2")
    if stats2 is not None:
        basic = stats2.get_attr("TCA_STATS_BASIC")
        queue = stats2.get_attr("TCA_STATS_QUEUE")
    legacy = msg.get_attr("TCA_STATS")
    if basic is None and legacy is None:
        return None
    nbytes = (basic or legacy)["bytes"]
    packets = (basic or legacy)["packets"]
    drops = (queue or legacy)["drops"]
    over = (queue or legacy)["overlimits"]
    return QdiscStats(kind, int(nbytes), int(packets), int(drops), int(over))


class TcReader:
    """Root-qdisc counters of an interface, by name; one netlink socket kept open across samples."""

    def __init__(self) -> None:
        from pyroute2 import IPRoute

        self._ipr = IPRoute()
        self._index: dict[str, int] = {}

    def root_qdisc(self, ifname: str) -> Optional[QdiscStats]:
        idx = self._index.get(ifname)
        if idx is None:
            found = self._ipr.link_lookup(ifname=ifname)
            if not found:
                return None
            idx = self._index[ifname] = found[0]
        try:
            msgs = self._ipr.get_qdiscs(index=idx)
        except Exception:
            self._index.pop(ifname, None)  # re-created interface: look the index up again next time
            raise
        for m in msgs:
            if m.get("parent") == 0xFFFFFFFF:  # TC_H_ROOT
                return parse_qdisc(m)
        return None

    def close(self) -> None:
        self._ipr.close()
