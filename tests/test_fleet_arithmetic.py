"""docs/fleet.md's fleet arithmetic is generated from the code's defaults (scripts/gen_fleet_arithmetic.py,
scripts/fleet_model.py); the model's rules are checked here, the model against a real fleet in
tests/e2e/test_fleet_run.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import fleet_model as model  # noqa: E402
import gen_fleet_arithmetic as gen  # noqa: E402

from agent.checks import INTERVALS  # noqa: E402
from agent.models.peer_registry import REGISTER_INTERVAL, cross_az_dollars_per_month  # noqa: E402


def test_fleet_arithmetic_in_the_docs_is_generated_from_the_defaults() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_fleet_arithmetic.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("section", "change"), [
    ("fleet", {"refresh_interval": 3600.0}),
    ("probe", {"discover_interval": 600.0}),
    ("probe", {"cross_az_share": 0.1}),
    ("cloudwatch", {"period": 300}),
])
def test_a_changed_default_changes_the_region(monkeypatch: pytest.MonkeyPatch, section: str,
                                               change: dict[str, object]) -> None:
    """So the --check above fails when a default moves and the docs stay behind."""
    before = gen.region()
    original = gen.fleet_config

    def changed() -> model.Config:
        cfg = original()
        return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **change)})

    monkeypatch.setattr(gen, "fleet_config", changed)
    assert gen.region() != before


def test_the_calls_follow_from_the_defaults() -> None:
    cfg = model.fleet_config()
    calls = model.calls_per_agent_hour(cfg, 100_000)
    # The registry: one LIST per discovery, one PUT per registration; no EC2 call for discovery.
    assert calls["s3:ListObjectsV2 agents/"] == pytest.approx(3600 / cfg.probe.discover_interval)
    assert calls["s3:PutObject agents/"] == pytest.approx(3600 / REGISTER_INTERVAL)
    assert calls["ec2:DescribeInstances"] == 0
    # Tag discovery instead: one DescribeInstances page per discovery.
    tag = dataclasses.replace(cfg, probe=dataclasses.replace(cfg.probe, registry=False, discover_tag="k=v"))
    assert model.calls_per_agent_hour(tag)["ec2:DescribeInstances"] == pytest.approx(3600 / cfg.probe.discover_interval)
    assert model.calls_per_agent_hour(tag)["s3:ListObjectsV2 agents/"] == 0
    # fleet_access at its cadence plus once per start.
    assert calls["s3:PutObject access-check/"] == pytest.approx(3600 / INTERVALS["fleet_access"]
                                                                + 1 / model.lifetime_hours())
    # The learned GETs level off at a window's share of the new objects, whatever the fleet.
    level = cfg.fleet.max_objects / (cfg.fleet.max_age_days * 24)
    assert model.learned_gets_per_hour(cfg, 100_000, 1 / 720) == pytest.approx(level)
    assert model.learned_gets_per_hour(cfg, 10, 1 / 720) == pytest.approx(10 / 720)


def test_every_api_stays_under_half_its_quota_at_100k() -> None:
    f = gen.Figures()
    assert len(model.APIS) >= 10, model.APIS           # S3, CloudWatch and EC2 calls: none left out by accident
    for api in model.APIS:
        assert f.per_second(100_000, api) <= 0.5 * model.quota_of(api).per_second, api


def test_tag_discovery_fits_ten_percent_of_the_bucket_up_to_its_limit() -> None:
    f = gen.Figures()
    limit = f.tag_discovery_limit()
    assert limit / f.cfg.probe.discover_interval == pytest.approx(0.1 * 20)


def test_cross_az_costs_nothing_by_default_and_scales_with_the_share() -> None:
    f = gen.Figures()
    assert f.cfg.probe.cross_az_share == 0
    assert all(f.dollars(n)["cross-AZ probe bytes"] == 0 for n in gen.FLEETS)
    # $0.02 per GB crossing (0.01 each way): 10 % of 1 GB an hour is 73 GB a month, $1.46.
    assert cross_az_dollars_per_month(0.1, 1e9) == pytest.approx(73 * 0.02)
