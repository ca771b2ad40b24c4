#!/usr/bin/env python3
"""Write the Grafana 9+ dashboards (schema 38) from the panel lists below:
packaging/grafana/burstwatch-dashboard.json (one instance at a time) and
packaging/grafana/burstwatch-fleet-dashboard.json (many instances at once, docs/fleet.md#dashboard)."""

from __future__ import annotations

import json
from pathlib import Path

GRAFANA = Path(__file__).resolve().parent.parent / "packaging" / "grafana"
OUT = GRAFANA / "burstwatch-dashboard.json"
FLEET_OUT = GRAFANA / "burstwatch-fleet-dashboard.json"
SEL = 'instance=~"$instance"'
# The fleet dashboard filters on both of Prometheus' scrape labels; "All" is ".*" (allValue below).
FSEL = 'job=~"$job",instance=~"$instance"'


def panel(pid: int, title: str, targets: list[tuple[str, str]], unit: str, x: int, y: int, w: int = 12,
          h: int = 8, kind: str = "timeseries", desc: str = "", extra: dict | None = None,
          options: dict | None = None, transformations: list[dict] | None = None, instant: bool = False) -> dict:
    p = {
        "id": pid, "type": kind, "title": title, "description": desc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, **(extra or {})}, "overrides": []},
        "targets": [{"refId": chr(65 + i), "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(targets)],
    }
    # Only set when asked, so the single-instance dashboard stays byte-identical.
    if instant:   # tables show the value now, one row per series
        for t in p["targets"]:
            t.update({"instant": True, "range": False, "format": "table"})
    if options is not None:
        p["options"] = options
    if transformations is not None:
        p["transformations"] = transformations
    return p


def build() -> dict:
    panels = [
        panel(1, "Burst credit left, with its band",
              [(f"burstwatch_credit_remaining_ratio{{{SEL}}}", "{{instance}} {{direction}}"),
               (f"burstwatch_credit_remaining_low_ratio{{{SEL}}}", "{{instance}} {{direction}} if the bucket is low"),
               (f"burstwatch_credit_remaining_high_ratio{{{SEL}}}",
                "{{instance}} {{direction}} if the bucket is high")],
              "percentunit", 0, 0, desc="Estimated credit left as a share of the bucket in use, per direction, "
              "and the same if the bucket is its low or high estimate (AWS publishes no size: docs/credits.md, "
              "\"The bucket as a band\"). BurstCreditsLow warns on the low side.",
              extra={"min": 0, "max": 1}),
        panel(2, "Time to exhaustion: at the current rate, at the trend, and the band",
              [(f"clamp_max(burstwatch_credit_exhaustion_seconds{{{SEL}}}, 7200)", "{{instance}} {{direction}} now"),
               (f"clamp_max(burstwatch_credit_exhaustion_trend_seconds{{{SEL}}}, 7200)",
                "{{instance}} {{direction}} trend"),
               (f"clamp_max(burstwatch_credit_exhaustion_earliest_seconds{{{SEL}}}, 7200)",
                "{{instance}} {{direction}} earliest"),
               (f"clamp_max(burstwatch_credit_exhaustion_latest_seconds{{{SEL}}}, 7200)",
                "{{instance}} {{direction}} latest")],
              "s", 12, 0, desc="Forecasts at the current rate (now) and at the net rate over [credits] "
              "forecast_window (trend: bursts and pauses together, steady on bursty drains), and the band "
              "around them (earliest: a bucket of the low estimate; latest: of the high one, +Inf while a pause "
              "of a cycle not yet seen may never end); capped at 2 h for display (+Inf = not draining). "
              "BurstCreditsRunningOut pages on the sooner of now and trend, or on earliest under 180 s while "
              "the bucket drains."),
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
        # The ENI behind each interface (burstwatch_interface_info), joined onto the per-interface rate so a
        # series names the ENI ID that VPC Flow Logs and ENI inventories use.
        panel(10, "Rate per ENI",
              [(f"8 * burstwatch_interface_throughput_bytes_per_second{{{SEL}}}"
                f" * on (instance, interface) group_left (eni_id, network_card) burstwatch_interface_info{{{SEL}}}",
                "{{instance}} {{interface}} {{eni_id}} {{direction}}")],
              "bps", 0, 40, w=12, desc="Per-interface rate with the interface's ENI ID and network card (IMDS)."),
        panel(11, "Interfaces and their ENIs", [(f"burstwatch_interface_info{{{SEL}}}", "")], "none", 12, 40,
              w=12, kind="table", desc="Each monitored interface's ENI ID, device index, network card and MAC.",
              instant=True, **_table("interface", False, {}, keep=("instance", "interface", "eni_id", "device_index",
                                                                  "network_card", "mac"))),
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


def _stat(pid: int, title: str, expr: str, x: int, desc: str, alarm: bool = True) -> dict:
    """A count that reads 0, not "No data", when nothing matches (`or vector(0)`); red from 1 up when
    `alarm`, else a plain figure."""
    steps = [{"color": "green", "value": None}, {"color": "red", "value": 1}] if alarm else \
        [{"color": "blue", "value": None}]
    return panel(pid, title, [(f"{expr} or vector(0)", "")], "none", x, 0, w=6, h=4, kind="stat", desc=desc,
                 extra={"thresholds": {"mode": "absolute", "steps": steps}},
                 options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "colorMode": "background", "graphMode": "none", "textMode": "value"},
                 instant=True)


def _table(sort_by: str, desc: bool, rename: dict[str, str], merge: bool = False,
           keep: tuple[str, ...] = ()) -> dict:
    transformations = [{"id": "merge", "options": {}}] if merge else []
    if keep:   # only these columns, in this order
        transformations.append({"id": "filterFieldsByName", "options": {"include": {"names": list(keep)}}})
    transformations.append({"id": "organize", "options": {"excludeByName": {"Time": True},
                                                           "renameByName": rename}})
    return {"options": {"showHeader": True, "sortBy": [{"displayName": sort_by, "desc": desc}]},
            "transformations": transformations}


# The bucket in use per instance and direction with where it came from (burstwatch_credit_bucket_info's
# source: config, learned, fleet, default...) and the instance's type (burstwatch_instance_info), in Gbit.
BUCKET_BY_TYPE = (f"8 * burstwatch_credit_bucket_bytes{{{FSEL}}} / 1e9"
                  f" * on (job, instance, direction) group_left (source) burstwatch_credit_bucket_info{{{FSEL}}}"
                  f" * on (job, instance) group_left (instance_type) burstwatch_instance_info{{{FSEL}}}")


def _matrix(pid: int, title: str, expr: str, unit: str, x: int, y: int, desc: str) -> dict:
    """Source instance (rows) x peer (columns), the probe's figure in each cell."""
    return panel(pid, title, [(expr, "")], unit, x, y, w=12, h=8, kind="table", desc=desc, instant=True,
                 options={"showHeader": True},
                 transformations=[{"id": "groupingToMatrix", "options": {
                     "rowField": "instance", "columnField": "peer", "valueField": "Value"}}])


def build_fleet() -> dict:
    soonest = (f'sort(min by (job, instance, direction) ('
               f'{{__name__=~"burstwatch_credit_exhaustion_seconds|burstwatch_credit_exhaustion_trend_seconds",'
               f'{FSEL}}}))')
    panels = [
        _stat(1, "Instances reporting", f"count(burstwatch_build_info{{{FSEL}}})", 0,
              "burstwatch agents Prometheus scrapes (job and instance filters applied).", alarm=False),
        _stat(2, "Shaped at the baseline now",
              f"count(max by (job, instance) (burstwatch_credit_exhausted{{{FSEL}}}) == 1)", 6,
              "Instances whose shaper holds a direction at the baseline: the bucket is empty "
              "(burstwatch_credit_exhausted, confirmed by the shaping signal)."),
        _stat(3, "Instances with a failed check",
              f'count(max by (job, instance) (burstwatch_check_status{{{FSEL},status="fail"}}) == 1)', 12,
              "Instances where at least one check's verdict is fail (`burstwatch check` there says why)."),
        _stat(4, "Instances on the fleet's bucket",
              f'count(count by (job, instance) (burstwatch_credit_bucket_info{{{FSEL},source="fleet"}}))', 18,
              "Instances whose bucket in use is the fleet consensus (nothing configured or learned locally): "
              "docs/fleet.md.", alarm=False),
        panel(5, "Soonest exhaustion first", [(soonest, "")], "s", 0, 4, w=12, h=10, kind="table",
              desc="Per instance and direction, the sooner of the two forecasts: at the current rate "
              "(burstwatch_credit_exhaustion_seconds) and at the net rate over [credits] forecast_window "
              "(burstwatch_credit_exhaustion_trend_seconds). 0 = exhausted now, Inf = not draining.",
              instant=True, **_table("exhaustion in", False, {"Value": "exhaustion in"})),
        panel(6, "Bucket per instance type (median, Gbit)",
              [(f"quantile by (instance_type, direction, source) (0.5, {BUCKET_BY_TYPE})", ""),
               (f"count by (instance_type, direction, source) ({BUCKET_BY_TYPE})", "")],
              "none", 12, 4, w=12, h=10, kind="table",
              desc="The bucket in use, per instance type, direction and source: config, learned (this "
              "instance measured an exhaustion), fleet (the consensus of other instances of the type), "
              "default (baseline x 3600 s; a guess). Median over the instances, and how many.",
              instant=True, **_table("instance_type", False, {"Value #A": "median Gbit", "Value #B": "instances"},
                                     merge=True)),
        panel(7, "Failed checks by check",
              [(f'sort_desc(sum by (check) (max by (job, instance, check) '
                f'(burstwatch_check_status{{{FSEL},status="fail"}})))', "")],
              "none", 0, 14, w=8, h=8, kind="table",
              desc="Instances where each check fails (0 for checks that pass everywhere).",
              instant=True, **_table("instances failing", True, {"Value": "instances failing"})),
        panel(8, "Credit left, 10 lowest", [(f"bottomk(10, burstwatch_credit_remaining_ratio{{{FSEL}}})",
                                             "{{instance}} {{direction}}")],
              "percentunit", 8, 14, w=16, h=8, desc="The ten instance-directions with the least burst credit "
              "left, as a share of their bucket.", extra={"min": 0, "max": 1}),
        _matrix(9, "Probe throughput, source → peer (source sends)",
                f'8 * max by (job, instance, peer) (burstwatch_probe_throughput_bytes_per_second{{{FSEL},'
                f'direction="out"}})', "bps", 0, 22,
                "The last probe's rate from each instance (rows, the scrape target) to each peer (columns, the "
                "peer's responder host:port)."),
        _matrix(10, "Probe throughput, peer → source (peer sends, -R)",
                f'8 * max by (job, instance, peer) (burstwatch_probe_throughput_bytes_per_second{{{FSEL},'
                f'direction="in"}})', "bps", 12, 22,
                "The last reverse probe's rate: the peer (columns) sending to the instance (rows)."),
        panel(11, "Probe throughput ÷ expected", [(f"burstwatch_probe_throughput_ratio{{{FSEL}}}",
                                                   "{{instance}} → {{peer}} {{direction}}")],
              "percentunit", 0, 30, w=24, desc="Below 1: the pair got less than the lower of the two "
              "allowances (docs/metrics.md, burstwatch_probe_expected_bytes_per_second)."),
    ]
    scope = {"type": "prometheus", "uid": "${datasource}"}
    return {
        "title": "burstwatch: fleet", "uid": "burstwatch-fleet", "schemaVersion": 38,
        "version": 1, "editable": True, "tags": ["burstwatch", "ec2", "network", "fleet"],
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
            {"name": "job", "type": "query", "datasource": scope,
             "query": "label_values(burstwatch_build_info, job)", "refresh": 2, "multi": True,
             "includeAll": True, "allValue": ".*", "label": "Job"},
            {"name": "instance", "type": "query", "datasource": scope,
             "query": 'label_values(burstwatch_build_info{job=~"$job"}, instance)', "refresh": 2, "multi": True,
             "includeAll": True, "allValue": ".*", "label": "Instance"},
        ]},
        "panels": panels,
    }


def write() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    for path, dashboard in ((OUT, build()), (FLEET_OUT, build_fleet())):
        path.write_text(json.dumps(dashboard, indent=1) + "\n")


if __name__ == "__main__":
    write()
