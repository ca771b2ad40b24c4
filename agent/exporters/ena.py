"""Prometheus view of the ENA statistics: allowance counters, conntrack, ENA Express, driver identity."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.exporters import NS, View
from agent.models.ena import (
    ALLOWANCE_STATS,
    CONNTRACK_AVAILABLE,
    DEFAULT_STATS,
    ENA_SRD_MODE,
    ENA_SRD_UTILIZATION,
    parse_ena_version,
)
from agent.sampling.ethtool import InterfaceEthtool

# ena_srd_* counters -> metric names (packets, so `_packets_total`)
SRD_COUNTERS = {
    "ena_srd_tx_pkts": ("ena_srd_tx_packets", "Packets sent over ENA Express (SRD)."),
    "ena_srd_eligible_tx_pkts": ("ena_srd_eligible_tx_packets", "Packets that were eligible for ENA Express."),
    "ena_srd_rx_pkts": ("ena_srd_rx_packets", "Packets received over ENA Express (SRD)."),
}


def in_tree_label(driver: str, version: str) -> str:
    """"true"/"false" for ENA (out-of-tree 2.x.yg vs in-tree), "unknown" when it cannot be told."""
    if driver != "ena":
        return "unknown"
    kind = parse_ena_version(version).kind
    return "true" if kind == "in-tree" else "false" if kind == "out-of-tree" else "unknown"


class EnaView(View):
    """Renders the ethtool collector's latest reading (interface -> InterfaceEthtool); no I/O."""

    FAMILIES = (
        ("burstwatch_ena_allowance_exceeded", "counter"),
        ("burstwatch_ena_conntrack_allowance_available", "gauge"),
        ("burstwatch_ena_srd_mode", "gauge"),
        ("burstwatch_ena_srd_enabled", "gauge"),
        ("burstwatch_ena_srd_resource_utilization_ratio", "gauge"),
        ("burstwatch_ena_srd_tx_packets", "counter"),
        ("burstwatch_ena_srd_eligible_tx_packets", "counter"),
        ("burstwatch_ena_srd_rx_packets", "counter"),
        ("burstwatch_ena_stat_resets", "counter"),
        ("burstwatch_driver_info", "gauge"),
        ("burstwatch_ethtool_stat", "gauge"),
    )

    def __init__(self, readings: Callable[[], Optional[Mapping[str, InterfaceEthtool]]]) -> None:
        self._readings = readings

    def collect(self) -> Iterable[Metric]:
        data = self._readings()
        if data is None:
            return
        allowance = CounterMetricFamily(
            f"{NS}_ena_allowance_exceeded", "Packets queued or dropped because the instance exceeded an "
            "allowance (ENA ethtool *_allowance_exceeded), by kind: bw_in, bw_out (aggregate bandwidth), pps, "
            "conntrack (new connections), linklocal (DNS/IMDS/NTP). Accounted across driver resets.",
            labels=["interface", "allowance"])
        conntrack = GaugeMetricFamily(
            f"{NS}_ena_conntrack_allowance_available", "Tracked connections the instance can still open before "
            "reaching its allowance (ENA conntrack_allowance_available).", labels=["interface"])
        srd_mode = GaugeMetricFamily(
            f"{NS}_ena_srd_mode", "ENA Express mode bitmap (ena_srd_mode): bit 0 enabled, bit 1 UDP, bit 2 UDP "
            "ordering bypass.", labels=["interface"])
        srd_on = GaugeMetricFamily(f"{NS}_ena_srd_enabled", "1 when ENA Express is on (ena_srd_mode bit 0).",
                                   labels=["interface"])
        srd_util = GaugeMetricFamily(
            f"{NS}_ena_srd_resource_utilization_ratio", "ENA Express resource utilization (0..1; the driver "
            "reports a percentage).", labels=["interface"])
        srd = {k: CounterMetricFamily(f"{NS}_{name}", doc, labels=["interface"])
               for k, (name, doc) in SRD_COUNTERS.items()}
        resets = CounterMetricFamily(f"{NS}_ena_stat_resets", "Decreases of ENA counters handled as a reset "
                                     "(driver reset, interface re-created).", labels=["interface"])
        info = GaugeMetricFamily(f"{NS}_driver_info", "The interface's driver and version (ethtool -i); in_tree "
                                 "tells the kernel's ena from the out-of-tree 2.x.yg one.",
                                 labels=["interface", "driver", "version", "in_tree"])
        extra = GaugeMetricFamily(f"{NS}_ethtool_stat", "Raw value of an ethtool statistic listed in [metrics] "
                                  "ethtool_include (kind unknown: use rate() only on counters).",
                                  labels=["interface", "stat"])
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
