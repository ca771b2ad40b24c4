"""The responder's hourly budget sized to this host's profile, over real sockets: it follows the profile, a
refusal for it is logged and counted with its reason, `burstwatch probe` prints that reason, and stock
iperf3 clients (Debian's 3.12 and a current 3.21+) are told "busy" and exit at once (docs/probes.md,
"Credit guard" and "What a refused client sees")."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from prometheus_client import CollectorRegistry

from agent.exporters.responder import ResponderView
from agent.iperf3.client import ProbeError, ProbeRequest, run_probe
from agent.models.profile import GBIT, BandwidthProfile
from tests.support.iperf3 import iperf3_bin, iperf3_client, iperf3_new_bin, responder, wait_until

ROOT = Path(__file__).resolve().parents[2]
PEAK = 10 * GBIT
# m5.large's figures: baseline 0.75 Gbit/s, so the default budget is 1 % of 337.5 GB = 3.375 GB an hour,
# 2.53 GB per source; a 3 s test at the 10 Gbit/s peak is expected to move 3.75 GB.
BURSTS = BandwidthProfile("m5.large", 0.75 * GBIT, PEAK, 337.5e9, "config", "config", "config")
FLAT = BandwidthProfile("lab.flat", PEAK, PEAK, None, "config", "config", "none")   # no bucket
AUTO = {"hourly_budget_bytes": "auto", "hourly_budget_per_source_bytes": "auto"}
VERSIONS: dict[str, Callable[[], str]] = {"3.12": iperf3_bin, "3.21": iperf3_new_bin}
REASON = ("hourly budget spent: 0 bytes of 2.53 GB sent to 127.0.0.1 in the last hour; this test is expected "
          "to move 3.75 GB (budget: 0.75 % of this host's hourly refill)")


def metrics(r: Any) -> Callable[..., Optional[float]]:
    registry = CollectorRegistry()
    registry.register(ResponderView(r.stats.snapshot))
    return registry.get_sample_value


def test_the_budget_follows_the_profile() -> None:
    """The wiring hands the profile as a callable; a reload or the fleet's consensus changes what it
    returns, and the budget in force (and its metric) follows at the next test or scrape."""
    current: list[Optional[BandwidthProfile]] = [BURSTS]
    with responder(profile=lambda: current[0], **AUTO) as r:
        get = metrics(r)
        assert get("burstwatch_responder_hourly_budget_bytes") == 3_375_000_000
        assert get("burstwatch_responder_hourly_budget_info", {"basis": "refill"}) == 1
        current[0] = FLAT                          # no bucket: only a fairness limit, 36 s of line rate
        snap = r.stats.snapshot()
        assert (snap.hourly_budget_bytes, snap.hourly_budget_per_source_bytes) == (45_000_000_000, 33_750_000_000)
        assert get("burstwatch_responder_hourly_budget_info", {"basis": "link"}) == 1
        assert get("burstwatch_responder_hourly_budget_info", {"basis": "refill"}) is None
        current[0] = None                          # unknown: the median burstable size's refill
        assert r.stats.snapshot().hourly_budget_basis == "median"
        r.reconfigure(r.cfg.__class__(listen=r.cfg.listen, hourly_budget_bytes=10**9), ["127.0.0.0/8"])
        assert (r.stats.snapshot().hourly_budget_bytes, r.stats.snapshot().hourly_budget_basis) == (10**9, "config")


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_a_budget_refusal_is_busy_to_stock_iperf3_and_explained_to_burstwatch(
        version: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent.responder")
    binary = VERSIONS[version]()
    with responder(profile=lambda: BURSTS, **AUTO) as r:
        port = r.address[1]
        t0 = time.monotonic()
        out = iperf3_client("127.0.0.1", port, "-t", "3", "-R", binary=binary, timeout=20)
        assert time.monotonic() - t0 < 5, "a refused stock client must not wait for anything"
        assert out.returncode == 1, out.stdout + out.stderr
        assert "the server is busy running a test. try again later" in out.stdout + out.stderr
        doc = json.loads(iperf3_client("127.0.0.1", port, "-t", "3", "-R", "-J", binary=binary).stdout)
        assert doc["error"] == "the server is busy running a test. try again later"
        with pytest.raises(ProbeError) as exc:
            run_probe(ProbeRequest(*r.address, streams=1, duration=3.0, reverse=True))
        assert exc.value.kind == "busy"              # the scheduler does not back off from the peer
        assert str(exc.value) == f"peer 127.0.0.1:{port}: refused: {REASON}"
        cli = subprocess.run([sys.executable, "-m", "agent", "probe", f"127.0.0.1:{port}", "-t", "3", "-R",
                              "-P", "1"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert cli.returncode == 1
        assert cli.stderr.strip() == f"burstwatch probe: peer 127.0.0.1:{port}: refused: {REASON}"
        # A test that fits is served: 1 s at the peak is expected to move 1.25 GB.
        out = iperf3_client("127.0.0.1", port, "-t", "1", "-R", binary=binary)
        assert out.returncode == 0, out.stdout + out.stderr
        wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
        assert metrics(r)("burstwatch_responder_refused_total", {"reason": "budget"}) == 4
    logged = [rec.getMessage() for rec in caplog.records if "reason=budget" in rec.getMessage()]
    assert logged and logged[0] == f"responder: refused peer=127.0.0.1 reason=budget: {REASON}"


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_without_a_bucket_a_stock_test_fits_the_fairness_limit(version: str) -> None:
    """baseline = peak: nothing to drain, so the budget is only a fairness limit (36 s of line rate an
    hour): iperf3's own 10 s test is expected to move max_bytes at most, and fits many times."""
    with responder(profile=lambda: FLAT, **AUTO) as r:
        out = iperf3_client("127.0.0.1", r.address[1], "-t", "1", "-R", binary=VERSIONS[version]())
        assert out.returncode == 0, out.stdout + out.stderr
        wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
        snap = r.stats.snapshot()
    assert snap.refused["budget"] == 0 and snap.hourly_budget_basis == "link"


@pytest.mark.parametrize(("profile", "says"), [
    (BURSTS, "(budget 3.38 GB each, a share of the refill)"),
    (FLAT, "(budget 45 GB each, a fairness limit: no burst bucket)"),
])
def test_status_says_what_the_budget_is(profile: BandwidthProfile, says: str) -> None:
    from prometheus_client import generate_latest

    from agent.exporters.status import build_status, render_text
    from agent.readers.daemon_metrics import parse_metrics

    with responder(profile=lambda: profile, **AUTO) as r:
        registry = CollectorRegistry()
        registry.register(ResponderView(r.stats.snapshot))
        doc = build_status(parse_metrics(generate_latest(registry).decode()))
    line = next(ln for ln in render_text(doc).splitlines() if ln.strip().startswith("responder"))
    assert says in line
    assert doc["responder"]["hourly_budget_basis"] == ("refill" if profile is BURSTS else "link")
