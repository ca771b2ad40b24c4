"""Issue 22's targets against real components: the conntrack and PPS models fed from nftables limiters in a
namespace lab (tests/support/allowance_lab.py) and this host's real flows, asserted with a little slack.

Each test runs in 5-15 s on its own namespaces (10.77.0.0/24), removed even when it fails.
"""

from __future__ import annotations

import math
import subprocess
import time
from typing import Callable, Optional

import pytest

from agent.models.conntrack import LAB_WINDOW, ConntrackModel, ConntrackReading, running_out
from agent.models.flows import flow_count, top_owners
from agent.models.pps import PpsCeilingModel, bandwidth_explains
from agent.readers.flows import DiagFlowSource, ProcFlowSource
from tests.conftest import require_root_tools
from tests.support import allowance_lab as al
from tests.support.lab import Lab, run_in_ns

pytestmark = [pytest.mark.netns]

SAMPLE = 0.2            # seconds between samples, as the credit lab samples
LAB_HORIZON = 4.0       # ConntrackRunningOut's horizon at lab scale (the credit lab's alert horizon)


@pytest.fixture(autouse=True)
def _tools() -> None:
    require_root_tools("ip", "nft", "tc")


def sample_loop(seconds: float, step: Callable[[], bool]) -> None:
    """Call `step` every SAMPLE s for at most `seconds`, until it returns True."""
    deadline = time.monotonic() + seconds
    nxt = time.monotonic()
    while time.monotonic() < deadline:
        nxt += SAMPLE
        if step():
            return
        time.sleep(max(0.0, nxt - time.monotonic()))


# -- PPS ------------------------------------------------------------------------------------------------
def run_pps(rate: int, offered: float, seconds: float, size: int, tbf_bit: Optional[int] = None
            ) -> tuple[PpsCeilingModel, PpsCeilingModel, int, int]:
    """Blast UDP from peer to inst through the packet limiter (and a tbf on the peer's egress when given);
    feed the model every sample. Returns (model, a shadow model told bandwidth never explains anything,
    drops counted, tbf overlimits)."""
    with Lab() as lab:
        inst, peer, _ia, ib = al.pair(lab)
        al.install_table(lab, inst)
        al.add_pps_limiter(lab, inst, rate, 9000)
        if tbf_bit:
            lab.tbf(peer, ib, tbf_bit, 16_000, limit_bytes=64_000)
        model, shadow = PpsCeilingModel(), PpsCeilingModel()
        al.udp_blast(lab, peer, al.INST_ADDR, 9000, offered, seconds, size)
        last: dict[str, float] = {}
        end = time.monotonic() + seconds + 0.5

        def step() -> bool:
            t, c = al.read_counters(lab, inst)
            over = al.tc_overlimits(lab, peer, ib) if tbf_bit else 0
            now = {"t": t, "drop": c[al.PPS_COMMENT], "pass": c[al.PPS_PASSED_COMMENT], "over": over}
            if last:
                dt, passed, drops = now["t"] - last["t"], now["pass"] - last["pass"], int(now["drop"] - last["drop"])
                model.observe(dt, passed, drops, bandwidth_explains(now["over"] > last["over"], None))
                shadow.observe(dt, passed, drops, False)
            last.update(now)
            return time.monotonic() > end

        sample_loop(seconds + 2, step)
        return model, shadow, int(last["drop"]), int(last["over"])


def test_pps_ceiling_learned_within_ten_percent_of_the_limiter() -> None:
    model, _, drops, _ = run_pps(rate=2000, offered=5000, seconds=5.0, size=64)
    print(f"\nfigures pps: ceiling {model.ceiling:.0f}/s for a 2000/s limiter "
          f"({(model.ceiling or 0) / 2000 - 1:+.1%}), episodes {model.learned_count}, drops {drops}")
    assert drops > 5000
    assert model.ceiling is not None and model.learned_count >= 1
    assert abs(model.ceiling - 2000) / 2000 <= 0.10, (model.ceiling, model.candidates)


