"""The probe scheduler with a fake clock and seeded RNG: floor, would-cross-floor, budget, jitter, one at a time."""

from __future__ import annotations

import random
import statistics
from typing import Any, Optional

import pytest

from agent.models.credit_model import CreditReading
from agent.probes.scheduler import (
    BUDGET_WINDOW,
    SKIP_REASONS,
    Peer,
    Scheduler,
    credit_state,
    parse_peer,
)

GB = 1e9
BUCKET = 100 * GB           # a bucket of 100 GB per direction
PEAK = 1.25e9               # 10 Gbit/s in bytes/s: a 5 s probe is expected to move 6.25 GB


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(clock: Clock, credits: Any = None, peak: Optional[float] = PEAK, budget: float = 1e15,
         floor: float = 0.5, k: int = 1, interval: float = 900.0, seed: int = 1, directions=("out", "in"),
         busy=lambda: False, peers=("10.0.0.2",)) -> Scheduler:
    s = Scheduler(interval=interval, peers_per_round=k, duration=5.0, streams=4, credit_floor=floor,
                  hourly_budget_bytes=budget, credits=lambda: credits, peak_bytes_per_second=lambda: peak,
                  busy=busy, clock=clock, rng=random.Random(seed), directions=directions)
    s.set_peers([parse_peer(p) for p in peers])
    return s


def run_round(s: Scheduler, clock: Clock, nbytes: float = 0.0, success: bool = True) -> list[tuple[str, str]]:
    """Jump to the next round and run every probe it allows; returns (peer, direction) of those run."""
    clock.t = max(clock.t, s.next_round)
    ran = []
    while True:
        plan = s.poll()
        if plan is None:
            if not s.pending:
                return ran
            clock.t += s.wait_seconds()        # the gap before the round's next probe
            continue
        ran.append((plan.peer.key, plan.direction))
        s.finish(plan, success, nbytes)


def ratio(r_in: Optional[float], r_out: Optional[float]) -> dict[str, Any]:
    out = {}
    if r_in is not None:
        out["in"] = (r_in * BUCKET, BUCKET)
    if r_out is not None:
        out["out"] = (r_out * BUCKET, BUCKET)
    return out


# name, credits, peak, floor, budget, spent earlier this hour, probes that run, skips by reason
GATE_CASES = [
    ("full buckets run both directions", ratio(1.0, 1.0), PEAK, 0.5, 1e15, 0,
     ["out", "in"], {}),
    ("no credit model yet: nothing to gate on", None, PEAK, 0.5, 1e15, 0, ["out", "in"], {}),
    ("never-exhausting size (no bucket)", {"in": (None, None), "out": (None, None)}, PEAK, 0.5, 1e15, 0,
     ["out", "in"], {}),
    ("outbound below the floor stops both directions", ratio(1.0, 0.49), PEAK, 0.5, 1e15, 0,
     [], {"credit_floor": 2}),
    ("inbound below the floor stops both directions", ratio(0.2, 1.0), PEAK, 0.5, 1e15, 0,
     [], {"credit_floor": 2}),
    # 0.55 x 100 GB - 6.25 GB = 48.75 GB < 50 GB: this probe alone would cross the floor
    ("inbound probe would cross the floor; outbound fine", ratio(0.55, 1.0), PEAK, 0.5, 1e15, 0,
     ["out"], {"would_cross_floor": 1}),
    ("exactly at the floor after the probe still runs", ratio(0.5625, 0.5625), PEAK, 0.5, 1e15, 0,
     ["out", "in"], {}),
    ("floor 0 still refuses a probe that would empty the bucket", ratio(0.05, 1.0), PEAK, 0.0, 1e15, 0,
     ["out"], {"would_cross_floor": 1}),
    ("unknown peak: nothing expected, only the floor gates", ratio(0.55, 0.55), None, 0.5, 1e15, 0,
     ["out", "in"], {}),
    ("budget for one probe only", ratio(1.0, 1.0), PEAK, 0.5, 7 * GB, 0, ["out"], {"budget": 1}),
    ("budget spent earlier this hour", ratio(1.0, 1.0), PEAK, 0.5, 10 * GB, 5 * GB, [], {"budget": 2}),
    ("zero budget means no probes", ratio(1.0, 1.0), PEAK, 0.5, 0, 0, [], {"budget": 2}),
    ("zero budget, unknown peak", None, None, 0.5, 0, 0, [], {"budget": 2}),
    ("floor wins over budget when both apply", ratio(0.1, 1.0), PEAK, 0.5, 0, 0, [], {"credit_floor": 2}),
]


