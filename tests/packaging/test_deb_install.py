"""The .deb in a throwaway Debian 12 root: apt install, the installed CLI, the unit's ExecStart under a
real NOTIFY_SOCKET, upgrade with an edited conffile, remove and purge. Never touches this machine's /usr."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

from tests.conftest import require_root_tools
from tests.packaging.conftest import Debs
from tests.packaging.debroot import DebianRoot, exec_argv, kernel_has_mdwe, seconds, sh, unit_value, wait_until
from tests.support.lab import Lab

pytestmark = pytest.mark.slow

UNIT = "/lib/systemd/system/burstwatch.service"  # dh_installsystemd's place on Debian 12
CONFFILE = "/etc/burstwatch/burstwatch.toml"
ENABLE_LINK = "/etc/systemd/system/multi-user.target.wants/burstwatch.service"


@pytest.fixture(scope="module")
def installed(debs: Debs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebianRoot]:
    """Debian 12 minbase root with v1 installed by apt (dependencies resolved and installed too)."""
    require_root_tools("debootstrap", "unshare", "chroot", "tar")
    root = DebianRoot.fresh(tmp_path_factory.mktemp("debroot") / "root")
    try:
        out = root.install_deb(debs.v1)
        assert "Setting up burstwatch" in out.stdout
        yield root
    finally:
        root.close()



def test_install_creates_user_enables_unit_and_compiles(installed: DebianRoot) -> None:
    uid, gid = installed.ids("burstwatch")
    assert 0 < uid < 1000 and 0 < gid < 1000  # a system user
    passwd = installed.file("/etc/passwd").read_text(encoding="utf-8")
    assert re.search(r"^burstwatch:x:\d+:\d+:[^:]*:/var/lib/burstwatch:/usr/sbin/nologin$", passwd, re.M)
    # systemd is not PID 1 in a chroot: deb-systemd-helper still made the enable symlink, and
    # policy-rc.d / the missing /run/systemd/system kept anything from starting.
    link = installed.file(ENABLE_LINK)
    assert link.is_symlink() and os.readlink(link) == UNIT
    # py3compile byte-compiled the private tree for the installed Python.
    assert list(installed.file("/usr/lib/burstwatch/agent/__pycache__").glob("cli.cpython-3*.pyc"))
    status = installed.run("dpkg-query", "-W", "-f", "${Status} ${Conffiles}", "burstwatch").stdout
    assert status.startswith("install ok installed") and CONFFILE in status


def test_installed_cli_runs(installed: DebianRoot, debs: Debs) -> None:
    assert installed.run("burstwatch", "--version").stdout.strip() == f"burstwatch {debs.version1}"
    out = installed.run("burstwatch", "check-config")
    assert f"{CONFFILE}: ok" in out.stdout
    out = installed.run("burstwatch", "check-config", "--config", CONFFILE)
    assert f"{CONFFILE}: ok" in out.stdout
    bad = installed.file("/tmp/bad.toml")
    bad.write_text("sample_interval = 0\n", encoding="utf-8")
    out = installed.run("burstwatch", "check-config", "--config", "/tmp/bad.toml", check=False)
    assert out.returncode == 2 and "sample_interval" in out.stderr


@pytest.mark.netns
def test_installed_check_runs_as_the_service_user(installed: DebianRoot) -> None:
    with Lab() as lab:
        ns = lab.host("chk")
        uid, gid = installed.ids("burstwatch")
        out = installed.run("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                            "burstwatch", "check", "--json", netns=ns, sys_=True, check=False, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode in (0, 1, 2), out.stderr
    doc = json.loads(out.stdout)
    assert doc["exit_code"] == out.returncode
    assert {v["check"] for v in doc["verdicts"]} >= {"imds"}   # IMDS unreachable in the namespace: said so


def test_launcher_cannot_be_shadowed_by_a_stray_agent_module(installed: DebianRoot, debs: Debs) -> None:
    stray = installed.file("/tmp/stray/agent")
    stray.mkdir(parents=True)
    (stray / "__init__.py").write_text("raise SystemExit('shadowed by a stray agent package')\n",
                                       encoding="utf-8")
    out = installed.run("sh", "-c", "cd /tmp/stray && PYTHONPATH=/tmp/stray burstwatch --version", check=False)
    assert out.returncode == 0 and out.stdout.strip() == f"burstwatch {debs.version1}", out.stdout + out.stderr
    # and `agent` is not importable as a global module
    out = installed.run("python3", "-c", "import agent", check=False)
    assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr


def test_installed_unit_verifies_and_scores_ok(installed: DebianRoot) -> None:
    require_root_tools("systemd-analyze")
    # --root resolves ExecStart, /bin/kill, the user and the targets inside the installed root;
    # MANPATH lets the Documentation=man: check find the installed page.
    env = dict(os.environ, MANPATH=str(installed.file("/usr/share/man")))
    out = sh("systemd-analyze", "verify", f"--root={installed.path}", "burstwatch.service", env=env, check=False)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    out = sh("systemd-analyze", "security", "--offline=true", f"--root={installed.path}", "--threshold=20",
             "burstwatch.service", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    m = re.search(r"Overall exposure level for burstwatch.service: ([\d.]+) (\w+)", out.stdout)
    assert m and float(m.group(1)) <= 2.0 and m.group(2) == "OK", out.stdout
    assert "Service runs under a static non-root user identity" in out.stdout


# -- the unit's ExecStart under a real NOTIFY_SOCKET ----------------------------------------------

class Note(NamedTuple):
    state: str
    pid: int
    uid: int


class NotifySocket:
    """What systemd binds for Type=notify: an AF_UNIX datagram socket, with SO_PASSCRED so each
    message carries the sender's pid and uid (NotifyAccess=main accepts only the main pid's)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o777)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.notes: list[Note] = []

    def wait_for(self, state: str, timeout: float) -> Note:
        deadline = time.monotonic() + timeout
        while True:
            for note in self.notes:
                if state in note.state.splitlines():
                    return note
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {state} within {timeout:g}s; got {[n.state for n in self.notes]}")
            self.sock.settimeout(left)
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                continue
            pid = uid = -1
            for level, kind, blob in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid, uid, _gid = struct.unpack("iII", blob[:12])
            self.notes.append(Note(data.decode(), pid, uid))

    def close(self) -> None:
        self.sock.close()