def test_no_ceiling_learned_when_bandwidth_shaping_drops_the_packets() -> None:
    # tbf at 2 Mbit/s lets ~240 datagrams of 1,000 bytes per second through; the limiter at 150/s drops
    # some of those too, so the PPS counter rises in the same samples as the shaper's: bandwidth explains it.
    model, shadow, drops, over = run_pps(rate=150, offered=1000, seconds=5.0, size=1000, tbf_bit=2_000_000)
    print(f"\nfigures tbf: learned {model.learned_count} (ceiling {model.ceiling}); without the bandwidth rule "
          f"{shadow.learned_count} episode(s), ceiling {shadow.ceiling}; tbf overlimits {over}, pps drops {drops}")
    assert over > 0 and drops > 0, (over, drops)
    assert model.ceiling is None and model.learned_count == 0, model.candidates
    # The rule did the work: the same samples, with bandwidth ignored, would have taught a ceiling.
    assert shadow.learned_count >= 1


# -- conntrack ------------------------------------------------------------------------------------------
class ConntrackRun:
    """A lab instance with a conntrack limit of `limit`, flows opened towards the peer, and the model fed
    every sample from the limiter's counter, the entries it applies to and the real flows."""

    def __init__(self, lab: Lab, limit: int) -> None:
        self.lab, self.limit = lab, limit
        self.inst, self.peer, _, _ = al.pair(lab)
        al.install_table(lab, self.inst)
        al.add_conntrack_limiter(lab, self.inst, limit)
        self.proc = al.anchor(lab, self.inst)
        al.flow_server(lab, self.peer, al.PEER_ADDR, [8001, 8002, 8003, 8004])
        self.model = ConntrackModel(LAB_WINDOW)
        self.readings: list[tuple[float, ConntrackReading]] = []
        self._last_drops: Optional[int] = None

    def open(self, count: int, rate: float, port: int = 8001, hold: float = 30.0) -> subprocess.Popen:
        return al.open_flows(self.lab, self.inst, al.PEER_ADDR, [("tcp", port, count)], rate, hold)

    def sample(self) -> ConntrackReading:
        t, c = al.read_counters(self.lab, self.inst)
        drops = c[al.CONNTRACK_COMMENT]
        available = self.limit - al.conntrack_entries(self.proc, al.PEER_ADDR)
        in_use = flow_count(ProcFlowSource(self.proc).flows())
        inc = 0 if self._last_drops is None else drops - self._last_drops
        self._last_drops = drops
        r = self.model.observe(t, available, inc, in_use=in_use)
        self.readings.append((t, r))
        return r


def full_moment(lines: list[str]) -> float:
    """When the table was full: the first refused attempt of any client (the moment the drops start)."""
    fails = [float(v[0]) for v in map(str.split, lines) if len(v) == 4 and v[1] == "fail"]
    assert fails, lines[-3:]
    return min(fails)


