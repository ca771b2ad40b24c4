"""The .rpm's own files under a real systemd: its scriptlets (sysusers user, preset, first start), its unit
and its bundled libraries running in the sandbox, stop, and erase.

What this cannot prove: no Amazon Linux 2023 (or Fedora) image can be fetched here, so this runs in the
tier's Debian 12 container, with Debian's rpm, Python 3.11 and python3-pyroute2/-boto3/-systemd/-bcrypt
standing in for AL2023's (3.9) and `--nodeps` (Debian's rpm database knows no AL2023 package). AL2023
ships systemd 252 as Debian 12 does, so the sandbox is applied by the same systemd version;
tests/packaging/test_rpm*.py keep the file list, requirements, rpmlint, the scriptlets against AL2023's
`disable *` preset, and the payload on Python 3.9 (make test39).
"""

from __future__ import annotations

import re
from typing import Iterator

import pytest

from tests.conftest import require_root_tools
from tests.packaging.debroot import build, copy_tree
from tests.support.podman import podman
from tests.systemd.conftest import SERVICE_IP, Box, Net, booted, journal_problems

pytestmark = pytest.mark.slow

UNIT = "/usr/lib/systemd/system/burstwatch.service"
# AL2023's 99-default-disable.preset: only the package's own 80-burstwatch.preset can enable it.
DEFAULT_DISABLE = "disable *\n"


@pytest.fixture(scope="module")
def rpm_box(image: str, net: Net, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    require_root_tools("rpmbuild", "rpm")
    base = tmp_path_factory.mktemp("tier-rpm")
    rpm = build("rpm", copy_tree(base / "tree"), base / "out")
    (base / "pkgs").mkdir()
    (base / "pkgs" / "burstwatch.rpm").write_bytes(rpm.read_bytes())
    with booted(image, net, base / "pkgs") as b:
        podman("exec", "-i", b.name, "sh", "-c", "cat > /usr/lib/systemd/system-preset/99-default-disable.preset",
               input=DEFAULT_DISABLE.encode())
        yield b


def test_rpm_install_enables_and_starts_the_service(rpm_box: Box) -> None:
    out = rpm_box.run("rpm", "-i", "--nodeps", "/debs/burstwatch.rpm", timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert rpm_box.sh("systemctl", "is-enabled", "burstwatch").strip() == "enabled", "80-burstwatch.preset"
    st = rpm_box.wait_active()
    assert st["SubState"] == "running"
    assert rpm_box.sh("rpm", "-qf", "--qf", "%{NAME}", UNIT) == "burstwatch", "the unit systemd runs is the rpm's"
    # /metrics (the stock conffile's 0.0.0.0:9786) from the peer, served by the rpm's bundled prometheus_client.
    text = rpm_box.net.lab.http_get(rpm_box.net.peer, f"http://{SERVICE_IP}:9786/metrics")
    assert "burstwatch_collector_success" in text
    pid = rpm_box.show("MainPID")["MainPID"]
    maps = rpm_box.sh("cat", f"/proc/{pid}/status")
    assert re.search(r"^CapEff:\s+0+$", maps, re.M) and re.search(r"^Seccomp:\s+2$", maps, re.M)


def test_rpm_service_stops_cleanly_and_erase_disables_it(rpm_box: Box) -> None:
    rpm_box.sh("systemctl", "restart", "burstwatch")
    rpm_box.wait_active()
    rpm_box.sh("systemctl", "stop", "burstwatch")
    assert rpm_box.show("Result")["Result"] == "success"
    rpm_box.sh("systemctl", "start", "burstwatch")
    rpm_box.wait_active()
    out = rpm_box.run("rpm", "-e", "burstwatch", timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert rpm_box.run("systemctl", "is-active", "burstwatch").stdout.decode().strip() in ("inactive", "unknown")
    assert rpm_box.run("test", "-e", UNIT).returncode != 0
    log = rpm_box.journal()
    assert "Started burstwatch.service" in log and journal_problems(log) == []
