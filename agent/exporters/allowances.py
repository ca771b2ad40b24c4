"""Prometheus view of the PPS and conntrack allowances: the models' readings in the latest snapshot; no I/O."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from prometheus_client.core import Metric

from agent.exporters import View, declared, family
from agent.models import figures as F
from agent.sampling.allowances import AllowanceReading


class AllowancesView(View):
    """Renders the allowances step's reading (agent/sampling/allowances.py); nothing before its first one."""

    FAMILIES = declared(F.CONNTRACK_SIZE_ENTRIES, F.CONNTRACK_AVAILABLE_ENTRIES, F.CONNTRACK_IN_USE_RATIO,
                        F.CONNTRACK_FULL_SECONDS, F.CONNTRACK_RUNNING_OUT, F.CONNTRACK_EXCEEDED_PACKETS_TOTAL,
                        F.CONNTRACK_SIZE_LEARNED_TOTAL, F.CONNTRACK_HOST_FLOWS, F.CONNTRACK_OWNER_FLOWS,
                        F.PPS_PACKETS_PER_SECOND, F.PPS_CEILING_PACKETS_PER_SECOND, F.PPS_HEADROOM_RATIO,
                        F.PPS_NEAR_CEILING, F.PPS_EXCEEDED_PACKETS_TOTAL, F.PPS_CEILING_LEARNED_TOTAL)

    def __init__(self, reading: Callable[[], Optional[AllowanceReading]]) -> None:
        self._reading = reading

    def collect(self) -> Iterable[Metric]:
        r = self._reading()
        if r is None:
            return
        yield from self._conntrack(r)
        yield from self._pps(r)

    @staticmethod
    def _conntrack(r: AllowanceReading) -> Iterable[Metric]:
        c = r.conntrack
        if c is not None:
            if c.size is not None:
                size = family(F.CONNTRACK_SIZE_ENTRIES)
                size.add_metric([c.size_method], c.size)
                yield size
            if c.available is not None:
                yield family(F.CONNTRACK_AVAILABLE_ENTRIES, float(c.available))
                if c.in_use_ratio is not None:
                    yield family(F.CONNTRACK_IN_USE_RATIO, c.in_use_ratio)
                yield family(F.CONNTRACK_FULL_SECONDS, c.full_seconds)
                yield family(F.CONNTRACK_RUNNING_OUT, 1.0 if r.running_out else 0.0)
            yield family(F.CONNTRACK_EXCEEDED_PACKETS_TOTAL, float(c.exceeded_total))
            yield family(F.CONNTRACK_SIZE_LEARNED_TOTAL, float(c.learned_count))
        if r.flow_count is not None:
            yield family(F.CONNTRACK_HOST_FLOWS, float(r.flow_count))
            owners = family(F.CONNTRACK_OWNER_FLOWS)
            for o in r.owners:
                owners.add_metric([o.protocol, o.direction, str(o.port)], float(o.count))
            yield owners

    @staticmethod
    def _pps(r: AllowanceReading) -> Iterable[Metric]:
        p = r.pps
        if p is None:
            return
        yield family(F.PPS_PACKETS_PER_SECOND, p.pps)
        if p.ceiling is not None:
            ceiling = family(F.PPS_CEILING_PACKETS_PER_SECOND)
            ceiling.add_metric([p.source], p.ceiling)
            yield ceiling
            if p.headroom_ratio is not None:
                yield family(F.PPS_HEADROOM_RATIO, p.headroom_ratio)
            yield family(F.PPS_NEAR_CEILING, 1.0 if r.near_ceiling else 0.0)
        yield family(F.PPS_EXCEEDED_PACKETS_TOTAL, float(p.exceeded_total))
        yield family(F.PPS_CEILING_LEARNED_TOTAL, float(p.learned_count))
