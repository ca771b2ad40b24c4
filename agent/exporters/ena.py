"""Prometheus view of the ENA statistics: allowance counters, conntrack, ENA Express, driver identity."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional

from prometheus_client.core import Metric

from agent.exporters import View, declared, family
from agent.models import figures as F
from agent.models.ena import (
    ALLOWANCE_STATS,
    CONNTRACK_AVAILABLE,
    DEFAULT_STATS,
    ENA_SRD_MODE,
    ENA_SRD_UTILIZATION,
    parse_ena_version,
)
from agent.sampling.ethtool import InterfaceEthtool

# ena_srd_* counters -> their figures (packets, so `_packets_total`)
SRD_COUNTERS = {
    "ena_srd_tx_pkts": F.ENA_SRD_TX_PACKETS_TOTAL,
    "ena_srd_eligible_tx_pkts": F.ENA_SRD_ELIGIBLE_TX_PACKETS_TOTAL,
    "ena_srd_rx_pkts": F.ENA_SRD_RX_PACKETS_TOTAL,
}


def in_tree_label(driver: str, version: str) -> str:
    """"true"/"false" for ENA (out-of-tree 2.x.yg vs in-tree), "unknown" when it cannot be told."""
    if driver != "ena":
        return "unknown"
    kind = parse_ena_version(version).kind
    return "true" if kind == "in-tree" else "false" if kind == "out-of-tree" else "unknown"


class EnaView(View):
    """Renders the ethtool collector's latest reading (interface -> InterfaceEthtool); no I/O."""

    FAMILIES = declared(F.ENA_ALLOWANCE_EXCEEDED_TOTAL, F.ENA_CONNTRACK_ALLOWANCE_AVAILABLE, F.ENA_SRD_MODE,
                        F.ENA_SRD_ENABLED, F.ENA_SRD_RESOURCE_UTILIZATION_RATIO, *SRD_COUNTERS.values(),
                        F.ENA_STAT_RESETS_TOTAL, F.DRIVER_INFO, F.ETHTOOL_STAT)

    def __init__(self, readings: Callable[[], Optional[Mapping[str, InterfaceEthtool]]]) -> None:
        self._readings = readings

    def collect(self) -> Iterable[Metric]:
        data = self._readings()
        if data is None:
            return
        allowance = family(F.ENA_ALLOWANCE_EXCEEDED_TOTAL)
        conntrack = family(F.ENA_CONNTRACK_ALLOWANCE_AVAILABLE)
        srd_mode = family(F.ENA_SRD_MODE)
        srd_on = family(F.ENA_SRD_ENABLED)
        srd_util = family(F.ENA_SRD_RESOURCE_UTILIZATION_RATIO)
        srd = {k: family(fig) for k, fig in SRD_COUNTERS.items()}
        resets = family(F.ENA_STAT_RESETS_TOTAL)
        info = family(F.DRIVER_INFO)
        extra = family(F.ETHTOOL_STAT)
        for ifname, r in sorted(data.items()):
            for kind, stat in ALLOWANCE_STATS.items():
                if stat in r.totals:
                    allowance.add_metric([ifname, kind], r.totals[stat])
            if CONNTRACK_AVAILABLE in r.raw:
                conntrack.add_metric([ifname], r.raw[CONNTRACK_AVAILABLE])
            if ENA_SRD_MODE in r.raw:
                srd_mode.add_metric([ifname], r.raw[ENA_SRD_MODE])
                srd_on.add_metric([ifname], float(r.raw[ENA_SRD_MODE] & 1))
            if ENA_SRD_UTILIZATION in r.raw:
                srd_util.add_metric([ifname], r.raw[ENA_SRD_UTILIZATION] / 100.0)
            for stat, fam in srd.items():
                if stat in r.totals:
                    fam.add_metric([ifname], r.totals[stat])
            resets.add_metric([ifname], r.resets)
            if r.driver is not None:
                info.add_metric([ifname, r.driver.driver, r.driver.version,
                                 in_tree_label(r.driver.driver, r.driver.version)], 1.0)
            for stat, value in sorted(r.raw.items()):
                if stat not in DEFAULT_STATS:
                    extra.add_metric([ifname, stat], value)
        yield allowance
        yield conntrack
        yield srd_mode
        yield srd_on
        yield srd_util
        yield from srd.values()
        yield resets
        yield info
        yield extra