@pytest.mark.parametrize("name,credits,peak,floor,budget,spent,runs,skips", GATE_CASES,
                         ids=[c[0] for c in GATE_CASES])
def test_gates(name: str, credits: Any, peak: Optional[float], floor: float, budget: float, spent: float,
               runs: list[str], skips: dict[str, int]) -> None:
    clock = Clock()
    s = make(clock, credits, peak, budget, floor)
    if spent:
        s._spent.append((clock.t, spent))   # bytes of a probe earlier in the hour
    # Each probe moves what it was expected to move, so the budget sees real bytes.
    clock.t = s.next_round
    ran = []
    while True:
        plan = s.poll()
        if plan is None and s.pending:
            clock.t += s.wait_seconds()
            continue
        if plan is None:
            break
        ran.append(plan.direction)
        s.finish(plan, True, plan.expected_bytes or 1e6)
    assert ran == runs
    assert {k: v for k, v in s.skipped.items() if v} == skips


def test_credit_readings_are_accepted_as_the_credit_model_gives_them() -> None:
    def reading(d: str, rem: Optional[float], bucket: Optional[float]) -> CreditReading:
        r = None if rem is None or bucket is None else rem / bucket
        return CreditReading(d, 0.0, rem, bucket, r, float("inf"), float("inf"))

    assert credit_state({"in": reading("in", 30.0, 100.0), "out": reading("out", None, None)}) == {
        "in": (30.0, 100.0)}
    # Several network cards: the emptiest bucket of a direction decides.
    assert credit_state({"in:0": reading("in", 90.0, 100.0), "in:1": reading("in", 10.0, 100.0)}) == {
        "in": (10.0, 100.0)}
    clock = Clock()
    s = make(clock, {"in": reading("in", 40 * GB, BUCKET), "out": reading("out", BUCKET, BUCKET)})
    assert run_round(s, clock) == []
    assert s.skipped["credit_floor"] == 2


def test_budget_is_a_sliding_hour_of_actual_bytes() -> None:
    clock = Clock()
    s = make(clock, ratio(1.0, 1.0), budget=20 * GB, interval=900.0, directions=("out",))
    # Each probe really moves 8 GB (more than the 6.25 GB expected): the actual bytes are what count.
    assert run_round(s, clock, nbytes=8 * GB) == [("10.0.0.2:5201", "out")]
    first_done = clock.t
    assert run_round(s, clock, nbytes=8 * GB) == [("10.0.0.2:5201", "out")]
    assert s.budget_used() == 16 * GB
    # 16 GB used + 6.25 GB expected > 20 GB: skipped until the first probe leaves the window.
    assert run_round(s, clock) == []
    assert s.skipped["budget"] == 1
    clock.t = first_done + BUDGET_WINDOW + 0.001
    assert s.budget_used() == 8 * GB
    assert run_round(s, clock, nbytes=1 * GB) == [("10.0.0.2:5201", "out")]
    assert s.budget_used() == 9 * GB


def test_failed_probes_count_their_bytes_too() -> None:
    clock = Clock()
    s = make(clock, None, budget=10 * GB, directions=("out",))
    run_round(s, clock, nbytes=3 * GB, success=False)
    assert s.budget_used() == 3 * GB
    assert s.bytes_total == {"out": 3 * GB, "in": 0.0}


