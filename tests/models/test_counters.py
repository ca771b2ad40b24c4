"""Counter deltas and rates: plain increases, 32-bit wraps, resets, re-created interfaces, disappearances."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.models.counters import WRAP32, CounterTracker, counter_delta
from agent.readers.netdev import NetDevCounters, parse_proc_net_dev

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def nd(rx: int, tx: int) -> NetDevCounters:
    return NetDevCounters(rx, rx // 1000, 0, 0, tx, tx // 1000, 0, 0)


@pytest.mark.parametrize(("prev", "cur", "dt", "expect"), [
    (100, 250, 1.0, (150, "ok")),
    (WRAP32 - 100, 50, 1.0, (150, "wrap")),              # 32-bit counter wrapped
    (10**12, 5000, 1.0, (5000, "reset")),                # 64-bit counter restarted from zero
    (10**12, 10**12 - 5, 1.0, (0, "reset")),             # garbage below: counts nothing
    (WRAP32 - 100, WRAP32 - 200, 0.001, (0, "reset")),   # a "wrap" of ~4 GB in 1 ms is absurd
    (3000, 500, 1.0, (500, "reset")),                    # small counter going down: a reset, not a wrap
])
def test_counter_delta(prev: int, cur: int, dt: float, expect: tuple[int, str]) -> None:
    assert counter_delta(prev, cur, dt, 50e9) == expect


def test_rates_over_the_window_and_reset_never_negative() -> None:
    t = CounterTracker(rate_window=2.0)
    t.update(0.0, {"eth0": (2, nd(0, 0))})
    t.update(1.0, {"eth0": (2, nd(1000, 2000))})
    t.update(2.0, {"eth0": (2, nd(3000, 4000))})
    assert t.instance_rates() == {"in": 1500.0, "out": 2000.0}
    d = t.update(3.0, {"eth0": (2, nd(500, 700))})            # driver reset: counters back near zero
    assert d["eth0"].event == "reset" and d["eth0"].counters.rx_bytes == 500
    rates = t.instance_rates()
    assert rates is not None and min(rates.values()) >= 0
    assert t.resets_total == {"eth0": 1}
    assert t.totals()["eth0"][0] == 3500                       # accounted bytes never go down


def test_recreated_interface_counts_its_new_counters_when_plausible() -> None:
    t = CounterTracker(rate_window=1.0)
    t.update(0.0, {"eth0": (2, nd(10**12, 10**12))})
    d = t.update(1.0, {"eth0": (7, nd(5000, 10**12 + 10))})   # new ifindex: counters restarted from zero
    assert d["eth0"].event == "recreated"
    assert d["eth0"].counters.rx_bytes == 5000                 # fits one interval: counted
    assert d["eth0"].counters.tx_bytes == 0                    # 1 TB in 1 s cannot be real: not invented


def test_interface_disappears_and_comes_back() -> None:
    t = CounterTracker(rate_window=1.0)
    t.update(0.0, {"eth0": (2, nd(100, 100))})
    assert t.update(1.0, {}) == {}
    assert "eth0" not in t.raw()
    assert t.update(2.0, {"eth0": (9, nd(5, 5))}) == {}         # back: a new baseline, no delta
    d = t.update(3.0, {"eth0": (9, nd(1005, 5))})
    assert d["eth0"].counters.rx_bytes == 1000


def test_parse_proc_net_dev_fixture() -> None:
    text = (FIXTURES / "proc_net_dev.txt").read_text()
    parsed = parse_proc_net_dev(text.split("\n", 1)[1])  # first line is the fixture's provenance header
    assert parsed["eth0"] == NetDevCounters(9876543210, 7654321, 1, 2, 1234567890, 3456789, 3, 4)
    assert parsed["lo"].rx_bytes == parsed["lo"].tx_bytes
    assert "docker0" in parsed
