"""The figure table (agent/models/figures/): one entry per family, each named once, and the views, the
CloudWatch publisher and `burstwatch status` read it rather than spell it again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.models import figures as F
from tests.exporters import exposition

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"


def test_names_follow_the_conventions() -> None:
    names = [f.name for f in F.FIGURES]
    assert len(names) == len(set(names))
    for f in F.FIGURES:
        assert f.name.startswith(F.NAMESPACE + "_"), f.name
        assert f.type in ("gauge", "counter", "info"), f.name
        assert f.name.endswith("_total") == (f.type == "counter"), f.name
        if f.type == "info":
            assert f.name.endswith("_info"), f.name
        assert f.help.endswith(".") and f.doc, f.name
    cw = [c.name for f in F.FIGURES for c in f.cloudwatch]
    assert len(cw) == len(set(cw)) and set(F.DEFAULT_METRICS) <= set(cw)


def test_every_family_is_named_in_at_most_two_files_under_agent() -> None:
    """The table, and at most one more file (where a model computes it, or a comment citing it): a reader
    finds where a figure comes from by grepping its name."""
    texts = {p: p.read_text() for p in AGENT.rglob("*.py")}
    assert len(texts) >= 100 and len(F.FIGURES) >= 100, (len(texts), len(F.FIGURES))   # agent/ read, table full
    for f in F.FIGURES:
        word = re.compile(re.escape(f.name) + r"(?![a-z0-9_])")
        files = sorted(str(p.relative_to(AGENT.parent)) for p, t in texts.items() if word.search(t))
        # The table is one package; its entry for the figure is in one section module, where a meaning
        # in another section may cite it.
        table = [p for p in files if p.startswith("agent/models/figures/")]
        others = [p for p in files if p not in table]
        assert table and len(others) <= 1, (f.name, files)


def test_every_figure_is_rendered_by_one_view_with_the_tables_labels() -> None:
    """The fixture readings fill every family: each comes out of one view with the help and label names
    of its entry, in the entry's order."""
    seen: dict[str, str] = {}
    for view in exposition.views():
        for fam in view.collect():
            fig = next(f for f in F.FIGURES if f.family == fam.name)
            assert fig.name not in seen, f"{fig.name} rendered by {seen[fig.name]} and {type(view).__name__}"
            seen[fig.name] = type(view).__name__
            assert fam.documentation == fig.help and fam.type == fig.type
            labels = [k for s in fam.samples for k in s.labels]
            assert list(dict.fromkeys(labels)) == list(fig.labels), fig.name
    assert set(seen) == {f.name for f in F.FIGURES}


@pytest.mark.parametrize("include,metrics,unknown", [
    ((), list(F.DEFAULT_METRICS), []),
    (("CreditExhausted", "Nope", "CreditRemainingRatio"), [*F.DEFAULT_METRICS, "CreditExhausted"], ["Nope"]),
])
def test_selected_metrics(include: tuple[str, ...], metrics: list[str], unknown: list[str]) -> None:
    assert F.selected_metrics(include) == (metrics, unknown)


def test_cloudwatch_reads_what_prometheus_renders() -> None:
    """The CloudWatch form of a per-direction figure reads the same reading; only +Inf is capped (and the
    band's early side reads a year while the bucket does not drain: the fixture's drain and is exhausted)."""
    snap = exposition.snapshot()
    pairs = [(fig, form) for fig in F.FIGURES for form in fig.cloudwatch
             if form.per == "direction" and fig.read is not None]
    assert len(pairs) >= 9, [fig.name for fig, _ in pairs]     # the credit figures CloudWatch publishes
    checked = 0
    for fig, form in pairs:
        for d in ("in", "out"):
            assert fig.read is not None
            prom, cw = fig.read(snap, d), form.read(snap, d)
            # The golden snapshot fills every figure, so each pair is compared, none skipped.
            assert prom is not None and cw is not None, (fig.name, d, prom, cw)
            capped = min(prom, F.EXHAUSTION_CAP_SECONDS) if form.unit == "Seconds" else prom
            assert cw == capped, (fig.name, d)
            checked += 1
    assert checked == 2 * len(pairs)


def test_the_docs_tables_are_generated_from_the_table() -> None:
    """docs/metrics.md's tables and docs/cloudwatch.md's published list (scripts/gen_metrics_doc.py)."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_metrics_doc.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
