#!/usr/bin/env python3
"""Write packaging/grafana/burstwatch-dashboard.json (Grafana 9+ schema) from the panel list below."""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "packaging" / "grafana" / "burstwatch-dashboard.json"
SEL = 'instance=~"$instance"'


def panel(pid: int, title: str, targets: list[tuple[str, str]], unit: str, x: int, y: int, w: int = 12,
          h: int = 8, kind: str = "timeseries", desc: str = "", extra: dict | None = None) -> dict:
    p = {
        "id": pid, "type": kind, "title": title, "description": desc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, **(extra or {})}, "overrides": []},
        "targets": [{"refId": chr(65 + i), "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(targets)],
    }
    return p


def build() -> dict:
    panels = [
        panel(1, "Burst credit left", [(f"burstwatch_credit_remaining_ratio{{{SEL}}}", "{{instance}} {{direction}}")],
              "percentunit", 0, 0, desc="Estimated credit left as a share of the bucket, per direction.",
              extra={"min": 0, "max": 1}),
        panel(2, "Time to exhaustion: at the current rate and at the trend",
              [(f"clamp_max(burstwatch_credit_exhaustion_seconds{{{SEL}}}, 7200)", "{{instance}} {{direction}} now"),
               (f"clamp_max(burstwatch_credit_exhaustion_trend_seconds{{{SEL}}}, 7200)",
                "{{instance}} {{direction}} trend")],
              "s", 12, 0, desc="Forecasts at the current rate (now) and at the net rate over [credits] "
              "forecast_window (trend: bursts and pauses together, steady on bursty drains); capped at 2 h for "
              "display (+Inf = not draining). BurstCreditsRunningOut pages on the sooner of the two."),
        panel(3, "Rate against baseline and peak",
              [(f"8 * burstwatch_throughput_bytes_per_second{{{SEL}}}", "{{instance}} {{direction}} rate"),
               (f"8 * burstwatch_bandwidth_baseline_bytes_per_second{{{SEL}}}", "{{instance}} baseline"),
               (f"8 * burstwatch_bandwidth_peak_bytes_per_second{{{SEL}}}", "{{instance}} peak")],
              "bps", 0, 8, w=24, desc="Measured rate per direction with the size's baseline and peak."),
        panel(4, "Shaping (packets queued or dropped by the shaper)",
              [(f"rate(burstwatch_shaping_packets_total{{{SEL}}}[1m])", "{{instance}} {{direction}} {{source}}"),
               (f"rate(burstwatch_ena_allowance_exceeded_total{{{SEL}}}[1m])",
                "{{instance}} {{interface}} {{allowance}}")],
              "pps", 0, 16, desc="ENA allowance counters and the shaping signal the credit model uses."),
        panel(5, "Shaped at the baseline (bucket empty)",
              [(f"burstwatch_credit_exhausted{{{SEL}}}", "{{instance}} {{direction}}")],
              "bool", 12, 16, desc="1 while the shaper holds traffic at the baseline."),
        panel(6, "Bucket size in use", [(f"8 * burstwatch_credit_bucket_bytes{{{SEL}}} / 1e9",
                                         "{{instance}} {{direction}} Gbit")],
              "none", 0, 24, w=8, kind="stat"),
        panel(7, "Bucket corrections learned", [(f"burstwatch_credit_bucket_learned_total{{{SEL}}}",
                                                 "{{instance}} {{direction}}")],
              "none", 8, 24, w=8, kind="stat"),
        panel(8, "Failed checks", [(f'sum by (instance) (burstwatch_check_status{{{SEL},status="fail"}})',
                                    "{{instance}}")],
              "none", 16, 24, w=8, kind="stat"),
        panel(9, "Probe throughput", [(f"8 * burstwatch_probe_throughput_bytes_per_second{{{SEL}}}",
                                       "{{instance}} → {{peer}} {{direction}}")],
              "bps", 0, 32, w=24),
    ]
    return {
        "title": "burstwatch: EC2 network burst credits", "uid": "burstwatch", "schemaVersion": 38,
        "version": 1, "editable": True, "tags": ["burstwatch", "ec2", "network"],
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
            {"name": "instance", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(burstwatch_build_info, instance)", "refresh": 2, "multi": True,
             "includeAll": True, "label": "Instance"},
        ]},
        "panels": panels,
    }


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(build(), indent=1) + "\n")