def test_unknown_peak_learns_the_expected_size_from_the_largest_probe() -> None:
    clock = Clock()
    s = make(clock, ratio(0.6, 0.6), peak=None, directions=("out",))
    assert s.expected_bytes("out") is None
    assert run_round(s, clock, nbytes=20 * GB)           # 60 GB left, 20 GB probe: fine
    assert s.expected_bytes("out") == 20 * GB
    assert run_round(s, clock) == []                     # 60 - 20 = 40 GB < 50 GB floor
    assert s.skipped["would_cross_floor"] == 1


def test_never_two_probes_at_once() -> None:
    clock = Clock()
    s = make(clock, None, k=2, peers=("10.0.0.2", "10.0.0.3"), interval=60.0)
    clock.t = s.next_round
    first = s.poll()
    assert first is not None and s.in_flight is first
    # The probe runs for three rounds' worth of time: every poll meanwhile says no.
    for _ in range(3):
        clock.t = s.next_round
        assert s.poll() is None
    assert s.skipped["busy"] == 3 * 2 * 2                # 3 rounds x 2 peers x 2 directions
    s.finish(first, True, 1e6)
    clock.t += s.gap
    assert s.poll() is not None                          # the queued rest of the first round


def test_never_two_at_once_over_a_long_random_run() -> None:
    """A whole day with random probe durations (some longer than the interval): at most one in flight."""
    clock = Clock()
    rng = random.Random(7)
    s = make(clock, None, k=3, peers=[f"10.0.0.{i}" for i in range(2, 12)], interval=60.0)
    running: Optional[Any] = None
    ends = 0.0
    started = 0
    while clock.t < 1000.0 + 86400:
        if running is not None and clock.t >= ends:
            s.finish(running, True, 1e6)
            running = None
        plan = s.poll()
        if plan is not None:
            assert running is None, "a second probe started while one was running"
            running, ends = plan, clock.t + rng.uniform(1, 90)
            started += 1
        clock.t += 0.5
    assert started > 500
    assert s.skipped["busy"] > 0


def test_external_busy_skips() -> None:
    clock = Clock()
    state = {"busy": True}
    s = make(clock, None, busy=lambda: state["busy"])
    assert run_round(s, clock) == []
    assert s.skipped["busy"] == 2
    state["busy"] = False
    assert len(run_round(s, clock)) == 2


def test_no_peers_counts_rounds() -> None:
    clock = Clock()
    s = make(clock, None, peers=())
    for _ in range(3):
        assert run_round(s, clock) == []
    assert s.skipped["no_peers"] == 3
    assert s.rounds == 3


def test_first_round_offsets_spread_over_the_interval() -> None:
    interval = 900.0
    offsets = []
    for seed in range(400):
        clock = Clock(0.0)
        offsets.append(make(clock, None, interval=interval, seed=seed).next_round)
    assert all(0 <= o < interval for o in offsets)
    # Roughly uniform: every tenth of the interval holds some agents (expected 40 each).
    counts = [sum(1 for o in offsets if i * 90 <= o < (i + 1) * 90) for i in range(10)]
    assert min(counts) >= 20, counts


def test_round_spacing_is_interval_plus_minus_jitter() -> None:
    clock = Clock(0.0)
    s = make(clock, None, interval=100.0, seed=3, peers=())
    starts = []
    for _ in range(500):
        clock.t = s.next_round
        starts.append(clock.t)
        s.poll()
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert min(gaps) >= 80.0 and max(gaps) <= 120.0
    assert statistics.pstdev(gaps) > 5.0                  # really jittered, not a fixed offset
    assert abs(statistics.mean(gaps) - 100.0) < 2.0       # and no drift of the average rate


def test_a_fleet_started_together_does_not_probe_in_lockstep() -> None:
    """100 agents booted at the same instant: after a day, no round start is shared by many agents."""
    interval = 900.0
    fleet = []
    for seed in range(100):
        clock = Clock(0.0)
        fleet.append((clock, make(clock, None, interval=interval, seed=seed, peers=())))
    starts: list[float] = []
    for clock, s in fleet:
        while s.next_round < 86400:
            clock.t = s.next_round
            if clock.t > 86400 - 3600:
                starts.append(clock.t)
            s.poll()
    starts.sort()
    # Over the last hour, in any 10 s window at most a few agents start a round (uniform: ~1.1 on average).
    worst = max(sum(1 for t in starts[i:] if t - starts[i] < 10.0) for i in range(len(starts)))
    assert worst <= 6, worst


