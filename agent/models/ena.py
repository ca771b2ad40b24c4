"""What burstwatch knows about the ENA driver: its statistic names, the features they reveal, its versions (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple, Optional

# ENA's allowance counters (ena_ethtool.c ena_hw_stats_strings;
# docs/ec2-network-facts.md, "ENA allowance counters"): packets queued
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
    """Features from the statistic names present, never from the version string
    (docs/ec2-network-facts.md, "ENA allowance counters")."""
    return EnaFeatures(allowance=tuple(k for k, n in ALLOWANCE_STATS.items() if n in stats),
                       conntrack_available=CONNTRACK_AVAILABLE in stats,
                       ena_express_stats=any(n in stats for n in ENA_EXPRESS_STATS),
                       ena_express_mode=stats.get(ENA_SRD_MODE))


# ENA driver milestones (amzn-drivers RELEASENOTES.md, ENA_Linux_Best_Practices.rst,
# docs/ec2-network-facts.md, "ENA driver versions"): what each version brought that matters to burstwatch.
V_MIN_RECOMMENDED = (1, 5, 0)      # the old minimum recommended version
V_ENAV3 = (2, 2, 9)                # ENAv3 devices (most 6th-generation types): older drivers lose performance
V_ALLOWANCE = (2, 2, 10)         # "Add new device statistics to ethtool": the allowance counters
V_ENA_EXPRESS_STATS = (2, 8, 0)    # "Add support for SRD metrics"
V_CONNTRACK_AVAILABLE = (2, 8, 1)  # "Add conntrack customer metric to ethtool"

# Out-of-tree (GitHub) builds report MAJOR.MINOR.SUBMINOR + "g"; in-tree builds before Linux 5.8
# reported the same with "K"; since 5.8 the in-tree driver sets no version and ethtool shows the
# kernel release (6.1.0-18-cloud-amd64, 4.18.0-305.el8_4.x86_64).
_DRIVER_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)([gGkK]?)$")
_KERNEL_RELEASE = re.compile(r"^\d+\.\d+(\.\d+)?[-+_.]\S*$")

class EnaVersion(NamedTuple):
    text: str
    kind: str                              # out-of-tree | in-tree | unknown
    number: Optional[tuple[int, int, int]]  # the driver's own version, when it reports one


def parse_ena_version(text: str, module_version: Optional[str] = None) -> EnaVersion:
    """`ethtool -i` version (plus /sys/module/ena/version, set only by out-of-tree builds) -> EnaVersion."""
    t = (text or "").strip()
    m = _DRIVER_VERSION.match(t)
    if m:
        number = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        suffix = m.group(4).lower()
        kind = "out-of-tree" if suffix == "g" else "in-tree" if suffix == "k" else (
            "out-of-tree" if module_version else "unknown")
        return EnaVersion(t, kind, number)
    if _KERNEL_RELEASE.match(t):
        return EnaVersion(t, "in-tree", None)
    return EnaVersion(t, "out-of-tree" if module_version else "unknown", None)


def _v(n: tuple[int, int, int]) -> str:
    return ".".join(map(str, n))
