"""Which bucket the credits step starts from: config > own learned > fleet > default (docs/fleet.md).

The profile (agent/models/profile.py) ranks config, fleet and default; the agent's own learned size is kept
per instance type in state_dir and restored by the credits step over the profile's bucket, unless a
configured bucket is trusted or learning is off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from agent.config import CreditsConfig
from agent.models.counters import CounterTracker
from agent.models.profile import BandwidthProfile
from agent.sampling.credits import CreditsStep
from agent.writers.credit_store import CreditStore

BASE, PEAK = 100e6 / 8, 300e6 / 8
PRIOR, LEARNED = 150e6, 90e6            # the profile's bucket, and the size learned earlier on this type
TYPE = "lab.shaper"


def tracker(tmp_path: Path, source: str, learned: bool, cfg: CreditsConfig) -> CreditsStep:
    if learned:
        CreditStore(str(tmp_path), procfs=str(tmp_path)).save_learned(
            TYPE, {d: {"bucket": LEARNED, "learned_count": 2, "learn_method": "exhaustion"} for d in ("in", "out")})
    profile = BandwidthProfile(TYPE, BASE, PEAK, PRIOR, "config", "config", source)
    return CreditsStep(profile, str(tmp_path), cfg, procfs=str(tmp_path))


# (profile's bucket source, a learned size stored, [credits] keys) -> (bucket, source, learned_count)
CASES = [
    ("own learned over the default", "default", True, {}, (LEARNED, "learned", 2)),
    ("own learned over the fleet", "fleet", True, {}, (LEARNED, "learned", 2)),
    ("the fleet without a learned size", "fleet", False, {}, (PRIOR, "fleet", 0)),
    ("a trusted configured bucket over own learned", "config", True, {}, (PRIOR, "config", 0)),
    ("an untrusted configured bucket under own learned", "config", True, {"trust_configured_bucket": False},
     (LEARNED, "learned", 2)),
    ("learning off keeps the fleet's", "fleet", True, {"learn": False}, (PRIOR, "fleet", 0)),
]


@pytest.mark.parametrize(("source", "learned", "keys", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bucket_precedence(tmp_path: Path, source: str, learned: bool, keys: dict,
                           want: tuple[float, str, Optional[int]]) -> None:
    est = tracker(tmp_path, source, learned, CreditsConfig(**keys)).estimator
    for d in ("in", "out"):
        r = est.update(0.2, {d: 0.0}, {d: 0.0}, None)[d]
        assert (r.bucket_bytes, r.bucket_source, r.learned_count) == want
        assert r.ratio == 1.0 and r.state == "full"


def test_a_state_file_from_before_the_state_machine_loads(tmp_path: Path) -> None:
    """credits.json as the model wrote it before its states had names: same keys, same figures back, and the
    state follows from the restored deficit."""
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("boot-1\n")
    (tmp_path / "credits.json").write_text(json.dumps({
        "format": "burstwatch-credits/1", "boot_id": "boot-1", "boottime": 500.0, "wall": 1.7e9,
        "instance_type": TYPE, "counters": {},
        "directions": {
            "out": {"deficit": 60e6, "bucket": LEARNED, "learned_count": 1, "learn_method": "exhaustion",
                    "bucket_source": "learned"},
            "in": {"deficit": 0.0, "bucket": PRIOR, "learned_count": 0, "learn_method": "none",
                   "bucket_source": "default"}}}))
    ct = CreditsStep(BandwidthProfile(TYPE, BASE, PEAK, PRIOR, "config", "config", "default"), str(tmp_path),
                       procfs=str(tmp_path), clock=lambda: 500.0)
    assert ct.restore({}, CounterTracker(0.6)) == "restored"
    state = ct.estimator.to_state()
    assert all(state[d].pop("trend") == {} for d in state)     # none saved: the trend starts afresh
    assert all(state[d].pop("sizes") == "" for d in state)     # none saved: the band starts from the prior
    assert state == {
        "out": {"deficit": 60e6, "bucket": LEARNED, "learned_count": 1, "learn_method": "exhaustion",
                "bucket_source": "learned"},
        "in": {"deficit": 0.0, "bucket": PRIOR, "learned_count": 0, "learn_method": "none",
               "bucket_source": "default"}}
    r = ct.estimator.update(0.0, {}, {}, None)
    assert (r["out"].state, r["out"].remaining_bytes, r["in"].state) == ("partial", LEARNED - 60e6, "full")
