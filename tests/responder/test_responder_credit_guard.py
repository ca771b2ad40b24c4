"""The responder's credit guard: the floor under this host's buckets and the hourly serving budget.

Pure rules with table tests, then over real sockets with burstwatch's client and Debian's iperf3: a
refused test is "busy" to both, and says why to burstwatch's.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import pytest
from prometheus_client import CollectorRegistry

from agent.config import ResponderConfig
from agent.exporters.responder import ResponderView
from agent.iperf3.client import ProbeError, ProbeRequest, run_probe
from agent.iperf3.params import TestParams
from agent.models.credit_model import CreditReading
from agent.models.profile import GBIT, BandwidthProfile
from agent.models.serving_budget import ServingBudget
from agent.responder.policy import budget_refusal, credit_refusal, drained_directions, expected_bytes
from agent.responder.stats import BUDGET_WINDOW, ServedLedger
from tests.support.iperf3 import iperf3_client, responder, wait_until

PEAK = 10 * GBIT                # 1.25e9 bytes/s
BUCKET = 100e9
CFG = ResponderConfig()         # the shipped defaults: floor 0.5, budgets sized to the profile
BURSTS = BandwidthProfile("lab.burst", 0.75 * GBIT, PEAK, BUCKET, "config", "config", "config")
FLAT = BandwidthProfile("lab.flat", PEAK, PEAK, None, "config", "config", "none")   # baseline = peak


def reading(direction: str, ratio: float) -> CreditReading:
    return CreditReading(direction, 0.0, ratio * BUCKET, BUCKET, ratio, float("inf"), float("inf"))


def credits(out: float = 1.0, in_: float = 1.0) -> dict[str, tuple[float, float]]:
    return {"out": (out * BUCKET, BUCKET), "in": (in_ * BUCKET, BUCKET)}


# -- pure rules --------------------------------------------------------------------------------------------

def test_which_bucket_a_test_drains() -> None:
    assert drained_directions(TestParams(reverse=True)) == ("out",)     # -R: the responder sends
    assert drained_directions(TestParams()) == ("in",)                  # forward: it receives
    assert drained_directions(TestParams(bidirectional=True)) == ("in", "out")


@pytest.mark.parametrize(("params", "peak", "want"), [
    (TestParams(duration=5), PEAK, 6.25e9),                                    # time x peak
    (TestParams(duration=5, omit=2), PEAK, 8.75e9),                            # omitted seconds move bytes too
    (TestParams(duration=5, num_streams=4, bandwidth=100_000_000), PEAK, 250e6),  # -b per stream, smaller
    (TestParams(duration=0, bytes=1_000_000), PEAK, 1e6),                      # -n
    (TestParams(duration=0, blocks=10, blksize=1000), PEAK, 10_000.0),         # -k
    (TestParams(duration=30), PEAK, float(CFG.max_bytes)),                     # never more than max_bytes
    (TestParams(duration=5), None, None),                                      # unknown peak, no limit
    (TestParams(duration=5, protocol="udp", bandwidth=8_000_000), None, 5e6),  # UDP always has a rate
])
def test_expected_bytes_reckoned_as_the_scheduler_does(params: TestParams, peak: Optional[float],
                                                       want: Optional[float]) -> None:
    got = expected_bytes(params, peak, CFG)
    assert got == pytest.approx(want) if want is not None else got is None


def test_floor_refuses_only_for_the_bucket_the_test_drains() -> None:
    low_out = credits(out=0.4, in_=1.0)
    refusal = credit_refusal(TestParams(reverse=True), low_out, 1e9, 0.5)
    assert refusal is not None and refusal.reason == "credit_floor" and refusal.busy
    assert "outbound burst credit is at 40%" in str(refusal)
    assert credit_refusal(TestParams(), low_out, 1e9, 0.5) is None             # forward drains "in"
    bidir = credit_refusal(TestParams(bidirectional=True), low_out, 1e9, 0.5)
    assert bidir is not None and bidir.reason == "credit_floor"


def test_floor_refuses_a_test_that_would_cross_it() -> None:
    at_60 = credits(out=0.6)
    assert credit_refusal(TestParams(reverse=True), at_60, 10e9, 0.5) is None   # 60 -> 50 GB: on the floor
    refusal = credit_refusal(TestParams(reverse=True), at_60, 10.1e9, 0.5)
    assert refusal is not None and refusal.reason == "would_cross_floor" and refusal.busy
    assert credit_refusal(TestParams(reverse=True), at_60, None, 0.5) is None   # size unknown: floor only
    # A floor of 0 still never lets a test empty the bucket.
    nearly_empty = credit_refusal(TestParams(reverse=True), credits(out=0.01), 2e9, 0.0)
    assert nearly_empty is not None and nearly_empty.reason == "would_cross_floor"


def test_no_credit_figures_no_floor() -> None:
    assert credit_refusal(TestParams(reverse=True), {}, 1e12, 0.5) is None


def test_budget_in_total_and_per_source() -> None:
    cfg = ServingBudget(100, 40, "config", None)
    fwd = TestParams()
    assert budget_refusal(fwd, 10, {"in": 50}, {"in": 30}, cfg) is None
    per_source = budget_refusal(fwd, 11, {"in": 50}, {"in": 30}, cfg, "10.0.0.5")
    assert per_source is not None and per_source.reason == "budget" and per_source.busy
    assert str(per_source) == ("hourly budget spent: 30 bytes of 40 bytes received from 10.0.0.5 in the last hour; "
                               "this test is expected to move 11 bytes (budget: "
                               "[responder] hourly_budget_per_source_bytes)")
    total = budget_refusal(fwd, 10, {"in": 95}, {"in": 0}, cfg)
    assert total is not None and "all sources" in str(total)
    # Each direction has its own budget, as each has its own bucket.
    assert budget_refusal(TestParams(reverse=True), 10, {"in": 100, "out": 0}, {"in": 40}, cfg) is None
    # Size unknown: only a budget already spent refuses.
    assert budget_refusal(fwd, None, {"in": 99}, {"in": 39}, cfg) is None
    assert budget_refusal(fwd, None, {"in": 100}, {"in": 0}, cfg) is not None


def test_served_ledger_slides_over_an_hour_per_source() -> None:
    now = [1000.0]
    ledger = ServedLedger(clock=lambda: now[0])
    ledger.record("10.0.0.1", 100, 0)
    now[0] += 1800
    ledger.record("10.0.0.2", 5, 7)
    ledger.record("10.0.0.1", 0, 0)           # nothing moved: nothing recorded
    assert ledger.used() == {"in": 105, "out": 7}
    assert ledger.used("10.0.0.1") == {"in": 100, "out": 0}
    now[0] += BUDGET_WINDOW - 1800            # the first test is exactly an hour old: out of the window
    assert ledger.used() == {"in": 5, "out": 7}
    assert ledger.used("10.0.0.1") == {"in": 0, "out": 0}


# -- over sockets ------------------------------------------------------------------------------------------

def probe(r: Any, **kw: Any) -> dict:
    args: dict = {"streams": 1, "duration": 0.3}
    args.update(kw)
    doc = run_probe(ProbeRequest(*r.address, **args))
    wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
    return doc


def refused(r: Any, **kw: Any) -> ProbeError:
    with pytest.raises(ProbeError) as exc:
        probe(r, **kw)
    return exc.value


def test_low_outbound_credit_refuses_reverse_tests_as_busy_and_serves_forward_ones() -> None:
    state = {"out": reading("out", 0.3), "in": reading("in", 1.0)}
    with responder(credits=lambda: state, profile=lambda: BURSTS) as r:
        err = refused(r, reverse=True)
        assert err.kind == "busy"        # not the peer's fault: the scheduler does not back off
        assert "refused: credit floor: this host's outbound burst credit is at 30%" in str(err)
        out = iperf3_client("127.0.0.1", r.address[1], "-t", "1", "-R")
        assert out.returncode == 1 and "the server is busy running a test" in out.stderr
        probe(r)                          # forward: the inbound bucket is full
        state["out"] = reading("out", 0.9)
        probe(r, reverse=True)            # refilled: served again
        snap = r.stats.snapshot()
    assert snap.refused["credit_floor"] == 2
    assert snap.tests == {"completed": 2, "aborted": 0}
    assert snap.refused["busy"] == 0


def test_a_test_whose_expected_bytes_would_cross_the_floor_is_refused() -> None:
    # 60 % of a 100 GB bucket; a 10 s test at 10 Gbit/s is expected to move 12.5 GB: 47.5 % after it.
    state = {"out": reading("out", 0.6), "in": reading("in", 0.6)}
    cfg: dict[str, Any] = {"max_bytes": 2**40}
    with responder(credits=lambda: state, profile=lambda: BURSTS, max_duration=30, **cfg) as r:
        err = refused(r, duration=10.0)
        assert err.kind == "busy" and "would take this host's inbound burst credit" in str(err)
        probe(r, duration=1.0)            # 1.25 GB expected: 58.75 % after it
        probe(r, duration=10.0, bitrate=1_000_000)   # -b 1 Mbit/s: 1.25 MB expected
        assert r.stats.snapshot().refused["would_cross_floor"] == 1


def test_a_credit_blind_host_only_has_the_budget() -> None:
    empty = {"out": reading("out", 0.0), "in": reading("in", 0.0)}
    for profile in (FLAT, BandwidthProfile(), None):
        with responder(credits=lambda: empty, profile=lambda p=profile: p) as r:
            probe(r, reverse=True)
            assert r.stats.snapshot().refused["credit_floor"] == 0


def test_unreadable_credits_serve_as_credit_blind(caplog: pytest.LogCaptureFixture) -> None:
    """A credit source that raises (no sample yet, a bug in the wiring) is logged with its traceback and
    read as "no figures": on a size with a bucket the test is served, not refused on the floor nor
    dropped, and the hourly budget, which needs no credit figures, still refuses."""
    asked = []

    def broken() -> dict:
        asked.append(True)
        raise RuntimeError("no sample yet")

    caplog.set_level(logging.ERROR, logger="agent.responder")
    with responder(credits=broken, profile=lambda: BURSTS) as r:
        probe(r, reverse=True)
        snap = r.stats.snapshot()
    assert asked, "the guard never asked for the credits"
    assert snap.tests == {"completed": 1, "aborted": 0}
    assert snap.refused["credit_floor"] == 0 and snap.refused["would_cross_floor"] == 0
    assert any("serving as credit-blind" in rec.getMessage() and rec.exc_info for rec in caplog.records)
    with responder(credits=broken, profile=lambda: BURSTS, hourly_budget_per_source_bytes=1_000_000) as r:
        err = refused(r, reverse=True)                           # a test at the peak expects far more
        assert err.kind == "busy" and r.stats.snapshot().refused["budget"] == 1


def test_budget_refuses_once_spent_per_source_then_in_total() -> None:
    # Off EC2 (no profile) and without -b, a test's size is unknown: the budget refuses once spent.
    with responder(hourly_budget_bytes=2**50, hourly_budget_per_source_bytes=1_000_000) as r:
        probe(r, reverse=True)                                   # moves far more than 1 MB on loopback
        err = refused(r, reverse=True)
        assert err.kind == "busy" and "refused: hourly budget spent: " in str(err)
        assert "sent to 127.0.0.1 in the last hour (budget: [responder] hourly_budget_per_source_bytes)" in str(err)
        probe(r)                                                 # the inbound direction has its own budget
        other = iperf3_client("127.0.0.1", r.address[1], "-B", "127.0.0.2", "-t", "1", "-R")
        assert other.returncode == 0, other.stderr              # another source has its own budget
        wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
        served = r.stats.snapshot().served_last_hour
        r.reconfigure(ResponderConfig(listen=r.cfg.listen, hourly_budget_bytes=served["out"],
                                      hourly_budget_per_source_bytes=2**50), ["127.0.0.0/8"])
        out = iperf3_client("127.0.0.1", r.address[1], "-B", "127.0.0.3", "-t", "1", "-R")
        assert out.returncode == 1 and "the server is busy running a test" in out.stderr
        snap = r.stats.snapshot()
    assert snap.refused["budget"] == 2
    assert snap.tests["completed"] == 3
    assert snap.served_last_hour["out"] == served["out"] > 1_000_000
    assert snap.served_last_hour["in"] > 0
    assert snap.hourly_budget_bytes == served["out"]


def test_metrics_show_refusals_and_the_hour_served() -> None:
    state = {"out": reading("out", 0.1), "in": reading("in", 1.0)}
    with responder(credits=lambda: state, profile=lambda: BURSTS, hourly_budget_bytes=10**10,
                   hourly_budget_per_source_bytes=5 * 10**9) as r:
        refused(r, reverse=True)
        probe(r, bitrate=80_000_000)
        view = ResponderView(r.stats.snapshot)  # type: ignore[arg-type]
        assert {m.name for m in view.collect()} == {m.name for m in view.describe()}
        registry = CollectorRegistry()
        registry.register(view)
        get = registry.get_sample_value
        assert get("burstwatch_responder_refused_total", {"reason": "credit_floor"}) == 1
        assert get("burstwatch_responder_refused_total", {"reason": "would_cross_floor"}) == 0
        assert get("burstwatch_responder_refused_total", {"reason": "budget"}) == 0
        served_in = get("burstwatch_responder_served_last_hour_bytes", {"direction": "in"})
        assert served_in == get("burstwatch_responder_bytes_total", {"direction": "in"}) > 0
        assert get("burstwatch_responder_served_last_hour_bytes", {"direction": "out"}) == 0
        assert get("burstwatch_responder_hourly_budget_bytes") == 10**10


@pytest.mark.parametrize("low", ["in", "out"])
def test_a_bidir_test_is_refused_when_either_bucket_is_low(low: str) -> None:
    """--bidir drains both buckets (docs/security.md, "Responder credit guard"): the guard checks both, for
    burstwatch's client and for iperf3's; one-way tests keep being served in the direction that has credit."""
    state = {"out": reading("out", 1.0), "in": reading("in", 1.0)}
    state[low] = reading(low, 0.3)
    with responder(credits=lambda: state, profile=lambda: BURSTS) as r:
        err = refused(r, bidir=True, streams=2)
        assert err.kind == "busy" and f"this host's {low}bound burst credit is at 30%" in str(err)
        out = iperf3_client("127.0.0.1", r.address[1], "-t", "1", "--bidir")
        assert out.returncode == 1 and "the server is busy running a test" in out.stderr
        probe(r, reverse=low == "in")     # the full direction serves one-way tests
        snap = r.stats.snapshot()
    assert snap.refused["credit_floor"] == 2 and snap.tests == {"completed": 1, "aborted": 0}


def test_a_bidir_test_is_reckoned_against_both_directions_budgets() -> None:
    with responder(hourly_budget_bytes=2**50, hourly_budget_per_source_bytes=1_000_000) as r:
        probe(r)                                     # fills the inbound budget only
        err = refused(r, bidir=True, streams=1)      # --bidir needs the inbound one too
        assert err.kind == "busy" and "received from 127.0.0.1" in str(err)
        probe(r, reverse=True)                       # the outbound budget is untouched
        assert r.stats.snapshot().refused["budget"] == 1