@pytest.mark.parametrize("churn", [False, True])
def test_conntrack_fill_forecast_and_learned_size(churn: bool) -> None:
    limit = 150
    with Lab() as lab:
        run = ConntrackRun(lab, limit)
        # The agent starts on a busy host: 40 % of the table already in use, so the largest level it sees
        # under-reads the size by 40 % until the table has been full once.
        al.wait_line(run.open(60, 200.0, port=8002), "done", 5)
        churner = None
        if churn:
            # bursts of 8 short flows (5 % of the table) held 0.3 s every 0.7 s, on top of the fill
            churner = al.churn_flows(lab, run.inst, al.PEER_ADDR, 8003, 8, 0.7, 0.3, 12.0)
        client = run.open(limit - 60 + 10, 20.0)      # a linear fill, 20 new flows per second, past full
        start = time.monotonic()
        sample_loop(10.0, lambda: run.sample().exceeded and run.model.learned_count > 0)
        lines = al.wait_line(client, "done", 10)
        full = full_moment(lines + (al.stop_and_read(churner) if churner else []))
        fill = full - start
        hits = n = 0
        for t, r in run.readings:
            if t < start + fill / 5 or t >= full:
                continue
            n += 1
            truth = full - t
            hits += abs(r.full_seconds - truth) <= max(2 * SAMPLE, 0.2 * truth)
        last = run.readings[-1][1]
        print(f"\nfigures conntrack fill (churn={churn}): forecast within max(2 samples, 20 %) in {hits}/{n} = "
              f"{hits / max(n, 1):.0%} of samples; size first {run.readings[0][1].size} (max_available), "
              f"learned {last.size} "
              f"({(last.size or 0) / limit - 1:+.1%} of {limit}) by {last.size_method}; fill {fill:.2f} s")
        first = run.readings[0][1].size
        assert first is not None and 0.4 * limit <= first <= limit - 57   # a lower bound first (churn: lower)
        assert last.size is not None and last.size_method == "exceeded", last
        assert abs(last.size - limit) / limit <= 0.10, last
        # The target (>= 80 %) on the steady fill; looser with churn on a loaded 2-core machine, where the fill
        # lasts ~4 s against a 3-s window (the credit zoo asserts its on/off drains as loosely)
        trace = [(round(t - start, 2), round(r.full_seconds, 2)) for t, r in run.readings]
        assert n >= 8 and hits / n >= (0.6 if churn else 0.8), (hits, n, trace)


def test_conntrack_seventy_percent_fill_does_not_run_out() -> None:
    limit = 150
    with Lab() as lab:
        run = ConntrackRun(lab, limit)
        client = run.open(int(0.7 * limit), 20.0)
        end = time.monotonic() + 0.7 * limit / 20.0 + 3.0     # the fill, then 3 s held at 70 %
        fired: list[float] = []

        def step() -> bool:
            r = run.sample()
            if running_out(r, LAB_HORIZON):
                fired.append(r.in_use_ratio or 0.0)
            return time.monotonic() > end

        sample_loop(12.0, step)
        client.kill()
        last = run.readings[-1][1]
        print(f"\nfigures conntrack 70 %: running-out samples {len(fired)}, last share {last.in_use_ratio:.2f}, "
              f"max share {max((r.in_use_ratio or 0) for _, r in run.readings):.2f}, "
              f"last forecast {last.full_seconds}, forecast-only (no share rule) samples "
              f"{sum(r.full_seconds <= LAB_HORIZON for _, r in run.readings)}")
        assert 0.6 <= (last.in_use_ratio or 0) <= 0.8, last
        assert math.isinf(last.full_seconds) or last.full_seconds > LAB_HORIZON, last
        assert fired == []


def test_top_flow_owners_match_the_flows_opened() -> None:
    with Lab() as lab:
        run = ConntrackRun(lab, 1000)
        plan = [("tcp", 8002, 30), ("udp", 8003, 20), ("tcp", 8001, 12), ("tcp", 8004, 4)]
        al.wait_line(al.open_flows(lab, run.inst, al.PEER_ADDR, plan, 400.0, hold=20), "done", 5)
        want = [("tcp", 8002, 30), ("udp", 8003, 20), ("tcp", 8001, 12)]
        owners = top_owners(ProcFlowSource(run.proc).flows(), 3)
        assert [(o.protocol, o.port, o.count) for o in owners] == want, owners
        assert all(o.direction == "out" and o.peers == ((al.PEER_ADDR, o.count),) for o in owners)

        def diag() -> list:
            src = DiagFlowSource()
            try:
                return src.flows()
            finally:
                src.close()

        owners = top_owners(run_in_ns(run.inst, diag, timeout=10), 3)
        assert [(o.protocol, o.port, o.count) for o in owners] == want, owners
        # The peer sees the TCP flows inbound, on its listening ports; its UDP ones are invisible there (one
        # unconnected server socket receives them all), a limit docs/allowances.md names.
        peer_proc = al.anchor(lab, run.peer)
        inbound = top_owners(ProcFlowSource(peer_proc).flows(), 3)
        assert [(o.direction, o.port, o.count) for o in inbound] == [("in", 8002, 30), ("in", 8001, 12),
                                                                     ("in", 8004, 4)], inbound
