"""The bucket's state machine, rule by rule: the evidence verdict, the drain history it reads, the held clamp's
release, the transition function, and the states a simulated shaper walks the bucket through
(docs/credits.md, "States and transitions")."""

from __future__ import annotations

from itertools import groupby
from typing import Optional

import pytest

from agent.models.credit_evidence import (
    AGREEMENT,
    CLAMP_RATE_SLACK,
    EXHAUSTION_CONFIRM_SAMPLES,
    EXHAUSTION_EVIDENCE_FRACTION,
    HIGH_WATER_TOLERANCE,
    DrainHistory,
    EvidenceVerdict,
    ExhaustionEvidence,
    HeldClamp,
    near_baseline,
)
from agent.models.credit_model import Bucket, CreditEstimator, CreditState, Transition, transition
from tests.models.credit_world import MBIT, Sample, Shaper, World, idle, microbursts, steady

# Round numbers in bytes and bytes/s, so each threshold is an exact figure: 250 bytes of evidence, 10 bytes
# of high-water slack, 5 bytes/s of clamp slack, 50 bytes of agreement.
BUCKET, BASELINE = 1000.0, 100.0


def test_the_thresholds_these_tables_are_written_for() -> None:
    assert EXHAUSTION_EVIDENCE_FRACTION * BUCKET == 250.0
    assert HIGH_WATER_TOLERANCE * BUCKET == 10.0
    assert CLAMP_RATE_SLACK * BASELINE == 5.0
    assert AGREEMENT * BUCKET == 50.0
    assert EXHAUSTION_CONFIRM_SAMPLES == 3


# -- the evidence rule -------------------------------------------------------------------------------------

# (why, deficit, deficit_peak, run_start_deficit, run_seconds) -> verdict
VERDICTS = [
    ("a drain of a quarter, flat at its peak", 250.0, 250.0, 250.0, 1.0, EvidenceVerdict.EXHAUSTED),
    ("rule 1: just under a quarter spent", 249.0, 249.0, 249.0, 1.0, EvidenceVerdict.TOO_LITTLE_SPENT),
    ("rule 1 first: little spent and below the peak", 100.0, 900.0, 150.0, 1.0, EvidenceVerdict.TOO_LITTLE_SPENT),
    ("rule 2: more than 1 % under the high-water mark", 500.0, 511.0, 500.0, 1.0, EvidenceVerdict.BELOW_HIGH_WATER),
    ("rule 2: within 1 % of it", 500.0, 510.0, 500.0, 1.0, EvidenceVerdict.EXHAUSTED),
    ("rule 3: falling faster than the slack while the model disagrees", 500.0, 506.0, 506.0, 1.0,
     EvidenceVerdict.EARNING),
    ("rule 3: falling at the slack", 500.0, 505.0, 505.0, 1.0, EvidenceVerdict.EXHAUSTED),
    ("rule 3: rising (a clamp a little over the baseline)", 500.0, 500.0, 490.0, 1.0, EvidenceVerdict.EXHAUSTED),
    ("rule 3 not asked when the model agrees (holds under 5 %)", 960.0, 960.0, 1000.0, 1.0, EvidenceVerdict.EXHAUSTED),
    ("rule 3 not asked of a run without duration", 500.0, 506.0, 600.0, 0.0, EvidenceVerdict.EXHAUSTED),
    ("the model past its own bucket", 1200.0, 1200.0, 1200.0, 1.0, EvidenceVerdict.EXHAUSTED),
]


@pytest.mark.parametrize(("deficit", "peak", "start", "seconds", "want"), [c[1:] for c in VERDICTS],
                         ids=[c[0] for c in VERDICTS])
def test_evidence_verdict(deficit: float, peak: float, start: float, seconds: float, want: EvidenceVerdict) -> None:
    assert ExhaustionEvidence(BUCKET, BASELINE, deficit, peak, start, seconds).verdict() is want


@pytest.mark.parametrize(("rate", "near"), [(79.0, False), (80.0, True), (100.0, True), (125.0, True),
                                            (126.0, False)])
def test_the_near_baseline_band(rate: float, near: bool) -> None:
    assert near_baseline(rate, BASELINE) is near


# -- what the rule reads: the drain history --------------------------------------------------------------

