"""A state directory that is full (ENOSPC) or read-only: the real daemon keeps sampling and publishing, logs
each file's failure once, counts every failed write in burstwatch_state_write_errors_total{file}, and saves
again once the directory is writable. The filesystem is a tiny tmpfs (or a read-only bind mount) in a private
mount namespace of the daemon's own (`unshare -m`): nothing outside the test sees it, and it goes with the
process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, scrape_metrics, wait_port, wait_until
from tests.support.daemon_config import daemon_config

pytestmark = [pytest.mark.netns, pytest.mark.slow]  # root, a private mount namespace (unshare -m)

# Lab timings: sample_interval 0.25 s (EC2 default 1 s), [credits] save_interval 0.5 s (default 5 s),
# CloudWatch period 1 s (default 60 s).
SETUP = {
    # 64 KiB of tmpfs, filled to the last block by a filler file: every write of state gets ENOSPC.
    "enospc": 'mount -t tmpfs -o size=64k,mode=0755 bw-state "$D" && '
              '(dd if=/dev/zero of="$D/filler" bs=4096 2>/dev/null || true)',
    # The directory bind-mounted onto itself, read-only: every write gets EROFS.
    "readonly": 'mount --bind "$D" "$D" && mount -o remount,bind,ro "$D"',
}
UNDO = {"enospc": ["rm", "-f", "{d}/filler"], "readonly": ["mount", "-o", "remount,bind,rw", "{d}"]}
ERRNO_TEXT = {"enospc": "No space left on device", "readonly": "Read-only file system"}




@pytest.mark.parametrize("fault", ["enospc", "readonly"])
def test_daemon_rides_out_a_full_or_read_only_state_dir(moto: str, tmp_path: Path, fault: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace (CI runs as root)")
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            pytest.fail(f"missing {tool} (util-linux)")
    state = tmp_path / "state"
    state.mkdir()
    port = free_port()
    cfg = daemon_config(tmp_path, sample_interval=0.25, state_dir=state, metrics={"listen": f"127.0.0.1:{port}"},
                        instance={"type": "m5.large"}, credits={"save_interval": 0.5},
                        cloudwatch={"enabled": True, "endpoint_url": moto, "region": "us-east-1", "period": 1,
                                    "flush_interval": 1})
    log = tmp_path / "agent.log"
    script = SETUP[fault] + ' && exec "$@"'
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                             sys.executable, "-m", "agent", "run", "--config", str(cfg)],
                            cwd=ROOT, env=dict(os.environ, D=str(state)), stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"))
    try:
        wait_port("127.0.0.1", port)
        m0 = scrape_metrics(port)
        errors = 'burstwatch_state_write_errors_total{file="%s"}'
        wait_until(lambda: scrape_metrics(port)[errors % "credits.json"] >= 8, 20, "eight failed credit saves")
        wait_until(lambda: scrape_metrics(port)[errors % "spool/cloudwatch"] >= 3, 20, "three failed spool writes")
        m1 = scrape_metrics(port)
        # It kept sampling, and CloudWatch got its datapoints from memory.
        assert m1["burstwatch_samples_total"] >= m0["burstwatch_samples_total"] + 8
        assert m1['burstwatch_collector_success{collector="netdev"}'] == 1.0
        wait_until(lambda: scrape_metrics(port)["burstwatch_cloudwatch_datapoints_published_total"] > 0, 20,
              "CloudWatch publishing without the spool")
        assert not (state / "credits.json").exists()       # the host's view: the fault is the daemon's only
        text = log.read_text()
        for name in ("credits.json", "spool/cloudwatch"):
            lines = [ln for ln in text.splitlines() if " ERROR " in ln and f"file={name!r}" in ln]
            assert len(lines) == 1, lines                  # logged once, not once per save
            assert ERRNO_TEXT[fault] in lines[0]

        # The directory becomes writable again: saving resumes, and says so once.
        undo = [a.format(d=state) for a in UNDO[fault]]
        subprocess.run(["nsenter", "-t", str(proc.pid), "-m", *undo], check=True, timeout=10)
        wait_until(lambda: "credits.json works again" in log.read_text(), 10, "the recovery line")
        inside = Path(f"/proc/{proc.pid}/root{state}/credits.json")
        saved = json.loads(inside.read_text())
        assert saved["format"] == "burstwatch-credits/1"
        errors = scrape_metrics(port)['burstwatch_state_write_errors_total{file="credits.json"}']

        def version() -> tuple[int, int]:
            st = inside.stat()                             # each save renames a new file into place
            return st.st_ino, st.st_mtime_ns

        # Two more saves have happened (proof, not a pause: save_interval is 0.5 s), and none failed.
        for _ in range(2):
            last = version()
            wait_until(lambda last=last: version() != last, 10, "another credit save")
        assert scrape_metrics(port)['burstwatch_state_write_errors_total{file="credits.json"}'] == errors
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    # The mount namespace went with the process: nothing is left mounted on the host.
    assert str(state) not in Path("/proc/self/mounts").read_text()
