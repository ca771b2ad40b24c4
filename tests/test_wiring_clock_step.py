"""A wall-clock step while the daemon is down (NTP correcting a bad clock, a VM restored from a snapshot)
does not change how the credit state is restored: the gap since the save is measured on CLOCK_BOOTTIME
(agent/writers/statefile.py boottime()), which settimeofday does not move. The pipeline the daemon builds
(wiring.build) runs on fixture /proc files with the credit service's boot clock injected, saves, and is
built again after 10 s of boot time with the wall clock stepped by a day either way."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from agent import config
from agent.wiring import Agent, Paths, build
from tests.support.daemon_config import lab_config, toml_text

HEADER = ("Inter-|   Receive                                                |  Transmit\n"
          " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
          "carrier compressed\n")
BOOT_ID = "5e1f3a2c-0000-4000-8000-000000000001"
GAP = 10.0          # seconds of boot time the daemon was down


class Host:
    def __init__(self, root: Path) -> None:
        self.proc, self.sys = root / "proc", root / "sys"
        (self.proc / "net").mkdir(parents=True)
        (self.proc / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT_ID + "\n")
        eth0 = self.sys / "class" / "net" / "eth0"
        eth0.mkdir(parents=True)
        (eth0 / "ifindex").write_text("2\n")

    def set(self, rx: int, tx: int) -> None:
        (self.proc / "net" / "dev").write_text(
            HEADER + f"  eth0: {rx} {rx // 1000} 0 0 0 0 0 0 {tx} {tx // 1000} 0 0 0 0 0 0\n")


def _agent(host: Host, state: Path, boot: Callable[[], float]) -> Agent:
    cfg = config.parse(toml_text(lab_config(state.parent, state_dir=state, interfaces=["eth0"], metrics=None,
                                            instance={"type": "m5.large"})))
    a = build(cfg, None, Paths(procfs=str(host.proc), sysfs=str(host.sys)))
    assert a.credits is not None
    a.credits.clock = a.credits.store.clock = boot     # the clock credit persistence measures gaps with
    return a


def _restored(host: Host, state: Path, boot: float, wall_step: float, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh daemon pipeline on a copy of the saved state, `boot` seconds of boot time after the save, with
    the wall clock stepped by `wall_step`; returns the restored estimate."""
    real = time.time
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real() + wall_step)
        a = _agent(host, state, lambda: boot)
        assert a.sampler is not None and a.credits is not None
        a.sampler.sample()                                  # the first sample restores the saved state
        assert a.credits.restore_note == "restored"
        return a.credits.estimator.to_state()


def test_a_wall_clock_step_during_downtime_leaves_the_gap_accounting_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(tmp_path)
    saved = tmp_path / "saved"
    boot = [5000.0]
    a = _agent(host, saved, lambda: boot[0])
    assert a.sampler is not None and a.credits is not None
    # 2 s at 1.2 GB/s each way on an m5.large (baseline 0.75 Gbit/s = 93.75 MB/s, peak 10 Gbit/s): a
    # deficit of ~2.2 GB builds, which 10 s of refill (0.94 GB) does not clear.
    rx = tx = 10**9
    for _ in range(21):
        host.set(rx, tx)
        a.sampler.sample()
        time.sleep(0.1)
        boot[0] += 0.1
        rx += 12 * 10**7
        tx += 12 * 10**7
    a.credits.save()
    before = a.credits.estimator.to_state()
    assert before["in"]["deficit"] > 0 and before["out"]["deficit"] > 0
    save_boot = boot[0]

    def copy(name: str) -> Path:
        return Path(shutil.copytree(saved, tmp_path / name))

    reference = _restored(host, copy("ref"), save_boot + GAP, 0.0, monkeypatch)
    # The refill over the gap was applied: the deficit is smaller than at the save, not gone.
    assert 0 < reference["in"]["deficit"] < before["in"]["deficit"]
    # The restore also counts the moment between reading the counters and the credit step (real time, a few
    # ms that differ between runs), so estimates are compared to within one second of refill; a day's step
    # counted as downtime would refill the whole deficit (+1 day) or none of the gap's 0.94 GB (-1 day).
    refill_1s = 0.75e9 / 8

    def same(state: Any) -> bool:
        return all(abs(state[d]["deficit"] - reference[d]["deficit"]) < refill_1s and
                   state[d]["bucket"] == reference[d]["bucket"] for d in ("in", "out"))

    for step in (+86400.0, -86400.0, +3.5e7):
        got = _restored(host, copy(f"step{step:+.0f}"), save_boot + GAP, step, monkeypatch)
        assert same(got), (step, got, reference)
    # ... while a different boot-time gap does change it (the comparison above can fail).
    assert not same(_restored(host, copy("longer"), save_boot + 10 * GAP, 0.0, monkeypatch))
