"""systemd/burstwatch.service: the settings the agent relies on, and `systemd-analyze security` scoring it OK.

`systemd-analyze verify` needs the unit's ExecStart and /bin/kill to exist, so it runs against the
installed package in tests/packaging/test_deb_install.py (`verify --root=` the Debian 12 root)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT, require_root_tools
from tests.packaging.debroot import exec_argv, seconds, sh, unit_value

UNIT = ROOT / "systemd" / "burstwatch.service"


@pytest.fixture(scope="module")
def unit() -> str:
    return UNIT.read_text(encoding="utf-8")


def service_keys(unit: str) -> set[str]:
    return {line.split("=", 1)[0].strip() for line in unit.splitlines()
            if "=" in line and not line.lstrip().startswith("#")}


def test_security_exposure_is_ok_offline() -> None:
    """systemd 252 (Debian 12) has `security --offline=true`: the unit file alone, no running manager."""
    require_root_tools("systemd-analyze")
    out = sh("systemd-analyze", "security", "--offline=true", "--threshold=20", str(UNIT), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    m = re.search(r"Overall exposure level for burstwatch.service: ([\d.]+) (\S+)", out.stdout)
    assert m, out.stdout
    assert float(m.group(1)) <= 2.0 and m.group(2) == "OK", out.stdout
    # What remains exposed is what the agent needs (the unit's header says why), nothing else.
    exposed = set(re.findall(r"^✗ (\S+)", out.stdout, re.M))
    assert exposed <= {"RootDirectory=/RootImage=", "RestrictAddressFamilies=~AF_NETLINK",
                       "RestrictAddressFamilies=~AF_UNIX", "RestrictAddressFamilies=~AF_(INET|INET6)",
                       "ProcSubset=", "PrivateNetwork=", "DeviceAllow=", "IPAddressDeny=", "UMask="}, exposed


def test_notify_watchdog_reload_and_restart(unit: str) -> None:
    assert unit_value(unit, "Type") == "notify"
    assert unit_value(unit, "NotifyAccess") == "main"
    assert 10 <= seconds(unit_value(unit, "WatchdogSec")) <= 120
    assert unit_value(unit, "Restart") == "on-failure"
    assert exec_argv(unit, "ExecReload") == ["/bin/kill", "-HUP", "$MAINPID"]
    assert exec_argv(unit) == ["/usr/bin/burstwatch", "run", "--config", "/etc/burstwatch/burstwatch.toml"]
    assert seconds(unit_value(unit, "TimeoutStopSec")) <= 15  # the daemon stops within 1.5 s
    assert unit_value(unit, "StateDirectory") == "burstwatch"
    assert unit_value(unit, "WantedBy") == "multi-user.target"


def test_privileges_and_sandbox(unit: str) -> None:
    assert unit_value(unit, "CapabilityBoundingSet") == ""
    assert unit_value(unit, "AmbientCapabilities") == ""
    assert unit_value(unit, "User") == "burstwatch"
    assert unit_value(unit, "RestrictAddressFamilies").split() == ["AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"]
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("PrivateTmp", "yes"), ("PrivateDevices", "yes"), ("MemoryDenyWriteExecute", "yes"),
                       ("RestrictNamespaces", "yes"), ("LockPersonality", "yes"), ("RestrictRealtime", "yes"),
                       ("RestrictSUIDSGID", "yes"), ("SystemCallArchitectures", "native"),
                       ("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"),
                       ("ProtectControlGroups", "yes"), ("ProtectProc", "invisible")):
        assert unit_value(unit, key) == value, key
    assert "@system-service" in unit_value(unit.replace("SystemCallFilter=~", "SystemCallDeny="),
                                           "SystemCallFilter")
    keys = service_keys(unit)
    # It monitors the host's NICs; /proc/net/dev and /proc/stat must stay visible.
    assert "PrivateNetwork" not in keys
    assert "ProcSubset" not in keys
    assert "DynamicUser" not in keys


def test_header_explains_the_choices(unit: str) -> None:
    header = "\n".join(line for line in unit.splitlines() if line.startswith("#"))
    for topic in ("CapabilityBoundingSet", "PrivateNetwork", "ProcSubset", "MemoryDenyWriteExecute",
                  "DynamicUser", "RestrictAddressFamilies", "net/ethtool/ioctl.c", "systemd-analyze security"):
        assert topic in header, topic


def test_launcher_is_what_exec_start_runs() -> None:
    launcher = ROOT / "packaging" / "bin" / "burstwatch"
    first = launcher.read_text(encoding="utf-8").splitlines()[0]
    # isolated (no PYTHONPATH, user site or CWD on sys.path), and no .pth file runs (-S)
    assert first == "#!/usr/bin/python3 -IS"
    assert "/usr/lib/burstwatch" in launcher.read_text(encoding="utf-8")


def test_the_launcher_finds_the_distributions_libraries_without_site() -> None:
    """-S leaves site-packages off sys.path; the launcher adds them back (without their .pth files), so the
    daemon's libraries import: here Debian's own, as the .deb depends on them."""
    code = (ROOT / "packaging" / "bin" / "burstwatch").read_text(encoding="utf-8")
    code = code.replace('LIBDIR = "/usr/lib/burstwatch"', f"LIBDIR = {str(ROOT)!r}")
    code = code.replace("from agent.cli import main  # noqa: E402\n\nsys.exit(main())",
                        "import prometheus_client, psutil, systemd.daemon; print(prometheus_client.__file__)")
    out = subprocess.run(["/usr/bin/python3", "-IS", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("/usr/lib/python3/dist-packages/"), out.stdout + out.stderr


def test_one_malloc_arena_wherever_the_daemon_runs(unit: str) -> None:
    """The unit and the container image give the daemon the same allocator setting (and the bench reads
    the unit's)."""
    assert "Environment=MALLOC_ARENA_MAX=1" in unit.splitlines()
    containerfile = (ROOT / "packaging" / "container" / "Containerfile").read_text(encoding="utf-8")
    assert any(line.startswith("ENV ") and "MALLOC_ARENA_MAX=1" in line.split() for line in containerfile.splitlines())
