"""Prometheus view of the instance: identity, bandwidth profile with each figure's source, IMDS health."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from agent.exporters import NS, View
from agent.models.units import DIRECTIONS

if TYPE_CHECKING:
    from agent.discovery import InstanceInfo


class InstanceView(View):
    """Renders the InstanceInfo that discovery computed; no I/O at scrape time."""

    FAMILIES = (
        ("burstwatch_instance", "info"),
        ("burstwatch_instance_discovery", "info"),
        ("burstwatch_instance_discovery_duration_seconds", "gauge"),
        ("burstwatch_bandwidth_baseline_bytes_per_second", "gauge"),
        ("burstwatch_bandwidth_peak_bytes_per_second", "gauge"),
        ("burstwatch_bandwidth_burstable", "gauge"),
        ("burstwatch_network_card_baseline_bytes_per_second", "gauge"),
        ("burstwatch_network_card_peak_bytes_per_second", "gauge"),
        ("burstwatch_imds_requests", "counter"),
        ("burstwatch_imds_up", "gauge"),
    )

    def __init__(self, get_info: Callable[[], Optional[InstanceInfo]]) -> None:
        self._get_info = get_info

    def collect(self) -> Iterable[Metric]:
        info = self._get_info()
        if info is None:
            return
        ident = info.identity
        m = InfoMetricFamily(f"{NS}_instance", "Who this instance is (from IMDS; instance_type may come from "
                             "[instance] type). Empty labels are unknown.")
        m.add_metric([], {
            "instance_id": ident.instance_id if ident else "",
            "instance_type": info.instance_type or "",
            "region": (ident.region or "") if ident else "",
            "availability_zone": (ident.availability_zone or "") if ident else "",
            "availability_zone_id": (ident.availability_zone_id or "") if ident else "",
            "on_ec2": "true" if info.on_ec2 else "false",
        })
        yield m

        src = info.sources
        d = InfoMetricFamily(f"{NS}_instance_discovery",
                             "Where discovery got its answers: imds (v2, v1, off, unreachable, disabled, "
                             "error), instance_type_source (config, imds, none), type_data_source (api, "
                             "catalogue, none) and api (fresh, cached, stale_cache, denied, unreachable, "
                             "no_credentials, unknown_type, error, skipped).")
        d.add_metric([], {"imds": src.get("imds", ""), "instance_type_source": src.get("instance_type", ""),
                          "type_data_source": src.get("type_entry", ""), "api": src.get("api", "")})
        yield d
        yield GaugeMetricFamily(f"{NS}_instance_discovery_duration_seconds", "How long start-up discovery "
                                "(IMDS, sysfs, DescribeInstanceTypes) took.", value=info.discovery_seconds)

        p = info.profile
        base = GaugeMetricFamily(f"{NS}_bandwidth_baseline_bytes_per_second", "Baseline bandwidth per "
                                 "direction (network card 0); source: config, api, catalogue.",
                                 labels=["direction", "source"])
        peak = GaugeMetricFamily(f"{NS}_bandwidth_peak_bytes_per_second", "Peak (burst) bandwidth per "
                                 "direction (network card 0); source: config, api, catalogue.",
                                 labels=["direction", "source"])
        # The bucket in use and where it came from (config, learned, default) are the credit view's:
        # burstwatch_credit_bucket_bytes and burstwatch_credit_bucket_info, since learning changes them.
        bursts = GaugeMetricFamily(f"{NS}_bandwidth_burstable",
                                   "1 when the size bursts above its baseline with a credit bucket; 0 when "
                                   "baseline = peak (never exhausts) or unknown.", labels=["direction"])
        for direction in DIRECTIONS:
            if p.baseline_bytes_per_second is not None:
                base.add_metric([direction, p.baseline_source], p.baseline_bytes_per_second)
            if p.peak_bytes_per_second is not None:
                peak.add_metric([direction, p.peak_source], p.peak_bytes_per_second)
            bursts.add_metric([direction], 1.0 if p.bursts else 0.0)
        yield base
        yield peak
        yield bursts

        cbase = GaugeMetricFamily(f"{NS}_network_card_baseline_bytes_per_second",
                                  "Baseline bandwidth of each network card per direction, from the type's "
                                  "data (api or catalogue).", labels=["network_card", "direction", "source"])
        cpeak = GaugeMetricFamily(f"{NS}_network_card_peak_bytes_per_second",
                                  "Peak bandwidth of each network card per direction, from the type's data "
                                  "(api or catalogue).", labels=["network_card", "direction", "source"])
        for card in p.cards:
            for direction in DIRECTIONS:
                if card.baseline_bytes_per_second is not None:
                    cbase.add_metric([str(card.network_card), direction, p.cards_source],
                                     card.baseline_bytes_per_second)
                if card.peak_bytes_per_second is not None:
                    cpeak.add_metric([str(card.network_card), direction, p.cards_source],
                                     card.peak_bytes_per_second)
        yield cbase
        yield cpeak

        stats = info.imds_stats
        if stats is None:  # imds.enabled = false: no IMDS series at all
            return
        reqs = CounterMetricFamily(f"{NS}_imds_requests",
                                   "IMDS HTTP attempts by request (token, metadata) and result (ok, "
                                   "not_found, unauthorized, forbidden, timeout, refused, error).",
                                   labels=["request", "result"])
        for (request, result), n in sorted(stats.snapshot().items()):
            reqs.add_metric([request, result], n)
        yield reqs
        if stats.up is not None:
            yield GaugeMetricFamily(f"{NS}_imds_up", "1 when the last IMDS request got an answer "
                                    "(200 or 404), else 0.", value=1.0 if stats.up else 0.0)