def test_least_recently_probed_first_with_a_randomized_start() -> None:
    peers = [f"10.0.0.{i}" for i in range(2, 7)]
    firsts = set()
    for seed in range(20):
        clock = Clock()
        s = make(clock, None, k=1, peers=peers, seed=seed, directions=("out",))
        visited = [run_round(s, clock)[0][0] for _ in range(10)]
        # Round-robin: each peer once in every 5 rounds, in the same order twice.
        assert sorted(visited[:5]) == sorted(f"{p}:5201" for p in peers)
        assert visited[:5] == visited[5:]
        firsts.add(visited[0])
    assert len(firsts) >= 3        # different agents start at different peers


def test_skipped_peers_keep_their_place() -> None:
    peers = ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    control_clock, clock = Clock(), Clock()
    control = make(control_clock, None, k=1, peers=peers, directions=("out",), seed=9)
    expected = [run_round(control, control_clock) for _ in range(3)]
    state = {"credits": ratio(0.1, 1.0)}
    s = make(clock, None, k=1, peers=peers, directions=("out",), seed=9)
    s._credits = lambda: state["credits"]
    assert run_round(s, clock) == [] and run_round(s, clock) == []   # two rounds lost to low credit
    state["credits"] = ratio(1.0, 1.0)
    # ... and the order resumes where it was: the skipped peer goes first.
    assert [run_round(s, clock) for _ in range(3)] == expected


def test_peer_backoff_after_failures_and_busy_is_not_the_peers_fault() -> None:
    clock = Clock()
    s = make(clock, None, k=1, directions=("out",))
    pattern = []
    for _ in range(12):
        ran = run_round(s, clock, success=False)
        pattern.append(1 if ran else 0)
    # Failures 1, 2, 3, 4 -> sits out 0, 1, 3, 7 rounds.
    assert pattern == [1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]
    assert s.skipped["peer_backoff"] == 8
    # A success resets it.
    clock2 = Clock()
    s2 = make(clock2, None, k=1, directions=("out",))
    for _ in range(5):
        clock2.t = s2.next_round
        plan = s2.poll()
        assert plan is not None
        s2.finish(plan, False, 0, peer_fault=False)     # "busy": the peer is fine, just occupied
    assert s2.skipped["peer_backoff"] == 0


def test_backed_off_peer_gives_its_slot_to_another() -> None:
    clock = Clock()
    s = make(clock, None, k=1, peers=["10.0.0.2", "10.0.0.3"], directions=("out",), seed=5)
    seen: dict[str, int] = {}
    for _ in range(20):
        clock.t = s.next_round
        plan = s.poll()
        if plan is None:
            continue
        seen[plan.peer.host] = seen.get(plan.peer.host, 0) + 1
        s.finish(plan, plan.peer.host == "10.0.0.3", 1.0)   # .2 always fails
    assert seen["10.0.0.3"] > seen["10.0.0.2"]


def test_set_peers_merges_and_forgets() -> None:
    clock = Clock()
    s = make(clock, None, peers=())
    s.set_peers([parse_peer("10.0.0.2"), Peer("10.0.0.2", 5201, "m5.large", "discovered"),
                 Peer("10.0.0.3", 5201, "c5.large", "discovered")])
    assert [(p.key, p.source) for p in s.peers] == [("10.0.0.2:5201", "config"), ("10.0.0.3:5201", "discovered")]
    clock.t = s.next_round
    plan = s.poll()
    assert plan is not None
    s.set_peers([parse_peer("10.0.0.9")])            # the queued probes of departed peers are dropped
    s.finish(plan, False, 0)                          # finishing a departed peer's probe is harmless
    assert [p.key for p in s.peers] == ["10.0.0.9:5201"]
    assert not any(k != "10.0.0.9:5201" for k, _ in s._queue)


