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


def _draining(text: str) -> str:
    """The captured exposition with `out` draining: 40 % left, empty in 312 s."""
    text = re.sub(r'(burstwatch_credit_remaining_ratio\{direction="out"\}) \S+', r"\1 0.4", text)
    text = re.sub(r'(burstwatch_credit_exhaustion_seconds\{direction="out"\}) \S+', r"\1 312.0", text)
    text = re.sub(r'(burstwatch_throughput_bytes_per_second\{direction="out"\}) \S+', r"\1 1.25e9", text)
    return text


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


def test_draining_bucket_bar_and_forecast() -> None:
    doc = build_status(parse_metrics(_draining(FIX.read_text())))
    text = render_text(doc)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("out"))
    assert "[" + "#" * 12 + "." * 18 + "]  40.0%" in line and "empty in 5m12s" in line
    assert "rate 10 Gbit/s" in text


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
