"""Sampling step for the shaping signal: ENA's bw_{in,out}_allowance_exceeded, or a tc qdisc's overlimits."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional

from agent.models.counters import MAX_PACKETS_PER_SECOND, CounterSet
from agent.models.shaping import BANDWIDTH_ALLOWANCE, SHAPING_QDISCS, ShapingReading
from agent.readers.errors import NotSupported
from agent.sampling.ethtool import InterfaceEthtool

log = logging.getLogger(__name__)


class ShapingStep:
    """The shaping signal per direction from one source: `ethtool`, `tc`, or `auto`: ethtool when the
    driver has the allowance counters, else the qdiscs of `tc_out_interface`/`tc_in_interface` when
    configured. With ethtool it is a pure function of this sample's ethtool reading (the increases the
    ethtool step already computed, summed over interfaces: an ENI that comes or goes adds no spike); with
    tc it reads the qdiscs. (auto does not go looking for qdiscs on its own: that needs netlink, and
    pyroute2 costs ~23 MB of RSS in the resident daemon.)"""

    name = "shaping"

    def __init__(self, mode: str, interfaces: Callable[[], list[str]], tc_in: Optional[str] = None,
                 tc_out: Optional[str] = None, tc_reader: Optional[Callable[[], Any]] = None) -> None:
        self.mode = mode
        self._interfaces = interfaces
        self.tc_in, self.tc_out = tc_in, tc_out
        self._tc_factory = tc_reader or _default_tc
        self._tc: Any = None
        self._tc_counters: CounterSet[tuple[str, str]] = CounterSet(MAX_PACKETS_PER_SECOND, "tc overlimits")
        self._total: Optional[dict[str, int]] = None
        self._fresh = True                 # the next good reading only sets the baseline
        self.source: Optional[str] = None  # the source in use: ethtool | tc

    def _from_ethtool(self, ethtool: Optional[Mapping[str, InterfaceEthtool]]) -> dict[str, int]:
        increase: dict[str, int] = {}
        for reading in (ethtool or {}).values():
            for d, stat in BANDWIDTH_ALLOWANCE.items():
                if stat in reading.raw:
                    increase[d] = increase.get(d, 0) + reading.increase.get(stat, 0)
        if not increase:
            raise NotSupported("no bw_*_allowance_exceeded statistics on the monitored interfaces")
        return increase

    def _from_tc(self, dt: float) -> dict[str, int]:
        if self._tc is None:
            self._tc = self._tc_factory()
        raw: dict[tuple[str, str], int] = {}
        outs = [self.tc_out] if self.tc_out else self._interfaces()
        for direction, names in (("out", outs), ("in", [self.tc_in] if self.tc_in else [])):
            for ifname in names:
                q = self._tc.root_qdisc(ifname)
                if q is not None and q.kind in SHAPING_QDISCS:
                    raw[(direction, ifname)] = q.overlimits
        if not raw:
            raise NotSupported("no shaping root qdisc (tbf, htb, ...) on the monitored interfaces")
        increase: dict[str, int] = {}
        for (direction, _ifname), inc in self._tc_counters.update(raw, dt).items():
            increase[direction] = increase.get(direction, 0) + inc
        return increase

    def _read(self, ethtool: Optional[Mapping[str, InterfaceEthtool]], dt: float) -> dict[str, int]:
        if self.mode == "none":
            raise NotSupported("shaping_source = none")
        if self.mode == "ethtool" or (self.mode == "auto" and self.source in (None, "ethtool")):
            try:
                increase = self._from_ethtool(ethtool)
                self.source = "ethtool"
                return increase
            except NotSupported:
                if self.mode == "ethtool" or not (self.tc_in or self.tc_out):
                    raise
        increase = self._from_tc(dt)
        if self.source != "tc":
            log.info("shaping signal from tc qdisc overlimits (interfaces out=%s in=%s)",
                     self.tc_out or ",".join(self._interfaces()), self.tc_in or "-")
            self.source = "tc"
        return increase

    def run(self, ethtool: Optional[Mapping[str, InterfaceEthtool]] = None,
                dt: float = 0.0) -> ShapingReading:
        try:
            increase = self._read(ethtool, dt)
        except Exception:
            self._fresh = True           # after a gap, the next reading starts a new baseline
            raise
        total = self._total or {}
        if self._fresh:
            self._fresh = False
            total = {d: total.get(d, 0) for d in increase}
            increase = {}                # the first reading only sets the baseline
        else:
            total = {**total, **{d: total.get(d, 0) + v for d, v in increase.items()}}
        self._total = total
        assert self.source is not None
        return ShapingReading(self.source, increase, dict(total))

    def stale(self) -> Optional[ShapingReading]:
        """The last totals with no increase, for a sample whose read failed (the exported counter stays)."""
        if self._total is None or self.source is None:
            return None
        return ShapingReading(self.source, {}, dict(self._total))


def _default_tc() -> Any:
    from agent.readers.tc import TcReader

    return TcReader()
