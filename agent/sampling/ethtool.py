"""Collector for the ENA statistics that matter: allowance (shaping) counters, conntrack, ENA Express."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from agent.models.counters import MAX_PACKETS_PER_SECOND, counter_delta
from agent.readers.ethtool import DriverInfo, EthtoolReader, NoSuchInterface
from agent.sampling import NotSupported
from agent.sampling.shaping import ethtool_shaping

log = logging.getLogger(__name__)

# ENA's allowance counters (ena_ethtool.c ena_hw_stats_strings; ec2-network-facts.md): packets queued
# or dropped because the instance exceeded an allowance, cumulative. Keyed by the `allowance` label.
ALLOWANCE_STATS = {
    "bw_in": "bw_in_allowance_exceeded",          # aggregate inbound bandwidth
    "bw_out": "bw_out_allowance_exceeded",        # aggregate outbound bandwidth
    "pps": "pps_allowance_exceeded",              # bidirectional packets per second
    "conntrack": "conntrack_allowance_exceeded",  # new connections that could not be tracked
    "linklocal": "linklocal_allowance_exceeded",  # DNS, IMDS, Time Sync: 1024 PPS per interface
}
CONNTRACK_AVAILABLE = "conntrack_allowance_available"   # gauge; driver >= 2.8.1 and a device capability
# ENA Express (SRD) statistics, driver >= 2.8.0 and a device capability (ena_srd_info_strings).
ENA_SRD_MODE = "ena_srd_mode"                  # bitmap: bit0 enabled, bit1 UDP, bit2 UDP ordering bypass
ENA_SRD_COUNTERS = ("ena_srd_tx_pkts", "ena_srd_eligible_tx_pkts", "ena_srd_rx_pkts")
ENA_SRD_UTILIZATION = "ena_srd_resource_utilization"    # percent
ENA_EXPRESS_STATS = (ENA_SRD_MODE, *ENA_SRD_COUNTERS, ENA_SRD_UTILIZATION)

# Statistics kept by default; everything else needs [metrics] ethtool_include (node_exporter users
# complain about hundreds of per-queue series per device).
DEFAULT_STATS = frozenset([*ALLOWANCE_STATS.values(), CONNTRACK_AVAILABLE, *ENA_EXPRESS_STATS])
# Cumulative counters among them: exported as reset-safe totals. The rest are gauges.
COUNTER_STATS = frozenset([*ALLOWANCE_STATS.values(), *ENA_SRD_COUNTERS])
DRIVER_REFRESH_SAMPLES = 300   # re-read `ethtool -i` every N samples (a module reload changes it)


def shaping_counters(stats: dict[str, int]) -> dict[str, int]:
    """{"in": bw_in_allowance_exceeded, "out": bw_out_allowance_exceeded}; a direction is absent when
    the driver lacks it (ENA < 2.2.10, other drivers). The credit model's shaping signal; the same
    function as agent.sampling.shaping.ethtool_shaping, so both read the counters one way."""
    return ethtool_shaping(stats)


@dataclass(frozen=True)
class EnaFeatures:
    """What a driver can report, judged from the statistic names it actually exposes."""

    allowance: tuple[str, ...]      # allowance kinds present (bw_in, bw_out, pps, conntrack, linklocal)
    conntrack_available: bool
    ena_express_stats: bool
    ena_express_mode: Optional[int]

    @property
    def all_allowance(self) -> bool:
        return len(self.allowance) == len(ALLOWANCE_STATS)

    @property
    def ena_express_enabled(self) -> bool:
        return bool(self.ena_express_mode is not None and self.ena_express_mode & 1)


def ena_features(stats: dict[str, int]) -> EnaFeatures:
    """Features from the statistic names present, never from the version string (ec2-network-facts.md)."""
    return EnaFeatures(allowance=tuple(k for k, n in ALLOWANCE_STATS.items() if n in stats),
                       conntrack_available=CONNTRACK_AVAILABLE in stats,
                       ena_express_stats=any(n in stats for n in ENA_EXPRESS_STATS),
                       ena_express_mode=stats.get(ENA_SRD_MODE))


@dataclass
class InterfaceEthtool:
    """One interface's kept statistics: raw values, reset-safe totals for the counters, its driver."""

    raw: dict[str, int]
    totals: dict[str, int]
    driver: Optional[DriverInfo]
    resets: int = 0


@dataclass
class _State:
    last: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    resets: int = 0
    driver: Optional[DriverInfo] = None
    driver_age: int = DRIVER_REFRESH_SAMPLES


class EthtoolCollector:
    """Reads every ethtool statistic of the monitored interfaces and keeps the ENA ones that matter
    (plus `include`). Interfaces without statistics (lo, some virtual devices) or gone are left out;
    when none has any, the collector is "not supported" here. Counters are accounted across driver
    resets and interface re-creation (a decrease is a reset, never a negative increase)."""

    name = "ethtool"

    def __init__(self, interfaces: Callable[[], list[str]], reader: EthtoolReader,
                 include: Iterable[str] = (), clock: Optional[Callable[[], float]] = None) -> None:
        self._interfaces = interfaces
        self.reader = reader
        self.include = frozenset(include)
        self._clock = clock or time.monotonic
        self._last_t: Optional[float] = None
        self._state: dict[str, _State] = {}
        self.latest: Optional[dict[str, InterfaceEthtool]] = None

    def _keep(self, name: str) -> bool:
        return name in DEFAULT_STATS or name in self.include

    def collect(self) -> dict[str, InterfaceEthtool]:
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
            st = self._state.setdefault(ifname, _State())
            kept = {k: v for k, v in stats.items() if self._keep(k)}
            for name, value in kept.items():
                if name not in COUNTER_STATS:
                    continue  # gauges, and included extras whose kind we cannot know, stay raw
                prev = st.last.get(name)
                if prev is None:
                    st.totals.setdefault(name, value)    # first sight: the driver's own cumulative value
                    continue
                inc, kind = counter_delta(prev, value, dt, MAX_PACKETS_PER_SECOND)
                if kind != "ok":
                    st.resets += 1
                    log.info("interface=%s: ethtool %s went %d -> %d (%s)", ifname, name, prev, value, kind)
                st.totals[name] = st.totals.get(name, 0) + inc
            st.last = kept
            st.driver_age += 1
            if st.driver is None or st.driver_age >= DRIVER_REFRESH_SAMPLES:
                st.driver = self.reader.driver(ifname)
                st.driver_age = 0
            out[ifname] = InterfaceEthtool(raw=kept, totals={k: st.totals[k] for k in kept if k in st.totals},
                                           driver=st.driver, resets=st.resets)
        if wanted and not out and len(unsupported) == len(wanted):
            raise NotSupported("; ".join(unsupported))
        self.latest = out
        return out


def make_step_hook(collector: EthtoolCollector, status: dict) -> Callable[..., dict]:
    """A Sampler hook running the collector each sample: its result lands in Snapshot.extra["ethtool"]
    and its health in the snapshot's collector status (burstwatch_collector_success{collector="ethtool"})."""
    from agent.sampling import run_collector

    def hook(_now: float, _deltas: dict, _tracker: object) -> dict:
        return {"ethtool": run_collector(collector, status)}

    return hook
