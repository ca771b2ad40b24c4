"""Collector for the shaping signal: ENA's bw_{in,out}_allowance_exceeded, or a tc qdisc's overlimits."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from agent.sampling import NotSupported

log = logging.getLogger(__name__)

# Root qdiscs that shape by rate; their overlimits counter rises when a packet had to wait for tokens.
SHAPING_QDISCS = {"tbf", "htb", "hfsc", "cake", "cbq"}


def ethtool_shaping(stats: dict[str, int]) -> dict[str, int]:
    """ENA's cumulative bandwidth-allowance counters per direction (absent on drivers < 2.2.10)."""
    out = {}
    for direction, name in (("in", "bw_in_allowance_exceeded"), ("out", "bw_out_allowance_exceeded")):
        if name in stats:
            out[direction] = stats[name]
    return out


class ShapingCollector:
    """Cumulative shaping counters per direction from one source: `ethtool`, `tc`, or `auto`: ethtool
    when the driver has the allowance counters, else the qdiscs of `tc_out_interface`/`tc_in_interface`
    when configured. (auto does not go looking for qdiscs on its own: that needs netlink, and pyroute2
    costs ~23 MB of RSS in the resident daemon.)"""

    name = "shaping"

    def __init__(self, mode: str, interfaces: Callable[[], list[str]], tc_in: Optional[str] = None,
                 tc_out: Optional[str] = None,
                 ethtool_reader: Optional[Callable[[], Any]] = None,
                 tc_reader: Optional[Callable[[], Any]] = None,
                 ethtool_stats: Optional[Callable[[], Optional[dict[str, dict[str, int]]]]] = None) -> None:
        self.mode = mode
        self._interfaces = interfaces
        self.tc_in, self.tc_out = tc_in, tc_out
        self._ethtool_factory = ethtool_reader or _default_ethtool
        self._tc_factory = tc_reader or _default_tc
        # The daemon hands over the ethtool collector's reading of this very sample, so the ioctls
        # run once per sample, not twice.
        self._ethtool_stats = ethtool_stats
        self._ethtool: Any = None
        self._tc: Any = None
        self.source: Optional[str] = None  # the source in use: ethtool | tc

    def _per_interface_stats(self) -> list[dict[str, int]]:
        if self._ethtool_stats is not None:
            return list((self._ethtool_stats() or {}).values())
        if self._ethtool is None:
            self._ethtool = self._ethtool_factory()
        out = []
        for ifname in self._interfaces():
            try:
                out.append(self._ethtool.stats(ifname))
            except (NotSupported, OSError):
                continue
        return out

    def _read_ethtool(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for stats in self._per_interface_stats():
            for d, v in ethtool_shaping(stats).items():
                total[d] = total.get(d, 0) + v
        if not total:
            raise NotSupported("no bw_*_allowance_exceeded statistics on the monitored interfaces")
        return total

    def _read_tc(self) -> dict[str, int]:
        if self._tc is None:
            self._tc = self._tc_factory()
        out: dict[str, int] = {}
        outs = [self.tc_out] if self.tc_out else self._interfaces()
        for direction, names in (("out", outs), ("in", [self.tc_in] if self.tc_in else [])):
            for ifname in names:
                q = self._tc.root_qdisc(ifname)
                if q is not None and q.kind in SHAPING_QDISCS:
                    out[direction] = out.get(direction, 0) + q.overlimits
        if not out:
            raise NotSupported("no shaping root qdisc (tbf, htb, ...) on the monitored interfaces")
        return out

    def collect(self) -> dict[str, int]:
        if self.mode == "none":
            raise NotSupported("shaping_source = none")
        if self.mode == "ethtool" or (self.mode == "auto" and self.source in (None, "ethtool")):
            try:
                result = self._read_ethtool()
                self.source = "ethtool"
                return result
            except NotSupported:
                if self.mode == "ethtool" or not (self.tc_in or self.tc_out):
                    raise
        result = self._read_tc()
        if self.source != "tc":
            log.info("shaping signal from tc qdisc overlimits (interfaces out=%s in=%s)",
                     self.tc_out or ",".join(self._interfaces()), self.tc_in or "-")
        self.source = "tc"
        return result


def _default_ethtool() -> Any:
    from agent.readers.ethtool import IoctlEthtoolReader

    return IoctlEthtoolReader()


def _default_tc() -> Any:
    from agent.readers.tc import TcReader

    return TcReader()
