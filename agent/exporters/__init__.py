"""Exporters: Prometheus views over immutable readings (no I/O, no figures of their own) and the status text."""

from __future__ import annotations

from typing import Iterable, Mapping

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

NS = "burstwatch"


class View(Collector):
    """A prometheus_client collector over readings someone else computed. FAMILIES lists every metric
    family collect() may yield, as (name, type); describe() announces them, so the registry rejects a
    second view that would export a name already taken (client_python checks describe() at register
    time), and tests/exporters/test_views.py checks collect() never yields an undeclared family."""

    FAMILIES: tuple[tuple[str, str], ...] = ()

    def describe(self) -> Iterable[Metric]:
        return [Metric(name, "", typ) for name, typ in self.FAMILIES]


def counter_by(name: str, doc: str, label: str, counts: Mapping[str, float]) -> CounterMetricFamily:
    """A counter family with one series per key of `counts` under one label, in key order (the services
    keep such tallies as plain dicts: results, reasons, kinds)."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(counts.items()):
        family.add_metric([key], n)
    return family