@pytest.mark.parametrize("text,host,port", [
    ("10.0.1.23", "10.0.1.23", 5201),
    ("10.0.1.24:5202", "10.0.1.24", 5202),
    ("[fd00::1]:5203", "fd00::1", 5203),
    ("fd00::1", "fd00::1", 5201),
    ("peer.internal", "peer.internal", 5201),
])
def test_parse_peer(text: str, host: str, port: int) -> None:
    p = parse_peer(text)
    assert (p.host, p.port) == (host, port)


@pytest.mark.parametrize("text", ["", ":5201", "10.0.0.1:0", "10.0.0.1:x"])
def test_parse_peer_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_peer(text)


def test_every_reason_is_preinitialised() -> None:
    s = make(Clock(), None)
    assert set(s.skipped) == set(SKIP_REASONS) and not any(s.skipped.values())


def test_probes_start_a_gap_apart() -> None:
    """After a probe ends, the next waits `gap` seconds (iperf3 -s answers "busy" to a test that follows the
    previous one too closely); wait_seconds() tells the service how long."""
    clock = Clock()
    s = make(clock, None, k=2, peers=("10.0.0.2", "10.0.0.3"))
    clock.t = s.next_round
    first = s.poll()
    assert first is not None
    clock.t += 5.0
    s.finish(first, True, 1e6)
    assert s.poll() is None and s.pending == 3
    assert s.wait_seconds() == pytest.approx(s.gap)
    clock.t += s.gap - 0.01
    assert s.poll() is None
    clock.t += 0.01
    assert s.poll() is not None
    assert not any(s.skipped.values())          # waiting out the gap is not a skip


# -- rate = "baseline": probes paced at the baseline (docs/probe-scheduling.md, "What probes cost") -----------
BASELINE = 93.75e6          # 0.75 Gbit/s in bytes/s (m5.large): a 5 s capped probe moves 468.75 MB


def make_rated(clock: Clock, rate: str, baseline: Optional[float] = BASELINE, **kw: Any) -> Scheduler:
    s = Scheduler(interval=900.0, peers_per_round=1, duration=5.0, streams=4, credit_floor=0.5,
                  hourly_budget_bytes=kw.pop("budget", 1e15), credits=lambda: kw.get("credits"),
                  peak_bytes_per_second=lambda: PEAK, baseline_bytes_per_second=lambda: baseline,
                  clock=clock, rng=random.Random(1), rate=rate)
    s.set_peers([parse_peer("10.0.0.2")])
    return s


def first_plans(s: Scheduler, clock: Clock) -> list[Any]:
    clock.t = max(clock.t, s.next_round)
    plans = []
    while True:
        plan = s.poll()
        if plan is None and s.pending:
            clock.t += s.wait_seconds()
            continue
        if plan is None:
            return plans
        plans.append(plan)
        s.finish(plan, True, plan.expected_bytes or 0.0)


def test_baseline_rate_caps_each_probe_and_its_expected_bytes() -> None:
    clock = Clock()
    plans = first_plans(make_rated(clock, "baseline"), clock)
    assert [p.direction for p in plans] == ["out", "in"]
    for p in plans:     # both directions carry the cap: iperf3 sends -b to the server for -R
        assert p.bitrate == int(BASELINE * 8 / 4)                  # 187.5 Mbit/s per stream, x 4 = baseline
        assert p.expected_bytes == pytest.approx(5.0 * BASELINE)   # not 5 s x the 10 Gbit/s peak
    peak_plans = first_plans(make_rated(clock, "peak"), clock)
    assert [(p.bitrate, p.expected_bytes) for p in peak_plans] == [(None, 5.0 * PEAK)] * 2


