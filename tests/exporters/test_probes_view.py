"""The probes metrics view: per peer/direction figures, failures as 0, skips by reason, budget, archive."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from typing import Any, Optional

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.exporters.probes import ProbesView
from agent.iperf3.client import ProbeError
from agent.probes.archive import S3Archive
from agent.probes.scheduler import SKIP_REASONS, Scheduler
from agent.probes.service import ProbeService
from tests.probes.test_service import M5, Clock, FakeRunner, section

PEER = "10.0.0.2:5201"


def registry(view: ProbesView) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(view)
    return reg


def service(clock: Clock, runner: Any, credits: Any = None, archive: Optional[S3Archive] = None,
            budget: float = 1e15) -> ProbeService:
    cfg = section(("10.0.0.2",), hourly_budget_bytes=budget)
    sched = Scheduler.from_config(cfg, credits=lambda: credits, peak_bytes_per_second=lambda: M5.peak_bytes_per_second,
                                  clock=clock, rng=random.Random(2))
    return ProbeService(cfg, sched, runner=runner, profile=lambda: M5, peer_peak=lambda t: None, archive=archive)


def run_round(svc: ProbeService, clock: Clock) -> None:
    clock.t = max(clock.t, svc.scheduler.next_round)
    while True:
        r = svc.run_once()
        if r is None and not svc.scheduler.pending:
            return
        if r is None:
            clock.t += svc.scheduler.wait_seconds()      # the gap between probes


def test_successful_probes() -> None:
    clock = Clock()
    svc = service(clock, FakeRunner(gbps=8.0))
    run_round(svc, clock)
    reg = registry(ProbesView(svc.snapshot))
    g = reg.get_sample_value
    for d in ("out", "in"):
        labels = {"peer": PEER, "direction": d}
        assert g("burstwatch_probe_success", labels) == 1.0
        assert g("burstwatch_probe_throughput_bytes_per_second", labels) == pytest.approx(1e9)
        assert g("burstwatch_probe_expected_bytes_per_second", labels) == pytest.approx(1.25e9)
        assert g("burstwatch_probe_throughput_ratio", labels) == pytest.approx(0.8)
        assert g("burstwatch_probe_duration_seconds", labels) >= 0
        assert g("burstwatch_probe_last_run_timestamp_seconds", labels) > 1e9
        assert g("burstwatch_probe_last_bytes", labels) == pytest.approx(5e9)
        assert g("burstwatch_probe_runs_total", {**labels, "result": "success"}) == 1
    assert g("burstwatch_probe_retransmits", {"peer": PEER, "direction": "out"}) == 9
    assert g("burstwatch_probe_rtt_seconds", {"peer": PEER, "direction": "out"}) == pytest.approx(262e-6)
    assert g("burstwatch_probe_rtt_seconds", {"peer": PEER, "direction": "in"}) is None
    assert g("burstwatch_probe_budget_used_bytes") == pytest.approx(10e9)
    assert g("burstwatch_probe_budget_bytes") == 1e15
    assert g("burstwatch_probe_bytes_total", {"direction": "out"}) == pytest.approx(5e9)
    assert g("burstwatch_probe_peers", {"source": "config"}) == 1
    assert g("burstwatch_probe_peers", {"source": "discovered"}) == 0
    assert g("burstwatch_probe_peer_info", {"peer": PEER, "source": "config", "instance_type": ""}) == 1
    assert g("burstwatch_probe_rounds_total") == 1
    assert g("burstwatch_probe_running") == 0
    for reason in SKIP_REASONS:
        assert g("burstwatch_probe_skipped_total", {"reason": reason}) == 0
    # Discovery and the archive are not configured: their metrics are absent rather than misleading.
    assert g("burstwatch_probe_discovery_success") is None
    assert g("burstwatch_probe_archive_backlog") is None


def test_failed_probe_is_zero_and_leaves_out_what_it_could_not_measure() -> None:
    clock = Clock()
    svc = service(clock, FakeRunner(fail=ProbeError(PEER, "connection refused", "refused")))
    run_round(svc, clock)
    g = registry(ProbesView(svc.snapshot)).get_sample_value
    labels = {"peer": PEER, "direction": "out"}
    assert g("burstwatch_probe_success", labels) == 0.0
    assert g("burstwatch_probe_runs_total", {**labels, "result": "failure"}) == 1
    assert g("burstwatch_probe_duration_seconds", labels) is not None
    for name in ("throughput_bytes_per_second", "throughput_ratio", "retransmits", "rtt_seconds"):
        assert g(f"burstwatch_probe_{name}", labels) is None, name


def test_skips_by_reason() -> None:
    clock = Clock()
    credits = {"in": (100e9, 337.5e9), "out": (337.5e9, 337.5e9)}
    svc = service(clock, FakeRunner(), credits=credits)
    run_round(svc, clock)
    run_round(svc, clock)
    g = registry(ProbesView(svc.snapshot)).get_sample_value
    assert g("burstwatch_probe_skipped_total", {"reason": "credit_floor"}) == 4
    assert g("burstwatch_probe_skipped_total", {"reason": "budget"}) == 0
    assert g("burstwatch_probe_success", {"peer": PEER, "direction": "out"}) is None   # never ran


def test_archive_self_metrics(moto: str) -> None:
    archive = S3Archive("missing-bucket", instance_type="m5.large", region="us-east-1", endpoint_url=moto,
                        backlog=1, retry_pause=30.0)
    clock = Clock()
    svc = service(clock, FakeRunner(), archive=archive)
    archive.start()
    try:
        run_round(svc, clock)                 # two documents into a backlog of one: one dropped
        reg = registry(ProbesView(svc.snapshot))
        end = time.monotonic() + 20
        while reg.get_sample_value("burstwatch_probe_archive_failed_total") == 0 and time.monotonic() < end:
            time.sleep(0.05)
        g = reg.get_sample_value
        assert g("burstwatch_probe_archive_failed_total") >= 1
        assert g("burstwatch_probe_archive_uploaded_total") == 0
        assert g("burstwatch_probe_archive_dropped_total") == 1
        assert g("burstwatch_probe_archive_backlog") == 1
        assert g("burstwatch_probe_archive_last_success_timestamp_seconds") == 0
    finally:
        archive.stop(1.0)


def test_exposition_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make test-deps` installs Debian's prometheus")
    clock = Clock()
    svc = service(clock, FakeRunner())
    run_round(svc, clock)
    text = generate_latest(registry(ProbesView(svc.snapshot)))
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_view_without_a_service_yields_nothing() -> None:
    assert list(ProbesView(lambda: None).collect()) == []


def test_every_family_is_described_so_duplicates_are_refused() -> None:
    clock = Clock()
    view = ProbesView(service(clock, FakeRunner()).snapshot)
    described = {m.name for m in view.describe()}
    assert {"burstwatch_probe_success", "burstwatch_probe_runs", "burstwatch_probe_discovery_success",
            "burstwatch_probe_archive_uploaded"} <= described
    reg = registry(view)
    with pytest.raises(ValueError, match="Duplicated"):
        reg.register(ProbesView(lambda: None))
    collected = {m.name for m in view.collect()}
    assert collected <= described and "burstwatch_probe_archive_uploaded" not in collected
