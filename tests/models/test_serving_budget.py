"""The responder's hourly budget sized to the instance: a share of its refill, a fairness limit without a bucket."""

from __future__ import annotations

import math

import pytest

from agent import config as configmod
from agent.config import ProbeConfig, ResponderConfig
from agent.models.catalogue import load_catalogue
from agent.models.probe_cost import COST_LINE, hourly_cost, median_burstable
from agent.models.serving_budget import (
    MEDIAN_BASELINE_BYTES_PER_SECOND,
    PER_SOURCE_OF_TOTAL,
    ServingBudget,
    responder_budget,
    serving_budget,
)
from agent.models.units import gbit_to_bytes

CAT = load_catalogue()


def budget_of(instance_type: str) -> ServingBudget:
    e = CAT[instance_type]
    assert e.baseline_gbps is not None and e.peak_gbps is not None
    return responder_budget(ResponderConfig(), gbit_to_bytes(e.baseline_gbps), gbit_to_bytes(e.peak_gbps))


@pytest.mark.parametrize(("instance_type", "basis", "total", "per_source"), [
    # 1 % of baseline x 3600 s: 0.75 Gbit/s -> 337.5 GB an hour -> 3.375 GB, 3/4 of it per source.
    ("m5.large", "refill", 3_375_000_000, 2_531_250_000),
    ("r4.large", "refill", 3_375_000_000, 2_531_250_000),
    ("c5d.2xlarge", "refill", 11_250_000_000, 8_437_500_000),     # the median burstable type
    # No bucket (100 Gbit/s baseline and peak): a fairness limit, 36 s of line rate an hour.
    ("c5n.18xlarge", "link", 450_000_000_000, 337_500_000_000),
])
def test_the_default_budget_is_a_share_of_this_sizes_refill(instance_type: str, basis: str, total: int,
                                                            per_source: int) -> None:
    b = budget_of(instance_type)
    assert (b.basis, b.total, b.per_source) == (basis, total, per_source)


def test_what_the_budget_says_it_is() -> None:
    assert budget_of("m5.large").describe() == "1 % of this host's hourly refill"
    assert budget_of("m5.large").describe(per_source=True) == "0.75 % of this host's hourly refill"
    assert "a fairness limit: it has no burst bucket" in budget_of("c5n.18xlarge").describe()
    unknown = serving_budget("auto", "auto", 0.01, None, None)
    assert unknown.basis == "median" and unknown.total == 11_250_000_000
    assert "this size's baseline is unknown" in unknown.describe()


def test_bytes_given_are_kept_and_auto_per_source_follows_the_total() -> None:
    b = serving_budget(10**9, "auto", 0.01, gbit_to_bytes(0.75), gbit_to_bytes(10))
    assert (b.basis, b.total, b.per_source, b.share) == ("config", 10**9, 750_000_000, None)
    assert b.describe(per_source=True) == "3/4 of [responder] hourly_budget_bytes"
    b = serving_budget("auto", 5, 0.01, gbit_to_bytes(0.75), gbit_to_bytes(10))
    assert (b.basis, b.total, b.per_source) == ("refill", 3_375_000_000, 5)
    assert b.describe(per_source=True) == "[responder] hourly_budget_per_source_bytes"
    assert serving_budget(0, 0, 0.01, None, None).total == 0       # 0 still serves nothing


def test_the_default_share_is_the_responders_half_of_the_cost_line() -> None:
    """Served tests at the whole budget plus the default schedule's own probes stay on the 2 % line."""
    assert ResponderConfig().hourly_budget_share == COST_LINE / 2
    median = median_burstable(CAT.values())
    assert median.baseline_gbps is not None and median.peak_gbps is not None
    base, peak = gbit_to_bytes(median.baseline_gbps), gbit_to_bytes(median.peak_gbps)
    b = responder_budget(ResponderConfig(), base, peak)
    for cost in hourly_cost(ProbeConfig(), base, peak).values():
        own = cost.own_probes * (cost.bytes_per_probe or 0.0)
        assert (own + b.total) / (base * 3600) <= COST_LINE


@pytest.mark.parametrize("instance_type", ["t3.micro", "m5.large", "c5d.2xlarge", "c5n.18xlarge"])
def test_one_peer_on_the_default_schedule_fits_the_per_source_budget(instance_type: str) -> None:
    """A peer probing this host alone: each round one probe per direction at the baseline; with the rounds'
    +-20 % jitter up to 5 rounds fall in a sliding hour (scheduler: interval x 0.8 apart at least)."""
    probe = ProbeConfig()
    e = CAT[instance_type]
    assert e.baseline_gbps is not None
    rounds = math.ceil(3600 / (probe.interval * 0.8))   # the window drops what is an hour old
    assert rounds == 5
    assert rounds * probe.duration * gbit_to_bytes(e.baseline_gbps) <= budget_of(instance_type).per_source


def test_the_median_stand_in_is_the_catalogues_median() -> None:
    median = median_burstable(CAT.values())
    assert median.baseline_gbps is not None
    assert MEDIAN_BASELINE_BYTES_PER_SECOND == gbit_to_bytes(median.baseline_gbps)
    assert 0 < PER_SOURCE_OF_TOTAL < 1


@pytest.mark.parametrize(("text", "want"), [
    ('hourly_budget_bytes = "auto"', "auto"),
    ("hourly_budget_bytes = 5000000000", 5_000_000_000),
    ("hourly_budget_bytes = 0", 0),
])
def test_config_takes_auto_or_bytes(text: str, want: object) -> None:
    assert configmod.parse(f"[responder]\n{text}\n").responder.hourly_budget_bytes == want


@pytest.mark.parametrize(("text", "message"), [
    ('hourly_budget_bytes = "lots"', "key 'responder.hourly_budget_bytes': 'lots' is neither bytes nor 'auto'"),
    ("hourly_budget_per_source_bytes = -1", "key 'responder.hourly_budget_per_source_bytes' = -1 is out of range"),
    ("hourly_budget_bytes = 1.5", "key 'responder.hourly_budget_bytes' must be an integer or a string, got 1.5"),
    ("hourly_budget_share = 2.0", "key 'responder.hourly_budget_share' = 2.0 is out of range"),
])
def test_config_refuses_other_budgets(text: str, message: str) -> None:
    with pytest.raises(configmod.ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        configmod.parse(f"[responder]\n{text}\n", "f.toml")