def test_budget_and_floor_reckon_with_the_cap() -> None:
    clock = Clock()
    # 1 GB fits two capped probes (0.47 GB each) but not one at the peak (6.25 GB).
    assert len(first_plans(make_rated(clock, "baseline", budget=1e9), clock)) == 2
    s = make_rated(clock, "peak", budget=1e9)
    assert first_plans(s, clock) == [] and s.skipped["budget"] == 2
    # 50.5 GB of 100 left: a capped probe (0.47 GB) stays above the 50 GB floor, a peak one would cross it.
    credits = ratio(0.505, 0.505)
    assert len(first_plans(make_rated(clock, "baseline", credits=credits), clock)) == 2
    s = make_rated(clock, "peak", credits=credits)
    assert first_plans(s, clock) == [] and s.skipped["would_cross_floor"] == 2


def test_unknown_baseline_runs_uncapped_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    baseline: list[Optional[float]] = [None]
    s = Scheduler(interval=900.0, peers_per_round=1, duration=5.0, streams=4, credit_floor=0.5,
                  hourly_budget_bytes=1e15, peak_bytes_per_second=lambda: PEAK,
                  baseline_bytes_per_second=lambda: baseline[0], clock=clock, rng=random.Random(1))
    assert s.rate == "baseline"                                  # the default, as in [probe]
    s.set_peers([parse_peer("10.0.0.2")])
    with caplog.at_level("INFO", logger="agent.probes.scheduler"):
        plans = first_plans(s, clock) + first_plans(s, clock)
    assert [(p.bitrate, p.expected_bytes) for p in plans] == [(None, 5.0 * PEAK)] * 4
    said = [r for r in caplog.records if "baseline is unknown" in r.getMessage()]
    assert len(said) == 1
    baseline[0] = BASELINE                                       # the profile learns it: capped from now on
    assert {p.bitrate for p in first_plans(s, clock)} == {int(BASELINE * 8 / 4)}


def test_rate_is_validated_and_reloadable() -> None:
    from agent.config import ProbeConfig

    with pytest.raises(ValueError):
        Scheduler(interval=900.0, peers_per_round=1, duration=5.0, streams=4, credit_floor=0.5,
                  hourly_budget_bytes=1e15, rate="fast")
    clock = Clock()
    s = make_rated(clock, "baseline")
    s.reconfigure(ProbeConfig(rate="peak"))
    assert s.rate == "peak" and s.bitrate() is None
    with pytest.raises(ValueError):
        s.reconfigure(ProbeConfig(rate="fast", interval=60.0))
    assert s.rate == "peak" and s.interval == 900.0


def zoned(clock: Clock, share: float, k: int = 1) -> Scheduler:
    s = make(clock, k=k, directions=("out",))
    s.zone, s.cross_az_share = "use1-az1", share
    s.set_peers([Peer("10.0.0.2", zone="use1-az1", source="discovered"),
                 Peer("10.0.1.2", zone="use1-az2", source="discovered"),
                 Peer("10.0.0.9")])                      # configured: no zone, taken as ours
    return s


def test_same_az_peers_only_by_default() -> None:
    """docs/probes.md, "Same-AZ peers": with cross_az_share 0 no probe crosses, however many rounds."""
    clock = Clock()
    s = zoned(clock, 0.0, k=3)
    probed = [key for _ in range(50) for key, _ in run_round(s, clock)]
    assert probed and "10.0.1.2:5201" not in probed
    assert {"10.0.0.2:5201", "10.0.0.9:5201"} == set(probed)


def test_cross_az_share_is_the_share_of_probes_that_cross() -> None:
    clock = Clock()
    s = zoned(clock, 0.25)
    probed = [key for _ in range(2000) for key, _ in run_round(s, clock)]
    crossed = sum(1 for key in probed if key == "10.0.1.2:5201") / len(probed)
    assert 0.2 <= crossed <= 0.3


def test_only_other_zones_and_no_share_skips_the_round_as_no_peers() -> None:
    clock = Clock()
    s = make(clock, directions=("out",))
    s.zone = "use1-az1"
    s.set_peers([Peer("10.0.1.2", zone="use1-az2", source="discovered")])
    assert run_round(s, clock) == []
    assert s.skipped["no_peers"] == 1