# (why, samples of (before, deficit, dt, candidate)) -> (deficit_peak, run_samples, run_start, run_seconds)
HISTORIES = [
    ("the high-water mark follows the deficit up, not down", [(0, 300, 1, False), (300, 200, 1, False)],
     (300.0, 0, 0.0, 0.0)),
    ("full again: the next drain starts its own mark", [(0, 300, 1, False), (300, 0, 1, False),
                                                        (0, 100, 1, False)], (100.0, 0, 0.0, 0.0)),
    ("a run starts from the deficit before its first sample", [(0, 400, 1, False), (400, 410, 0.5, True),
                                                               (410, 420, 0.5, True)], (420.0, 2, 400.0, 1.0)),
    ("a sample out of the band ends the run", [(400, 410, 1, True), (410, 420, 1, True), (420, 430, 1, False)],
     (430.0, 0, 400.0, 2.0)),
    ("a new run starts afresh", [(400, 410, 1, True), (410, 420, 1, False), (420, 425, 1, True)],
     (425.0, 1, 420.0, 1.0)),
]


@pytest.mark.parametrize(("samples", "want"), [c[1:] for c in HISTORIES], ids=[c[0] for c in HISTORIES])
def test_drain_history(samples: list[tuple[float, float, float, bool]], want: tuple) -> None:
    h = DrainHistory()
    for before, deficit, dt, candidate in samples:
        h.observe(before, deficit, dt, candidate)
    assert (h.deficit_peak, h.run_samples, h.run_start_deficit, h.run_seconds) == want


def test_a_run_is_weighed_from_the_third_sample_and_the_mark_is_capped_and_restarted() -> None:
    h = DrainHistory()
    confirmed = []
    for i in range(4):
        h.observe(500.0 + i, 501.0 + i, 1.0, True)
        confirmed.append(h.confirmed)
    assert confirmed == [False, False, True, True]
    assert h.evidence(BUCKET, BASELINE, 504.0) == ExhaustionEvidence(BUCKET, BASELINE, 504.0, 504.0, 500.0, 4.0)
    h.cap(450.0)
    assert h.deficit_peak == 450.0
    h.restart(200.0)
    assert (h.deficit_peak, h.run_samples, h.confirmed) == (200.0, 0, False)


# -- the held clamp's release ------------------------------------------------------------------------------

# (why, net bytes per 1-s sample after an exhaustion) -> the first sample released (None: still held)
RELEASES = [
    ("held at the baseline", [0.0] * 10, None),
    ("earning 20 % under the baseline", [-20.0] * 3, 1),
    ("earning just over the slack: 1 % of the bucket in two samples", [-6.0] * 3, 2),
    ("earning at the slack never releases", [-5.0] * 10, None),
    ("earning after spending: counted from the free deficit's last high point",
     [-4.0, -4.0, +50.0, -20.0], 4),
    ("spent past the bucket: the free deficit stays at the bucket", [+500.0, -6.0, -6.0], 3),
]


@pytest.mark.parametrize(("nets", "want"), [c[1:] for c in RELEASES], ids=[c[0] for c in RELEASES])
def test_held_clamp_release(nets: list[float], want: Optional[int]) -> None:
    hold = HeldClamp()
    hold.start(BUCKET, 0.0)
    released = [hold.released(net, float(i + 1), BUCKET, BASELINE) for i, net in enumerate(nets)]
    assert (released.index(True) + 1 if True in released else None) == want


# -- the transition function -------------------------------------------------------------------------------

# (exhausted before, confirmed run, evidence explains it, held clamp released) -> transition
TRANSITIONS = [
    (False, False, False, False, Transition.FREE),
    (False, False, True, False, Transition.FREE),           # evidence without a confirmed run: nothing
    (False, True, False, False, Transition.UNEXPLAINED),
    (False, True, True, False, Transition.CONFIRMED),
    (True, True, False, False, Transition.HELD),
    (True, True, True, False, Transition.HELD),             # the verdict is not asked again while held
    (True, True, False, True, Transition.RELEASED),
    (True, False, False, False, Transition.RUN_ENDED),
    (True, False, False, True, Transition.RUN_ENDED),
]


@pytest.mark.parametrize(("exhausted", "confirmed", "explained", "released", "want"), TRANSITIONS)
def test_transition(exhausted: bool, confirmed: bool, explained: bool, released: bool, want: Transition) -> None:
    assert transition(exhausted, confirmed, explained, released) is want


