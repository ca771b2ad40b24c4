"""`burstwatch status` from a captured /metrics: the text a person reads and the JSON a script reads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from agent.exporters.status import build_status, json_safe, render_text
from agent.readers.daemon_metrics import metrics_url, parse_metrics
from tests.conftest import ROOT, free_port

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "metrics" / "make-run-off-ec2.prom"


def _set(text: str, name: str, direction: str, value: str) -> str:
    """One series of the captured exposition set to `value` (it must be there)."""
    text, n = re.subn(rf'({name}\{{direction="{direction}"\}}) \S+', rf"\g<1> {value}", text)
    assert n == 1, name
    return text


def _draining(text: str, trend: str = "290.0") -> str:
    """The captured exposition with `out` draining: 40 % left, empty in 312 s (trend: 290 s)."""
    text = _set(text, "burstwatch_credit_remaining_ratio", "out", "0.4")
    text = _set(text, "burstwatch_credit_exhaustion_seconds", "out", "312.0")
    text = _set(text, "burstwatch_credit_exhaustion_trend_seconds", "out", trend)
    text = _set(text, "burstwatch_credit_refill_seconds", "out", "+Inf")
    text = _set(text, "burstwatch_credit_refill_trend_seconds", "out", "+Inf")
    text = _set(text, "burstwatch_throughput_bytes_per_second", "out", "1.25e9")
    return text


def _out_line(text: str) -> str:
    doc = build_status(parse_metrics(text))
    return next(ln for ln in render_text(doc).splitlines() if ln.strip().startswith("out"))


def test_full_buckets_off_ec2() -> None:
    doc = build_status(parse_metrics(FIX.read_text()))
    assert doc["instance"]["on_ec2"] == "false" and doc["instance"]["instance_type"] == "m5.large"
    out = doc["directions"]["out"]
    assert out["remaining_ratio"] == 1.0 and out["bucket_source"] == "default"
    assert out["baseline_bytes_per_second"] == 0.75e9 / 8 and out["baseline_source"] == "catalogue"
    text = render_text(doc)
    assert "off EC2  type m5.large" in text
    assert "[" + "#" * 30 + "] 100.0% of 2700 Gbit (default)  full" in text
    assert "baseline 0.75 Gbit/s [catalogue], peak 10 Gbit/s [catalogue]" in text
    assert "fail driver eth0" in text


def test_draining_bucket_bar_and_both_forecasts() -> None:
    doc = build_status(parse_metrics(_draining(FIX.read_text())))
    text = render_text(doc)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("out"))
    assert "[" + "#" * 12 + "." * 18 + "]  40.0%" in line and line.endswith("empty in 5m12s (trend 4m50s)")
    assert "rate 10 Gbit/s" in text
    out = doc["directions"]["out"]
    assert (out["exhaustion_seconds"], out["exhaustion_trend_seconds"]) == (312.0, 290.0)
    assert _out_line(_draining(FIX.read_text(), trend="+Inf")).endswith("empty in 5m12s (trend never)")


def test_a_bursty_drain_in_a_pause_shows_the_trend() -> None:
    """In a pause of a bursty drain the instant forecast is +Inf; the trend still says when."""
    text = _set(_draining(FIX.read_text()), "burstwatch_credit_exhaustion_seconds", "out", "+Inf")
    assert _out_line(text).endswith("empty in 4m50s at the trend (not draining now)")
    doc = json_safe(build_status(parse_metrics(text)))
    assert doc["directions"]["out"]["exhaustion_seconds"] is None
    assert doc["directions"]["out"]["exhaustion_trend_seconds"] == 290.0


def test_refilling_shows_both_forecasts() -> None:
    text = _set(FIX.read_text(), "burstwatch_credit_remaining_ratio", "out", "0.5")
    text = _set(text, "burstwatch_credit_refill_seconds", "out", "90.0")
    text = _set(text, "burstwatch_credit_refill_trend_seconds", "out", "125.0")
    assert _out_line(text).endswith("full in 1m30s (trend 2m05s)")
    text = _set(text, "burstwatch_credit_refill_seconds", "out", "+Inf")
    assert _out_line(text).endswith("full in 2m05s at the trend (not refilling now)")


def test_a_daemon_without_the_trend_metrics() -> None:
    """An older daemon's /metrics: the instant forecast alone, as before."""
    text = "\n".join(ln for ln in _draining(FIX.read_text()).splitlines() if "_trend_seconds" not in ln) + "\n"
    assert _out_line(text).endswith("empty in 5m12s")
    assert build_status(parse_metrics(text))["directions"]["out"]["exhaustion_trend_seconds"] is None


def test_json_has_no_infinity() -> None:
    doc = json_safe(build_status(parse_metrics(FIX.read_text())))
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text)["directions"]["in"]["exhaustion_seconds"] is None   # +Inf: never


def test_metrics_url_from_listen() -> None:
    assert metrics_url("0.0.0.0:9786") == "http://127.0.0.1:9786/metrics"
    assert metrics_url("[::]:9786") == "http://[::1]:9786/metrics"
    assert metrics_url("10.0.0.5:9100") == "http://10.0.0.5:9100/metrics"


