"""The zoo at EC2's scale through `burstwatch replay --openmetrics`, the shipped rules evaluated by a real
Prometheus at 15-s steps (tests/support/replay_zoo.py). `make test` runs the short zoo; `make bench
BENCH=replay` the whole table."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.support import prom_backfill as pb
from tests.support import replay_zoo as rz

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[rz.Case], list[rz.DrainFigures]]]:
    pb.require_prometheus()
    cases = rz.short_zoo()
    rz.run(cases, Path(tmp_path_factory.mktemp("zoo")))
    figs = [f for c in cases for f in rz.figures(c)]
    print("\n" + rz.HEADER + "\n" + "\n".join(rz.row(f) for f in figs))
    yield cases, figs


def test_the_zoo_ran_every_shape(zoo: tuple[list[rz.Case], list[rz.DrainFigures]]) -> None:
    cases, figs = zoo
    assert {c.kind for c in cases} == {"drain", "quiet", "learned"}
    emptied = [f for f in figs if f.seconds is not None]
    assert len(emptied) >= 6 and all(c.samples.get(rz.TREND) for c in cases)


def test_drains_on_a_bucket_the_agent_believes_page_a_minute_before_the_cliff(
        zoo: tuple[list[rz.Case], list[rz.DrainFigures]]) -> None:
    assert rz.failures(zoo[1])["page"] == []


def test_traffic_at_or_under_the_baseline_never_pages(zoo: tuple[list[rz.Case], list[rz.DrainFigures]]) -> None:
    figs = [f for f in zoo[1] if f.kind == "quiet"]
    assert figs and rz.failures(zoo[1])["quiet"] == []


def test_drains_on_a_bucket_smaller_or_larger_than_believed_page_before_the_cliff(
        zoo: tuple[list[rz.Case], list[rz.DrainFigures]]) -> None:
    assert rz.failures(zoo[1])["page-band"] == []


def test_the_band_holds_the_true_empty_moment(zoo: tuple[list[rz.Case], list[rz.DrainFigures]]) -> None:
    assert rz.failures(zoo[1])["band"] == []


def test_the_point_forecast_is_right_after_the_second_onset_when_the_bucket_is_the_belief(
        zoo: tuple[list[rz.Case], list[rz.DrainFigures]]) -> None:
    assert rz.failures(zoo[1])["point"] == []