def test_step_names_its_transition_and_pins_an_exhaustion() -> None:
    b = Bucket(BUCKET, BASELINE)
    assert b.state is CreditState.FULL
    moves = [b.advance(1.0, 1000.0, 1000.0, True).value]                       # 900 over the baseline
    moves += [b.advance(1.0, 100.0, 100.0, True).value for _ in range(4)]      # then held at it, shaped
    assert moves == ["free", "free", "free", "confirmed", "held"]
    # It held 10 % of its bucket at the clamp: it learns the deficit as the bucket, and pins it empty.
    assert b.state is CreditState.EXHAUSTED and b.exhausted and b.deficit == b.bucket == 900.0
    assert b.learner.learned_count == 1 and b.learner.learn_method == "exhaustion"
    assert b.advance(1.0, 0.0, 0.0, False) is Transition.RUN_ENDED
    assert b.state is CreditState.PARTIAL and b.deficit == 800.0


# -- the states a shaper walks the bucket through ---------------------------------------------------------

BASE, PEAK, LAB_BUCKET = 100 * MBIT, 300 * MBIT, 150e6      # the lab's profile (tests/support/credit_lab.py)
FULL_SPEED = 10 * PEAK


def states(samples: list[Sample]) -> list[str]:
    """The states in the order they were visited (each run of samples counted once)."""
    return [state for state, _ in groupby(s.reading.state for s in samples)]


def world(model_bucket: float = LAB_BUCKET, shaping: bool = True) -> World:
    w = World(CreditEstimator(BASE, model_bucket, forecast_window=3.0), Shaper(BASE, PEAK, LAB_BUCKET))
    w.shaping_source = shaping
    return w


def test_a_drain_to_the_clamp_and_back() -> None:
    w = world()
    samples = w.run(idle(), 1.0)
    samples += w.run_until_empty(steady(FULL_SPEED), 10)[0]
    samples += w.run(steady(FULL_SPEED), 2.0)
    samples += w.run(idle(), LAB_BUCKET / BASE + 1.0)
    assert states(samples) == ["full", "partial", "exhausted", "partial", "full"]


def test_a_model_bucket_too_small_overruns_then_exhausts() -> None:
    w = world(model_bucket=LAB_BUCKET / 2)
    samples = w.run_until_empty(steady(FULL_SPEED), 10)[0] + w.run(steady(FULL_SPEED), 2.0)
    assert states(samples) == ["partial", "empty", "overrun", "empty", "exhausted"]
    assert samples[-1].reading.learn_method == "exhaustion"


def test_a_cyclic_drain_past_a_model_bucket_too_small_learns_through_its_pauses() -> None:
    """Bursts above the band that each overrun the bucket by less than the margin, with pauses between them
    that refill less than they overran: the pauses keep the overrun's deficit, so it passes the margin and the
    bucket grows (clamped at the bucket in each pause, it would stay at 1040 forever and never learn)."""
    b = Bucket(BUCKET, BASELINE)
    for _ in range(25):
        b.advance(1.0, 140.0, 140.0, False)                     # net +40 per second: at the bucket after 25 s
    assert b.deficit == BUCKET and b.bucket == BUCKET
    seen = []
    for _ in range(4):
        b.advance(1.0, 140.0, 140.0, False)                     # +40: past the bucket, above the band, unshaped
        seen.append(b.state)
        b.advance(1.0, 90.0, 90.0, False)                       # -10: a pause that refills less
        seen.append(b.state)
    assert seen[:3] == [CreditState.OVERRUN] * 3
    assert b.learner.learn_method == "unshaped_overrun" and b.bucket >= BUCKET + AGREEMENT * BUCKET


def test_without_a_shaping_source_a_spent_model_is_empty_never_exhausted() -> None:
    w = world(model_bucket=LAB_BUCKET / 2, shaping=False)
    samples = w.run_until_empty(steady(FULL_SPEED), 10)[0] + w.run(steady(FULL_SPEED), 2.0)
    assert states(samples) == ["partial", "empty"]


def test_microbursts_on_a_full_bucket_stay_full() -> None:
    assert states(world().run(microbursts(0.9 * BASE), 5.0)) == ["full"]


def test_bursty_traffic_under_the_baseline_releases_an_exhaustion() -> None:
    w = world()
    w.run_until_empty(steady(FULL_SPEED), 10)
    w.run(steady(FULL_SPEED), 2.0)
    assert states(w.run(microbursts(0.8 * BASE), 10.0)) == ["exhausted", "partial"]


def test_a_restored_deficit_sets_the_state() -> None:
    est = CreditEstimator(BASE, LAB_BUCKET)
    est.restore({"out": {"deficit": LAB_BUCKET / 2}, "in": {"deficit": 2 * LAB_BUCKET}})
    r = est.update(0.0, {}, {}, None)
    assert (r["out"].state, r["in"].state) == ("partial", "empty")
    assert CreditEstimator(BASE, None).update(1.0, {}, {}, None)["out"].state == "none"