def test_cli_when_the_daemon_is_down() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    out = subprocess.run([sys.executable, "-m", "agent", "status", "--url", url], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert f"the daemon does not answer at {url}" in out.stderr


def test_responder_serving_and_refusals() -> None:
    text = FIX.read_text() + "\n".join([
        "# HELP burstwatch_responder_served_last_hour_bytes Test payload bytes served in the last sliding hour.",
        "# TYPE burstwatch_responder_served_last_hour_bytes gauge",
        'burstwatch_responder_served_last_hour_bytes{direction="in"} 2.5e+09',
        'burstwatch_responder_served_last_hour_bytes{direction="out"} 7.0e+08',
        "# HELP burstwatch_responder_hourly_budget_bytes Most bytes served per direction in any sliding hour.",
        "# TYPE burstwatch_responder_hourly_budget_bytes gauge",
        "burstwatch_responder_hourly_budget_bytes 1e+10",
        "",
    ])
    text = re.sub(r'(burstwatch_responder_refused_total\{reason="busy"\}) \S+', r"\1 3.0", text)
    text = text.replace('burstwatch_responder_refused_total{reason="busy"} 3.0',
                        'burstwatch_responder_refused_total{reason="busy"} 3.0\n'
                        'burstwatch_responder_refused_total{reason="credit_floor"} 2.0\n'
                        'burstwatch_responder_refused_total{reason="budget"} 1.0')
    doc = build_status(parse_metrics(text))
    r = doc["responder"]
    assert r["listening"] and r["served_last_hour_bytes"] == {"in": 2.5e9, "out": 7e8}
    assert r["hourly_budget_bytes"] == 1e10
    assert r["refused"]["credit_floor"] == 2 and r["refused"]["budget"] == 1 and r["refused"]["busy"] == 3
    line = next(ln for ln in render_text(doc).splitlines() if ln.strip().startswith("responder"))
    assert line == ("  responder listening: served in the last hour in 2.5 GB, out 700 MB (budget 10 GB each); "
                    "refused budget 1, busy 3, credit_floor 2")
    assert json.loads(json.dumps(json_safe(doc)))["responder"]["refused"]["credit_floor"] == 2


def test_no_responder_no_line() -> None:
    text = "\n".join(ln for ln in FIX.read_text().splitlines() if "burstwatch_responder_" not in ln) + "\n"
    doc = build_status(parse_metrics(text))
    assert doc["responder"] is None
    assert "responder" not in render_text(doc)


FLEET_SERIES = """
burstwatch_fleet_consensus_instances 7.0
burstwatch_fleet_consensus_bucket_bytes 3.375e+11
burstwatch_fleet_published_total 2.0
burstwatch_fleet_backlog_objects 1.0
"""


def test_fleet_consensus_line_and_json() -> None:
    doc = build_status(parse_metrics(FIX.read_text() + FLEET_SERIES))
    assert doc["fleet"] == {"consensus_instances": 7, "consensus_bucket_bytes": 3.375e11,
                            "published_total": 2.0, "backlog_objects": 1.0}
    assert "  fleet: 2700 Gbit from 7 instances; published 2, waiting 1" in render_text(doc).splitlines()


def test_fleet_without_consensus_and_without_fleet() -> None:
    text = FIX.read_text() + "burstwatch_fleet_consensus_instances 0.0\n"
    assert "  fleet: no consensus yet; published 0, waiting 0" in render_text(build_status(parse_metrics(text)))
    doc = build_status(parse_metrics(FIX.read_text()))
    assert doc["fleet"] is None and "fleet:" not in render_text(doc)


def test_the_band_from_the_model_through_metrics_to_status() -> None:
    """A drain at 5 Gbit/s on an m5.large's default bucket, read by the model, rendered by the credit view,
    parsed by status: the forecast band and the bucket's band with their source, in the text and the JSON."""
    from agent.models.credit_model import CreditEstimator
    from tests.exporters.test_credit_view import exposition, snapshot

    est = CreditEstimator(0.75e9 / 8, 3.375e11)
    for _ in range(60):
        readings = est.update(1.0, {"out": 5e9 / 8, "in": 0.0}, {"out": 5e9 / 8, "in": 0.0}, {"out": 0, "in": 0})
    credit = exposition(snapshot(readings))
    kept = [ln for ln in FIX.read_text().splitlines()
            if "burstwatch_credit_" not in ln and "burstwatch_throughput_bytes" not in ln]
    text = "\n".join(kept) + "\n" + credit
    doc = build_status(parse_metrics(text))
    out = doc["directions"]["out"]
    r = readings["out"]
    assert out["exhaustion_earliest_seconds"] == r.exhaustion_earliest_seconds
    assert out["bucket_low_bytes"] == 0.2 * 3.375e11 and out["bucket_high_bytes"] == 3.0 * 3.375e11
    assert out["bucket_band_source"] == "default" and out["remaining_low_ratio"] == r.remaining_low_ratio
    lines = render_text(doc).splitlines()
    band = lines[lines.index(next(ln for ln in lines if ln.strip().startswith("out"))) + 2].strip()
    early = int(r.exhaustion_earliest_seconds)
    assert band.startswith(f"runs out in {early // 60}m{early % 60:02d}s\u2013"), band
    assert band.endswith("bucket 540 Gbit\u20138.1 Tbit (default)"), band
    assert json.loads(json.dumps(json_safe(doc)))["directions"]["out"]["exhaustion_latest_seconds"] == \
        r.exhaustion_latest_seconds > r.exhaustion_earliest_seconds
