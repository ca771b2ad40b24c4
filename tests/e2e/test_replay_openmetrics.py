"""`burstwatch replay --openmetrics` backfilled with the real promtool, queried through a real Prometheus, and
the shipped rules evaluated over it at 15-s steps agree with the summary's pages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agent.cli import main
from agent.exporters.credit_view import CreditView
from tests.support import prom_backfill as pb
from tests.support.replay_traces import GBIT, Phase, Trace, TrueBucket, steady, write_trace

pytestmark = [pytest.mark.slow]


def test_backfilled_replay_serves_every_credit_family_and_the_rules_page_as_the_summary_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pb.require_prometheus()
    trace = Trace(TrueBucket(0.75 * GBIT, 10 * GBIT, 2700 * GBIT),
                  [Phase("idle", steady(0.1 * GBIT), 600), Phase("drain", steady(4 * GBIT), 1500, drain=True),
                   Phase("rest", steady(0.1 * GBIT), 1200)])
    csv = write_trace(tmp_path / "t.csv", trace)
    om = tmp_path / "t.om"
    assert main(["replay", str(csv), "--type", "r4.large", "--openmetrics", str(om), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["types"][0]["directions"]["out"]
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
        # the shipped alerts over the backfill, at 15-s steps with their `for:`, page as the summary counted
        for name in ("BurstCreditsRunningOut", "BurstCreditsLow"):
            expr, for_s = pb.shipped_alert(name)
            series = pb.value_at(prom.query_range(expr, start, end), "direction", "out") or []
            fires = pb.alert_fires(series, for_s)
            mine = summary["pages"][name]
            assert len(fires) == mine["count"] == 1, (name, fires, mine)
            assert abs(fires[0] - mine["first"]) <= 15.0 + 1, (name, fires, mine)   # one evaluation step
    finally:
        prom.close()
