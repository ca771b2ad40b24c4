"""Prometheus view of the instance: identity, bandwidth profile with each figure's source, IMDS health."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Optional

from prometheus_client.core import Metric

from agent.exporters import View, declared, family
from agent.models import figures as F
from agent.models.units import DIRECTIONS

if TYPE_CHECKING:
    from agent.discovery import InstanceInfo


class InstanceView(View):
    """Renders the InstanceInfo that discovery computed; no I/O at scrape time."""

    FAMILIES = declared(F.INSTANCE_INFO, F.INSTANCE_DISCOVERY_INFO, F.INSTANCE_DISCOVERY_DURATION_SECONDS,
                        F.BANDWIDTH_BASELINE_BYTES_PER_SECOND, F.BANDWIDTH_PEAK_BYTES_PER_SECOND,
                        F.BANDWIDTH_BURSTABLE, F.NETWORK_CARD_BASELINE_BYTES_PER_SECOND,
                        F.NETWORK_CARD_PEAK_BYTES_PER_SECOND, F.INTERFACE_INFO, F.IMDS_REQUESTS_TOTAL,
                        F.IMDS_UP)

    def __init__(self, get_info: Callable[[], Optional[InstanceInfo]]) -> None:
        self._get_info = get_info

    def collect(self) -> Iterable[Metric]:
        info = self._get_info()
        if info is None:
            return
        ident = info.identity
        m = family(F.INSTANCE_INFO)
        labels = {
            "instance_id": ident.instance_id if ident else "",
            "instance_type": info.instance_type or "",
            "region": (ident.region or "") if ident else "",
            "availability_zone": (ident.availability_zone or "") if ident else "",
            "availability_zone_id": (ident.availability_zone_id or "") if ident else "",
            "on_ec2": "true" if info.on_ec2 else "false",
        }
        if info.node_name:  # only on Kubernetes (BURSTWATCH_NODE_NAME): elsewhere the series is unchanged
            labels["node"] = info.node_name
        m.add_metric([], labels)
        yield m

        src = info.sources
        d = family(F.INSTANCE_DISCOVERY_INFO)
        d.add_metric([], {"imds": src.get("imds", ""), "instance_type_source": src.get("instance_type", ""),
                          "type_data_source": src.get("type_entry", ""), "api": src.get("api", "")})
        yield d
        yield family(F.INSTANCE_DISCOVERY_DURATION_SECONDS, info.discovery_seconds)

        p = info.profile
        base = family(F.BANDWIDTH_BASELINE_BYTES_PER_SECOND)
        peak = family(F.BANDWIDTH_PEAK_BYTES_PER_SECOND)
        # The bucket in use and where it came from (config, learned, default) are the credit view's:
        # F.CREDIT_BUCKET_BYTES and F.CREDIT_BUCKET_INFO, since learning changes them.
        bursts = family(F.BANDWIDTH_BURSTABLE)
        for direction in DIRECTIONS:
            if p.baseline_bytes_per_second is not None:
                base.add_metric([direction, p.baseline_source], p.baseline_bytes_per_second)
            if p.peak_bytes_per_second is not None:
                peak.add_metric([direction, p.peak_source], p.peak_bytes_per_second)
            bursts.add_metric([direction], 1.0 if p.bursts else 0.0)
        yield base
        yield peak
        yield bursts

        cbase = family(F.NETWORK_CARD_BASELINE_BYTES_PER_SECOND)
        cpeak = family(F.NETWORK_CARD_PEAK_BYTES_PER_SECOND)
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

        # Only ENIs with an interface here: an ENI seen in IMDS but not in this network namespace has no
        # interface series to join, and one interface="" row per such ENI would make the join's one side
        # ambiguous (Prometheus refuses duplicate series on the group_left side).
        eni_info = family(F.INTERFACE_INFO)
        for eni in info.enis:
            name = info.eni_interfaces.get(eni.mac)
            if name is None:
                continue
            eni_info.add_metric([], {
                "interface": name, "eni_id": eni.interface_id or "",
                "device_index": "" if eni.device_number is None else str(eni.device_number),
                "network_card": str(eni.network_card_index), "mac": eni.mac})
        yield eni_info

        stats = info.imds_stats
        if stats is None:  # imds.enabled = false: no IMDS series at all
            return
        reqs = family(F.IMDS_REQUESTS_TOTAL)
        for (request, result), n in sorted(stats.snapshot().items()):
            reqs.add_metric([request, result], n)
        yield reqs
        if stats.up is not None:
            yield family(F.IMDS_UP, 1.0 if stats.up else 0.0)
