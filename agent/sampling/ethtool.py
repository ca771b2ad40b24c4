"""Sampling step for the ENA statistics that matter: allowance (shaping) counters, conntrack, ENA Express."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from agent.models.counters import MAX_PACKETS_PER_SECOND, CounterSet
from agent.models.ena import COUNTER_STATS, DEFAULT_STATS
from agent.readers.errors import NoSuchInterface, NotSupported
from agent.readers.ethtool import DriverInfo, EthtoolReader

log = logging.getLogger(__name__)

DRIVER_REFRESH_SAMPLES = 300   # re-read `ethtool -i` every N samples (a module reload changes it)


@dataclass
class InterfaceEthtool:
    """One interface's kept statistics: raw values, reset-safe totals for the counters, this sample's
    increase of each counter (empty on the interface's first sample), its driver."""

    raw: dict[str, int]
    totals: dict[str, int]
    driver: Optional[DriverInfo]
    resets: int = 0
    increase: dict[str, int] = field(default_factory=dict)


@dataclass
class _State:
    counters: CounterSet[str]
    driver: Optional[DriverInfo] = None
    driver_age: int = DRIVER_REFRESH_SAMPLES


class EthtoolStep:
    """Reads every ethtool statistic of the monitored interfaces and keeps the ENA ones that matter
    (plus `include`). Interfaces without statistics (lo, some virtual devices) or gone are left out;
    when none has any, the step is "not supported" here. Counters go through CounterSet, so driver
    resets and re-created interfaces never become negative or invented increases."""

    name = "ethtool"

    def __init__(self, interfaces: Callable[[], list[str]], reader: EthtoolReader,
                 include: Iterable[str] = (), clock: Optional[Callable[[], float]] = None) -> None:
        self._interfaces = interfaces
        self.reader = reader
        self.include = frozenset(include)
        self._clock = clock or time.monotonic
        self._last_t: Optional[float] = None
        self._state: dict[str, _State] = {}

    def _keep(self, name: str) -> bool:
        return name in DEFAULT_STATS or name in self.include

    def run(self) -> dict[str, InterfaceEthtool]:
        now = self._clock()
        dt = 0.0 if self._last_t is None else now - self._last_t
        self._last_t = now
        out: dict[str, InterfaceEthtool] = {}
        unsupported = []
        wanted = self._interfaces()
        for ifname in wanted:
            try:
                stats = self.reader.stats(ifname)
            except NotSupported as exc:
                unsupported.append(str(exc))
                continue
            except NoSuchInterface:
                self._state.pop(ifname, None)
                continue
            st = self._state.get(ifname)
            if st is None:
                # Totals start at the driver's own cumulative count: the exported *_total is the driver's.
                st = self._state[ifname] = _State(CounterSet(MAX_PACKETS_PER_SECOND, f"interface={ifname}: ethtool",
                                                             start_at_value=True))
            kept = {k: v for k, v in stats.items() if self._keep(k)}
            # Gauges, and included extras whose kind we cannot know, stay raw.
            increase = st.counters.update({k: v for k, v in kept.items() if k in COUNTER_STATS}, dt)
            st.driver_age += 1
            if st.driver is None or st.driver_age >= DRIVER_REFRESH_SAMPLES:
                st.driver = self.reader.driver(ifname)
                st.driver_age = 0
            totals = st.counters.totals
            out[ifname] = InterfaceEthtool(raw=kept, totals={k: totals[k] for k in kept if k in totals},
                                           driver=st.driver, resets=st.counters.resets, increase=increase)
        for gone in [n for n in self._state if n not in wanted]:
            del self._state[gone]
        if wanted and not out and len(unsupported) == len(wanted):
            raise NotSupported("; ".join(unsupported))
        return out
