"""Exporters: Prometheus views over immutable readings (no I/O, no figures of their own) and the status text."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.models.figures import Figure

_FAMILY = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "info": InfoMetricFamily}


class View(Collector):
    """A prometheus_client collector over readings someone else computed. FAMILIES lists every metric
    family collect() may yield, as (name, type) (`declared(...)` of its figures); describe() announces
    them, so the registry rejects a second view that would export a name already taken (client_python
    checks describe() at register time), and tests/exporters/test_views.py checks collect() never yields
    an undeclared family."""

    FAMILIES: tuple[tuple[str, str], ...] = ()

    def describe(self) -> Iterable[Metric]:
        return [Metric(name, "", typ) for name, typ in self.FAMILIES]


def declared(*figures: Figure) -> tuple[tuple[str, str], ...]:
    """A view's FAMILIES from the entries of agent/models/figures/ it renders."""
    return tuple((f.family, f.type) for f in figures)


def family(fig: Figure, value: Optional[float] = None) -> Any:
    """The figure's family with the table's name, help and labels: empty (samples are added by the view),
    or, for a figure without labels, with its one `value`. Info families take their labels per sample.
    Typed Any: a Gauge-, Counter- or InfoMetricFamily (all Metric, with add_metric), by the figure's type."""
    cls = _FAMILY[fig.type]
    if value is not None:
        return cls(fig.family, fig.help, value=value)  # type: ignore[call-arg,arg-type]
    if fig.type == "info":
        return cls(fig.family, fig.help)
    return cls(fig.family, fig.help, labels=list(fig.labels))  # type: ignore[call-arg]


def counter_by(fig: Figure, counts: Mapping[str, float]) -> Any:
    """A counter with one series per key of `counts` under its one label, in key order (the services keep
    such tallies as plain dicts: results, reasons, kinds)."""
    fam = family(fig)
    for key, n in sorted(counts.items()):
        fam.add_metric([key], n)
    return fam
