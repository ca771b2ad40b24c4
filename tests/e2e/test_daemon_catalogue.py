"""The real `burstwatch run` on current-generation types off EC2, with no AWS permission: the bundled catalogue
alone gives each its published baseline and peak, on /metrics and in `burstwatch status` (issue 30). A type the
catalogue lacks says what to do, in the log and in `status`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from agent.models.catalogue import UNKNOWN_TYPE_REMEDY
from tests.conftest import ROOT, scrape_metrics
from tests.support.daemon_config import daemon_config

pytestmark = pytest.mark.slow  # four real daemons on loopback, ~10 s

# AWS's published figures for these sizes (DescribeInstanceTypes NetworkCards[0], in the catalogue's source,
# moto 5.2.5): Gbit/s baseline, peak. None of the three was in the catalogue made from moto 5.0.22.
TYPES = {"m8i.large": (0.937, 12.5), "c8gn.large": (6.25, 30.0), "m9g.large": (1.0, 15.0)}
UNKNOWN = "x99.large"
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def status(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", "status", "--config", str(cfg), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=ENV)


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, int, Path]]]:
    """One daemon per type, all at once: `[instance] type` set, IMDS off (off EC2: no region, so no
    DescribeInstanceTypes call and no credentials needed), /metrics on a free loopback port."""
    procs, out = [], {}
    try:
        for itype in [*TYPES, UNKNOWN]:
            tmp = tmp_path_factory.mktemp(itype.replace(".", "-"))
            cfg = daemon_config(tmp, sample_interval=0.5, instance={"type": itype})
            port = int(cfg.read_text().split('listen = "127.0.0.1:')[1].split('"')[0])
            log = tmp / "agent.log"
            procs.append(subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)], cwd=ROOT,
                                          env=ENV, stdout=subprocess.DEVNULL, stderr=open(log, "wb")))
            out[itype] = (cfg, port, log)
        deadline = time.monotonic() + 60
        for (cfg, _, log), proc in zip(out.values(), procs):
            while status(cfg).returncode != 0:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        yield out
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("itype", list(TYPES))
def test_current_types_get_credit_bars_against_their_published_figures(
        daemons: dict[str, tuple[Path, int, Path]], itype: str) -> None:
    cfg, port, log = daemons[itype]
    baseline, peak = TYPES[itype]
    m = scrape_metrics(port)
    for d in ("in", "out"):
        assert m[f'burstwatch_bandwidth_baseline_bytes_per_second{{direction="{d}",source="catalogue"}}'] == \
            pytest.approx(baseline * 1e9 / 8)
        assert m[f'burstwatch_bandwidth_peak_bytes_per_second{{direction="{d}",source="catalogue"}}'] == \
            pytest.approx(peak * 1e9 / 8)
        assert m[f'burstwatch_bandwidth_burstable{{direction="{d}"}}'] == 1
        assert 0 < m[f'burstwatch_credit_remaining_ratio{{direction="{d}"}}'] <= 1
    text = status(cfg).stdout
    lines = text.splitlines()
    assert f"off EC2  type {itype}" in lines[0], text
    assert "bandwidth from catalogue, DescribeInstanceTypes skipped" in text, text
    bars = [ln for ln in lines if ln.lstrip().startswith(("in  [", "out [")) and "#" in ln]
    assert len(bars) == 2 and all("% of " in b and "Gbit (default)" in b for b in bars), text
    assert text.count(f"(baseline {baseline:.3g} Gbit/s [catalogue], peak {peak:.3g} Gbit/s [catalogue])") == 2, text
    doc = json.loads(status(cfg, "--json").stdout)
    for v in doc["directions"].values():
        assert v["baseline_bytes_per_second"] == pytest.approx(baseline * 1e9 / 8)
        assert v["peak_bytes_per_second"] == pytest.approx(peak * 1e9 / 8)
        # the default bucket: one hour of baseline (docs/instance.md)
        assert v["bucket_bytes"] == pytest.approx(baseline * 1e9 / 8 * 3600)
    assert "not in the bundled catalogue" not in log.read_text()


@pytest.mark.slow
def test_a_type_the_catalogue_lacks_says_what_to_do(daemons: dict[str, tuple[Path, int, Path]]) -> None:
    cfg, port, log = daemons[UNKNOWN]
    m = scrape_metrics(port)
    assert not any(k.startswith("burstwatch_bandwidth_baseline_bytes_per_second") for k in m)
    text = status(cfg).stdout
    assert "no profile: no estimate" in text, text
    assert f"no bandwidth figures for type {UNKNOWN}: {UNKNOWN_TYPE_REMEDY}" in text, text
    assert "ec2:DescribeInstanceTypes" in UNKNOWN_TYPE_REMEDY and "[instance.bandwidth]" in UNKNOWN_TYPE_REMEDY
    logged = log.read_text()
    assert f"instance_type={UNKNOWN} is not in the bundled catalogue (moto 5.2.5 " in logged, logged
    assert logged.count(UNKNOWN_TYPE_REMEDY) >= 2, logged    # the catalogue's warning and the profile line