# Applies the unit's UMask= and emulates MemoryDenyWriteExecute=yes with the kernel's own switch
# (PR_SET_MDWE, Linux 6.3+; kept across execve), then execs the unit's ExecStart.
MDWE_EXEC = """\
import ctypes, os, sys
os.umask(int(sys.argv[1], 8))
libc = ctypes.CDLL(None, use_errno=True)
applied = libc.prctl(65, 1, 0, 0, 0) == 0 and libc.prctl(66, 0, 0, 0, 0) == 1
sys.stderr.write("harness: MDWE %s\\n" % ("on" if applied else "unavailable"))
sys.stderr.flush()
os.execv(sys.argv[2], sys.argv[2:])
"""


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


@pytest.mark.netns
def test_exec_start_notifies_ready_watchdog_reload_and_stop(installed: DebianRoot, tmp_path: Path) -> None:
    """The installed unit's own ExecStart, User=, StateDirectory=, WatchdogSec=, ExecReload= and
    timeouts, run the way systemd would: as the service user with no capabilities, NoNewPrivileges
    and MDWE, in a network namespace with a real interface behind the default route."""
    require_root_tools("ip", "setpriv")
    unit = installed.file(UNIT).read_text(encoding="utf-8")
    assert unit_value(unit, "Type") == "notify"
    argv = exec_argv(unit)
    assert argv[0] == "/usr/bin/burstwatch" and argv[1] == "run"
    uid, gid = installed.ids(unit_value(unit, "User"))
    assert installed.ids(unit_value(unit, "Group"))[1] == gid
    state_dir = installed.file("/var/lib/" + unit_value(unit, "StateDirectory"))
    state_dir.mkdir(exist_ok=True)  # what systemd does for StateDirectory=
    os.chown(state_dir, uid, gid)
    state_dir.chmod(int(unit_value(unit, "StateDirectoryMode"), 8))
    watchdog = seconds(unit_value(unit, "WatchdogSec"))
    start_timeout = seconds(unit_value(unit, "TimeoutStartSec"))
    stop_timeout = seconds(unit_value(unit, "TimeoutStopSec"))

    # Off EC2 there is no instance type to model credits for: name one, as an operator would, so
    # the daemon has credit state to save (as the service user, under UMask=).
    conf = installed.file(CONFFILE)
    shipped_conf = conf.read_text(encoding="utf-8")
    conf.write_text(shipped_conf.replace('#type = "m5.large"', 'type = "m5.large"', 1), encoding="utf-8")

    # No DNS server in the namespace: make lookups fail at once (wsgiref's server_bind calls
    # getfqdn("0.0.0.0"), which would otherwise wait out the host resolver's timeout).
    resolv = installed.file("/etc/resolv.conf")
    saved_resolv = resolv.read_bytes() if resolv.exists() else None
    resolv.write_text("nameserver 127.0.0.1\n", encoding="utf-8")

    run_dir = installed.file("/run/bwtest")
    run_dir.mkdir(parents=True, exist_ok=True)
    notes = NotifySocket(run_dir / "notify")
    env = ["NOTIFY_SOCKET=/run/bwtest/notify", f"WATCHDOG_USEC={int(watchdog * 1e6)}",
           "STATE_DIRECTORY=/var/lib/burstwatch", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
    inner = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--bounding-set=-all",
             "--inh-caps=-all", "--no-new-privs", "env", "-i", *env,
             "/usr/bin/python3", "-I", "-c", MDWE_EXEC, unit_value(unit, "UMask"), *argv]
    log = tmp_path / "daemon.log"
    with Lab() as lab, open(log, "w", encoding="utf-8") as logf:
        ns, gw = lab.host("svc"), lab.host("gw")
        ifname, _ = lab.link(ns, gw, "10.231.0.2/24", "10.231.0.1/24")
        lab.run(ns, "ip", "route", "add", "default", "via", "10.231.0.1")
        # Off EC2 nothing answers at the IMDS address: make it fail at once rather than time out.
        lab.run(ns, "ip", "route", "add", "unreachable", "169.254.169.254/32")
        proc = subprocess.Popen(installed.wrap(inner, netns=ns, sys_=True), stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        lab.procs.append(proc)
        try:
            ready = notes.wait_for("READY=1", start_timeout)
            assert ready.pid == proc.pid, "READY=1 must come from the main process (NotifyAccess=main)"
            assert ready.uid == uid
            ping = notes.wait_for("WATCHDOG=1", watchdog)
            assert ping.pid == proc.pid

            metrics = lab.wait_http(ns, "http://127.0.0.1:9786/metrics")
            assert metric(metrics, "burstwatch_interface_present", interface=ifname) == 1.0, metrics
            assert re.search(r'^burstwatch_build_info\{.*version="', metrics, re.M)
            # Everything it wrote belongs to the service user.
            for path in state_dir.rglob("*"):
                assert path.stat().st_uid == uid, path

            # ExecReload, exactly as the unit says, with $MAINPID.
            reload = [a.replace("$MAINPID", str(proc.pid)).replace("${MAINPID}", str(proc.pid))
                      for a in exec_argv(unit, "ExecReload")]
            installed.run(*reload)
            assert wait_until(lambda: metric(lab.http_get(ns, "http://127.0.0.1:9786/metrics"),
                                             "burstwatch_config_reloads_total", result="success") == 1.0, 10)

            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(stop_timeout) == 0
            assert time.monotonic() - t0 < stop_timeout
            notes.wait_for("STOPPING=1", 1.0)
        finally:
            if proc.poll() is None:
                proc.kill()
            notes.close()
            if saved_resolv is not None:
                resolv.write_bytes(saved_resolv)
            conf.write_text(shipped_conf, encoding="utf-8")
    text = log.read_text(encoding="utf-8")
    assert "Traceback" not in text, text
    # What it saved on the way out belongs to the service user and is not world-readable (UMask=).
    saved = list(state_dir.rglob("*"))
    assert saved, "the daemon saves its credit state on stop"
    for path in saved:
        assert path.stat().st_uid == uid and not path.stat().st_mode & 0o007, path
    if kernel_has_mdwe():
        assert "harness: MDWE on" in text, text


# -- upgrade, remove, purge (last: it changes the root) -------------------------------------------

def test_upgrade_keeps_edited_conffile_and_state_then_purge_removes_them(installed: DebianRoot,
                                                                          debs: Debs) -> None:
    conf = installed.file(CONFFILE)
    shipped = conf.read_text(encoding="utf-8")
    edited = shipped.replace("#sample_interval = 1.0", "# edited by the operator\nsample_interval = 2.0", 1)
    assert edited != shipped
    conf.write_text(edited, encoding="utf-8")
    uid, gid = installed.ids("burstwatch")
    state_dir = installed.file("/var/lib/burstwatch")
    state_dir.mkdir(exist_ok=True)
    marker = state_dir / "upgrade-marker"
    marker.write_text("learned bucket", encoding="utf-8")
    os.chown(marker, uid, gid)

    # stdin is /dev/null: had dpkg asked about the conffile, the upgrade would fail here.
    out = installed.install_deb(debs.v2)
    assert f"Unpacking burstwatch ({debs.version2}) over ({debs.version1})" in out.stdout
    assert installed.run("burstwatch", "--version").stdout.strip() == f"burstwatch {debs.version2}"
    assert conf.read_text(encoding="utf-8") == edited
    assert marker.read_text(encoding="utf-8") == "learned bucket"
    assert installed.file(ENABLE_LINK).is_symlink()
    assert "sample_interval=2s" in installed.run("burstwatch", "check-config").stdout

    # remove keeps config and state; purge takes both (and the enable symlink) away.
    installed.apt("remove", "-y", "burstwatch")
    assert conf.exists() and marker.exists()
    assert not installed.file("/usr/bin/burstwatch").exists()
    installed.apt("purge", "-y", "burstwatch")
    assert not state_dir.exists()
    assert not installed.file("/etc/burstwatch").exists()
    assert not installed.file(ENABLE_LINK).is_symlink()
    assert not installed.file("/usr/lib/burstwatch").exists()
