"""The Prometheus view of the credit estimate: the contract names unchanged, the trend forecasts beside them."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.exporters.credit_view import CreditView
from agent.models.credit_model import CreditEstimator, CreditReading
from agent.models.shaping import ShapingReading
from agent.sampling.pipeline import Snapshot

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "metrics" / "make-run-off-ec2.prom"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
BUCKET = 3.375e11                                   # m5.large's default: 2700 Gbit


def snapshot(credits: Optional[dict[str, CreditReading]], shaping: Optional[ShapingReading] = None) -> Snapshot:
    return Snapshot(1.7e9, ("eth0",), {}, {}, {}, None, {}, 0.001, 1, {}, shaping=shaping, credits=credits)


def exposition(snap: Snapshot) -> str:
    reg = CollectorRegistry()
    reg.register(CreditView(lambda: snap, lambda: None, lambda: "restored"))  # type: ignore[arg-type]
    return generate_latest(reg).decode()


def full(d: str) -> CreditReading:
    """What the model reads for a full, idle bucket (the captured `make run` state)."""
    return CreditEstimator(0.75e9 / 8, BUCKET).update(1.0, {d: 0.0}, {d: 0.0}, {d: 0})[d]


def test_existing_series_are_byte_identical_to_the_captured_exposition() -> None:
    text = exposition(snapshot({d: full(d) for d in ("in", "out")}))
    captured = FIX.read_text()
    # the band's families came after the capture (issue 28)
    band = ("_low_", "_high_", "_observations", "_contradictions", "_band_info", "_earliest_", "_latest_", "_draining")
    old = [ln for ln in text.splitlines() if "_trend_seconds" not in ln and "shaping_packets" not in ln
           and not any(b in ln for b in band)]
    for line in old:
        assert line in captured.splitlines(), line
    assert 'burstwatch_credit_exhaustion_trend_seconds{direction="out"} +Inf' in text
    assert 'burstwatch_credit_refill_trend_seconds{direction="in"} 0.0' in text
    # and the captured file carries them the same way (it was extended with the new series only)
    for line in text.splitlines():
        if "_trend_seconds" in line:
            assert line in captured.splitlines(), line


def test_trend_forecasts_follow_the_reading() -> None:
    r = CreditReading("out", 1e9, 1e11, BUCKET, 1e11 / BUCKET, math.inf, math.inf, True, False, 0, "none",
                      "default", 312.0, math.inf)
    text = exposition(snapshot({"out": r}))
    assert 'burstwatch_credit_exhaustion_seconds{direction="out"} +Inf' in text
    assert 'burstwatch_credit_exhaustion_trend_seconds{direction="out"} 312.0' in text
    assert 'burstwatch_credit_refill_trend_seconds{direction="out"} +Inf' in text


def test_no_bucket_keeps_only_the_forecasts_that_never_run_out() -> None:
    never = {d: CreditEstimator(0.75e9 / 8, None).update(1.0, {d: 1e9}, {d: 1e9}, None)[d] for d in ("in", "out")}
    text = exposition(snapshot(never))
    assert 'burstwatch_credit_exhaustion_trend_seconds{direction="in"} +Inf' in text
    assert "burstwatch_credit_refill_trend_seconds{" not in text
    assert "burstwatch_credit_remaining_bytes{" not in text


def test_every_credit_series_is_documented_and_lints() -> None:
    r = full("out")
    text = exposition(snapshot({"out": r}, ShapingReading("tc", {"out": 3}, {"out": 7})))
    docs = DOCS.read_text()
    names = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    missing = sorted(n for n in names if f"`{n}`" not in docs and f"`{n}_total`" not in docs)
    assert not missing, missing
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: `make test-deps` installs Debian's prometheus package")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_view_declares_every_family_it_yields_the_trend_gauges_too() -> None:
    view = CreditView(lambda: snapshot({d: full(d) for d in ("in", "out")},  # type: ignore[arg-type,return-value]
                                       ShapingReading("tc", {"out": 3}, {"out": 7})),
                      lambda: "tc", lambda: "fresh")
    declared = {(m.name, m.type) for m in view.describe()}
    collected = {(m.name, m.type) for m in view.collect()}
    assert collected <= declared, collected - declared
    assert {("burstwatch_credit_exhaustion_trend_seconds", "gauge"),
            ("burstwatch_credit_refill_trend_seconds", "gauge")} <= collected
    reg = CollectorRegistry()
    reg.register(view)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        reg.register(CreditView(lambda: None, lambda: None, lambda: "fresh"))
