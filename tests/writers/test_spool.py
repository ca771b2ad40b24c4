"""The on-disk spool: order across restarts, bounds by count and bytes, no torn record after kill -9,
damaged files set apart, failed writes counted (never raised)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.writers import spool as spoolmod
from agent.writers.spool import Spool, frame, unframe
from agent.writers.statefile import WRITE_ERRORS, JsonStore
from tests.conftest import ROOT


def test_frame_round_trip_and_damage_is_detected() -> None:
    data = frame(b"payload\nwith lines")
    assert unframe(data) == b"payload\nwith lines"
    assert unframe(data[:-1]) is None                      # cut short
    assert unframe(data[:-1] + b"X") is None               # changed byte
    assert unframe(b"") is None and unframe(b"BWSPOOL1 zz 3\nabc") is None


def test_records_come_back_in_order_after_a_restart_and_ids_keep_rising(tmp_path: Path) -> None:
    s = Spool(tmp_path / "q", "t", 100, 1 << 20)
    assert s.load() == []
    ids = [s.append(f"r{i}".encode())[0] for i in range(5)]
    assert ids == [1, 2, 3, 4, 5]
    s.remove(2)
    assert s.replace(4, b"r4-rest")
    again = Spool(tmp_path / "q", "t", 100, 1 << 20)
    assert again.load() == [(1, b"r0"), (3, b"r2"), (4, b"r4-rest"), (5, b"r4")]
    assert again.snapshot().replayed == 4
    assert again.append(b"new")[0] == 6                    # never reuses an id of an earlier run


def test_bounds_by_count_and_bytes_evict_the_oldest(tmp_path: Path) -> None:
    s = Spool(tmp_path / "q", "t", 3, 1 << 20)
    s.load()
    evicted = [s.append(b"x")[1] for _ in range(5)]
    assert evicted == [[], [], [], [1], [2]]
    st = s.snapshot()
    assert st.records == 3 and st.dropped["full"] == 2
    assert sorted(os.listdir(tmp_path / "q")) == ["0000000000000003.rec", "0000000000000004.rec",
                                                  "0000000000000005.rec"]

    size = len(frame(b"y" * 100))
    b = Spool(tmp_path / "b", "b", 100, 2 * size + 10)
    b.load()
    assert b.append(b"y" * 100) == (1, [])
    assert b.append(b"y" * 100) == (2, [])
    assert b.append(b"y" * 100) == (3, [1])
    assert b.snapshot().bytes == 2 * size
    assert b.append(b"z" * 10_000) == (None, [])            # larger than the whole spool: memory only
    assert b.snapshot().dropped["full"] == 2

    # a smaller bound at the next start trims what an earlier run left
    c = Spool(tmp_path / "q", "t", 2, 1 << 20)
    assert [i for i, _ in c.load()] == [4, 5]


def test_stray_temp_files_and_damaged_records_are_removed_at_load(tmp_path: Path) -> None:
    d = tmp_path / "q"
    s = Spool(d, "t", 100, 1 << 20)
    s.load()
    s.append(b"good")
    s.append(b"also good")
    (d / ".tmp-half-written").write_bytes(b"BWSPOOL1 0")
    rec = d / "0000000000000002.rec"
    rec.write_bytes(rec.read_bytes()[:-3])                  # a record damaged on disk
    (d / "README").write_text("not ours")                   # left alone
    again = Spool(d, "t", 100, 1 << 20)
    assert again.load() == [(1, b"good")]
    assert again.snapshot().dropped["corrupt"] == 1
    assert sorted(os.listdir(d)) == ["0000000000000001.rec", "README"]


def test_a_write_that_fails_is_counted_logged_once_and_not_raised(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    s = Spool(tmp_path / "q", "fails", 100, 1 << 20)
    s.load()
    before = WRITE_ERRORS.snapshot()["spool/fails"]
    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spoolmod.os, "fsync", full)
    for _ in range(5):
        assert s.append(b"x") == (None, [])
    assert WRITE_ERRORS.snapshot()["spool/fails"] == before + 5
    assert [n for n in os.listdir(tmp_path / "q") if n.startswith(".tmp")] == []   # no temp file left behind
    logged = [r for r in caplog.records if "spool/fails" in r.getMessage() and r.levelname == "ERROR"]
    assert len(logged) == 1 and "No space left" in logged[0].getMessage()
    monkeypatch.setattr(spoolmod.os, "fsync", real_fsync)
    assert s.append(b"y")[0] is not None
    assert any("works again" in r.getMessage() for r in caplog.records)


def test_a_spool_directory_that_cannot_exist_is_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    s = Spool(blocker / "q", "blocked", 10, 1 << 20)
    before = WRITE_ERRORS.snapshot()["spool/blocked"]
    assert s.load() == []
    assert s.append(b"x") == (None, [])
    assert WRITE_ERRORS.snapshot()["spool/blocked"] == before + 2


def test_json_store_counts_failed_saves_and_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = JsonStore(blocker / "x" / "state-under-a-file.json", "fmt/1")
    before = WRITE_ERRORS.snapshot()["state-under-a-file.json"]
    assert [store.save({"a": i}) for i in range(3)] == [False, False, False]
    assert WRITE_ERRORS.snapshot()["state-under-a-file.json"] == before + 3
    assert sum("state-under-a-file.json" in r.getMessage() for r in caplog.records if r.levelname == "ERROR") == 1
    ok = JsonStore(tmp_path / "fine.json", "fmt/1")
    assert ok.save({"a": 1}) and ok.load() == {"format": "fmt/1", "a": 1}


WRITER = """
import sys
from pathlib import Path
from agent.writers.spool import Spool
s = Spool(Path(sys.argv[1]), "kill", 1_000_000, 1 << 34)
n = len(s.load())
print("ready", flush=True)
while True:
    n += 1
    s.append(b"%d:" % n + b"z" * (n % 5000))
"""


def test_no_torn_record_after_kill_9_during_writes(tmp_path: Path) -> None:
    """Kill the writer at arbitrary moments, five times: what is on disk is always whole records 1..N."""
    d = tmp_path / "q"
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(d)], cwd=ROOT, stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(5)
        p.stdout.close()
        got = Spool(d, "kill", 1_000_000, 1 << 34).load()
        assert got, "the writer wrote nothing"
        for i, (rid, payload) in enumerate(got, 1):
            n, _, pad = payload.partition(b":")
            assert rid == i and int(n) == i and pad == b"z" * (i % 5000)
    assert not [n for n in os.listdir(d) if n.startswith(".tmp")]   # the last load removed any stray temp
