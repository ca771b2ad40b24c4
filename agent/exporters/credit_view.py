"""Prometheus view of the credit estimate: the contract's burstwatch_credit_* gauges and the shaping signal."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.exporters import NS, View
from agent.sampling.pipeline import Snapshot


class CreditView(View):
    """Renders the credit model's readings and the shaping totals of the latest snapshot; computes nothing."""

    FAMILIES = (
        ("burstwatch_credit_model_info", "gauge"),
        ("burstwatch_credit_remaining_bytes", "gauge"),
        ("burstwatch_credit_remaining_ratio", "gauge"),
        ("burstwatch_credit_bucket_bytes", "gauge"),
        ("burstwatch_credit_exhaustion_seconds", "gauge"),
        ("burstwatch_credit_refill_seconds", "gauge"),
        ("burstwatch_credit_shaped", "gauge"),
        ("burstwatch_credit_exhausted", "gauge"),
        ("burstwatch_credit_exhaustion_trend_seconds", "gauge"),
        ("burstwatch_credit_refill_trend_seconds", "gauge"),
        ("burstwatch_credit_bucket_learned", "counter"),
        ("burstwatch_credit_bucket_info", "gauge"),
        ("burstwatch_shaping_packets", "counter"),
    )

    def __init__(self, latest: Callable[[], Optional[Snapshot]], shaping_source: Callable[[], Optional[str]],
                 restore_note: Callable[[], str]) -> None:
        self._latest = latest
        self._shaping_source = shaping_source
        self._restore_note = restore_note

    def collect(self) -> Iterable[Metric]:
        snap = self._latest()
        if snap is None:
            return
        credits = snap.credits or {}
        state = "unknown_profile"
        if credits:
            state = "estimating" if any(r.bucket_bytes for r in credits.values()) else "never_exhausts"
        info = GaugeMetricFamily(f"{NS}_credit_model_info", "What the credit model is doing: estimating, "
                                 "never_exhausts (baseline = peak: no bucket) or unknown_profile; how its state "
                                 "started (fresh, restored, new_boot).", labels=["state", "start"])
        info.add_metric([state, self._restore_note()], 1)
        yield info

        g = {
            "remaining": GaugeMetricFamily(f"{NS}_credit_remaining_bytes", "Estimated burst credit left in "
                                           "the bucket.", labels=["direction"]),
            "ratio": GaugeMetricFamily(f"{NS}_credit_remaining_ratio", "Credit left as a fraction of the "
                                       "bucket (0..1).", labels=["direction"]),
            "bucket": GaugeMetricFamily(f"{NS}_credit_bucket_bytes", "Bucket size in use (configured, "
                                        "default or learned).", labels=["direction"]),
            "exhaustion": GaugeMetricFamily(f"{NS}_credit_exhaustion_seconds", "Forecast seconds until the "
                                            "bucket is empty at the current rate; +Inf when not draining.",
                                            labels=["direction"]),
            "refill": GaugeMetricFamily(f"{NS}_credit_refill_seconds", "Forecast seconds until the bucket "
                                        "is full at the current rate; +Inf when not refilling.",
                                        labels=["direction"]),
            "shaped": GaugeMetricFamily(f"{NS}_credit_shaped", "1 when the shaping signal rose during the last "
                                        "sample.", labels=["direction"]),
            "exhausted": GaugeMetricFamily(f"{NS}_credit_exhausted", "1 while the shaper holds traffic at the "
                                           "baseline (bucket empty, confirmed by the shaping signal).",
                                           labels=["direction"]),
            "exhaustion_trend": GaugeMetricFamily(f"{NS}_credit_exhaustion_trend_seconds", "Forecast seconds "
                                                  "until the bucket is empty at the net spend rate over the "
                                                  "last forecast_window (bursts and pauses together); +Inf "
                                                  "when not draining.", labels=["direction"]),
            "refill_trend": GaugeMetricFamily(f"{NS}_credit_refill_trend_seconds", "Forecast seconds until "
                                              "the bucket is full at the net rate over the last "
                                              "forecast_window; +Inf when not refilling.",
                                              labels=["direction"]),
        }
        learned = CounterMetricFamily(f"{NS}_credit_bucket_learned", "Times the bucket size was corrected "
                                      "from observed shaping.", labels=["direction"])
        binfo = GaugeMetricFamily(f"{NS}_credit_bucket_info", "Where the bucket size in use came from and "
                                  "how it was last learned.", labels=["direction", "source", "method"])
        for d, r in sorted(credits.items()):
            if r.bucket_bytes is not None and r.remaining_bytes is not None:
                g["remaining"].add_metric([d], r.remaining_bytes)
                g["ratio"].add_metric([d], r.ratio if r.ratio is not None else math.nan)
                g["bucket"].add_metric([d], r.bucket_bytes)
                g["refill"].add_metric([d], r.refill_seconds)
                g["exhausted"].add_metric([d], 1.0 if r.exhausted else 0.0)
                g["refill_trend"].add_metric([d], r.refill_trend_seconds)
                learned.add_metric([d], r.learned_count)
                binfo.add_metric([d, r.bucket_source, r.learn_method], 1)
            g["exhaustion"].add_metric([d], r.exhaustion_seconds)
            g["exhaustion_trend"].add_metric([d], r.exhaustion_trend_seconds)
            g["shaped"].add_metric([d], 1.0 if r.shaped else 0.0)
        yield from g.values()
        yield learned
        yield binfo

        shaping = CounterMetricFamily(f"{NS}_shaping_packets", "Packets the shaper queued or dropped "
                                      "(ENA bw_*_allowance_exceeded summed over interfaces, or tc overlimits), "
                                      "accounted across counter resets.", labels=["direction", "source"])
        if snap.shaping is not None:
            for d, v in sorted(snap.shaping.total.items()):
                shaping.add_metric([d, snap.shaping.source], v)
        yield shaping
