"""`burstwatch replay --openmetrics` backfilled with the real promtool, queried through a real Prometheus, and
the shipped rules evaluated over it at 15-s steps agree with the summary's pages and, step by step, with their
Python form (agent/models/replay.py running_out, credits_low) that the summary and the band's zoo count with."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import pytest

from agent.cli import main
from agent.commands.replay import TypeRun
from agent.config import Config
from agent.exporters.credit_view import CreditView
from agent.models.credit_model import CreditReading
from agent.models.replay import credits_low, running_out
from agent.readers.trace import read_trace
from tests.support import prom_backfill as pb
from tests.support.replay_traces import GBIT, Phase, Trace, TrueBucket, steady, write_trace

pytestmark = [pytest.mark.slow]

PYTHON_FORM: dict[str, Callable[[CreditReading], bool]] = {
    "BurstCreditsRunningOut": running_out, "BurstCreditsLow": credits_low}


def _readings(csv: Path, instance_type: str) -> list[tuple[float, CreditReading]]:
    """The out direction's reading after every row, as the replay computed it."""
    run = TypeRun(instance_type, Config(), None)
    return [(row.t, run.feed(row)["out"]) for row in read_trace(str(csv))]


def _holds_at(readings: list[tuple[float, CreditReading]], t: float,
              form: Callable[[CreditReading], bool]) -> bool:
    """The Python form on the newest sample at or before `t` (what an instant query sees)."""
    latest = [r for ts, r in readings if ts <= t + 1e-9]
    return bool(latest) and form(latest[-1])


# r4.large (0.75 / 10 Gbit/s, a believed bucket of 2700 Gbit): a drain at 4 Gbit/s on the believed bucket, where
# the band's early side holds from the drain's first seconds; and at 2 Gbit/s on a bucket of 0.4x the belief,
# where it comes under its 180 s some 250 s into the drain and decides the page (the point forecasts stay over
# 600 s until the bucket is empty).
@pytest.mark.parametrize(("bucket_gbit", "drain_gbps"), [(2700.0, 4.0), (1080.0, 2.0)],
                         ids=["believed", "0.4x-believed"])
def test_backfilled_replay_serves_every_credit_family_and_the_rules_page_as_the_summary_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bucket_gbit: float, drain_gbps: float) -> None:
    pb.require_prometheus()
    trace = Trace(TrueBucket(0.75 * GBIT, 10 * GBIT, bucket_gbit * GBIT),
                  [Phase("idle", steady(0.1 * GBIT), 600), Phase("drain", steady(drain_gbps * GBIT), 1500, drain=True),
                   Phase("rest", steady(0.1 * GBIT), 1200)])
    csv = write_trace(tmp_path / "t.csv", trace)
    om = tmp_path / "t.om"
    assert main(["replay", str(csv), "--type", "r4.large", "--openmetrics", str(om), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["types"][0]["directions"]["out"]
    readings = _readings(csv, "r4.large")
    text = om.read_text()
    assert text.endswith("# EOF\n")
    out = pb.backfill(om, tmp_path / "data")
    assert "NUM SERIES" in out
    prom = pb.Prometheus(tmp_path / "data")
    try:
        start, end = trace.drains[0].start - 600 + 1, trace.drains[0].stop + 1200
        # every family the credit view declares is there, under its /metrics name, with its labels
        names = {n + "_total" if kind == "counter" else n for n, kind in CreditView.FAMILIES}
        present = {s["metric"]["__name__"] for s in prom.query('{__name__=~"burstwatch_.+"}', end)}
        assert len(names) >= 13 and names - present == set() and present - names == set()
        ratio = prom.query('burstwatch_credit_remaining_ratio{direction="out"}', summary["lowest_at"])
        assert math.isclose(float(ratio[0]["value"][1]), summary["lowest_ratio"], abs_tol=1e-9)
        for name, form in PYTHON_FORM.items():
            expr, for_s = pb.shipped_alert(name)
            series = pb.value_at(prom.query_range(expr, start, end), "direction", "out") or []
            # the shipped expression and its Python form hold at the same evaluations, every one of them
            steps = [start + 15.0 * k for k in range(int((end - start) // 15.0) + 1)]
            prom_on = {float(t) for t, _ in series}
            mine_on = {t for t in steps if _holds_at(readings, t, form)}
            assert prom_on and prom_on == mine_on, (name, sorted(prom_on ^ mine_on)[:10])
            # and with their `for:`, page as the summary counted
            fires = pb.alert_fires(series, for_s)
            mine = summary["pages"][name]
            assert len(fires) == mine["count"] == 1, (name, fires, mine)
            assert abs(fires[0] - mine["first"]) <= 15.0 + 1, (name, fires, mine)   # one evaluation step
        if bucket_gbit < 2700.0:
            # the band's side decides here: the point forecasts alone would page later than the rule does
            early = pb.value_at(prom.query_range(
                "burstwatch_credit_exhaustion_earliest_seconds < 180 and burstwatch_credit_draining == 1",
                start, end), "direction", "out")
            assert early, "the band's early side never held on a bucket smaller than believed"
    finally:
        prom.close()
