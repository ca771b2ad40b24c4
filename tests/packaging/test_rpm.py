"""The .rpm for Amazon Linux 2023: file list (the .deb's layout), scriptlets, dependencies, rpmlint,
and that its private tree (agent + bundled wheels) runs the CLI from the package's own files."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_root_tools
from tests.packaging.conftest import Debs
from tests.packaging.debroot import build, copy_tree, read_version, sh


@pytest.fixture(scope="module")
def rpm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_root_tools("rpmbuild", "rpm")
    base = tmp_path_factory.mktemp("rpm")
    return build("rpm", copy_tree(base / "tree"), base / "out")


def query(rpm: Path, *args: str) -> str:
    return sh("rpm", "-qp", *args, str(rpm)).stdout


def test_rpm_name_and_version_come_from_agent_init(rpm: Path) -> None:
    version = read_version()
    assert rpm.name == f"burstwatch-{version}-1.noarch.rpm"
    assert query(rpm, "--qf", "%{NAME} %{VERSION} %{ARCH}") == f"burstwatch {version} noarch"


def test_rpm_file_list(rpm: Path) -> None:
    files = set(sh("rpm", "-qlp", str(rpm)).stdout.split())
    for path in ("/usr/bin/burstwatch", "/etc/burstwatch/burstwatch.toml", "/usr/lib/systemd/system/burstwatch.service",
                 "/usr/lib/systemd/system-preset/80-burstwatch.preset", "/usr/lib/sysusers.d/burstwatch.conf",
                 "/usr/lib/burstwatch/agent/__init__.py", "/usr/lib/burstwatch/agent/cli.py",
                 "/usr/lib/burstwatch/vendor/prometheus_client/__init__.py",
                 "/usr/lib/burstwatch/vendor/tomli/__init__.py",
                 "/usr/share/doc/burstwatch/install.md", "/usr/share/man/man1/burstwatch.1.gz",
                 "/usr/share/burstwatch/burstwatch.toml"):
        assert path in files, path
    for shared in ("packaging/prometheus/burstwatch.rules.yml", "packaging/grafana/burstwatch-dashboard.json",
                   "packaging/grafana/burstwatch-fleet-dashboard.json"):
        assert (ROOT / shared).exists(), shared
        assert f"/usr/share/burstwatch/{Path(shared).name}" in files, shared
    assert not [f for f in files if "site-packages" in f or f.endswith(".pyc")]
    # the config is %config(noreplace): rpm keeps an edited one on upgrade (rpmnew for the new default)
    flags = dict(line.split(" ", 1)[::-1] for line in
                 query(rpm, "--qf", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]").splitlines() if " " in line)
    assert flags["/etc/burstwatch/burstwatch.toml"] == "cn"
    # only the state directory is the service user's, and systemd makes it (StateDirectory=)
    owners = set(query(rpm, "--qf", "[%{FILEUSERNAME}\n]").split())
    assert owners == {"root"}


def test_rpm_layout_matches_the_deb(rpm: Path, debs: Debs) -> None:
    """Same files in the same places; the differences are each distribution's own conventions."""
    modes = query(rpm, "--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]").splitlines()
    rpm_files = {line.split(" ", 1)[1] for line in modes if not line.startswith("d")}
    listing = sh("dpkg-deb", "-c", str(debs.v1)).stdout
    deb_files = {line.split()[-1].lstrip(".") for line in listing.splitlines() if not line.startswith("d")}
    # Debian 12 keeps units in /lib (dh_installsystemd) and adds its own copyright, changelog,
    # byte-compile hook and lintian overrides.
    debian_only = {"/usr/share/doc/burstwatch/changelog.gz", "/usr/share/doc/burstwatch/copyright",
                   "/usr/share/python3/runtime.d/burstwatch.rtupdate", "/usr/share/lintian/overrides/burstwatch"}
    normalized = {re.sub(r"^/lib/systemd/", "/usr/lib/systemd/", f) for f in deb_files} - debian_only
    assert normalized <= rpm_files, normalized - rpm_files
    # The .rpm adds the bundled wheels and the preset that enables the unit (AL2023 disables by default).
    rpm_only = {f for f in rpm_files - normalized if not f.startswith("/usr/lib/burstwatch/vendor/")}
    assert rpm_only == {"/usr/lib/systemd/system-preset/80-burstwatch.preset"}, rpm_only


def test_rpm_scriptlets(rpm: Path) -> None:
    scripts = query(rpm, "--scripts")
    pre = scripts.split("postinstall scriptlet")[0]
    assert "useradd -r -g burstwatch -d /var/lib/burstwatch -s /sbin/nologin" in pre
    assert "groupadd -r burstwatch" in pre
    post = scripts.split("postinstall scriptlet")[1].split("preuninstall scriptlet")[0]
    assert "compileall" in post
    assert "preset burstwatch.service" in post or "install-system-units burstwatch.service" in post
    assert "systemctl start burstwatch.service" in post and "[ $1 -eq 1 ]" in post
    preun = scripts.split("preuninstall scriptlet")[1].split("postuninstall scriptlet")[0]
    assert "disable --now burstwatch.service" in preun or "remove-system-units" in preun
    postun = scripts.split("postuninstall scriptlet")[1]
    assert "try-restart burstwatch.service" in postun or "mark-restart-system-units" in postun
    assert "rm -rf /usr/lib/burstwatch" in postun and "[ $1 -eq 0 ]" in postun
    assert not re.search(r"^\s*rm\b.*/var/lib/burstwatch", postun, re.M)  # state is kept (no purge in rpm)


def test_rpm_requires_amazon_linux_2023_packages(rpm: Path) -> None:
    requires = {re.split(r"\s", line.strip())[0] for line in query(rpm, "-R").splitlines()}
    assert {"python3", "python3-pyroute2", "python3-boto3", "python3-systemd",
            "/usr/bin/kill", "shadow-utils", "systemd"} <= requires, requires
    # prometheus_client and tomli are bundled, so not required, and declared as bundled
    assert not {"python3-prometheus_client", "python3-prometheus-client", "python3-tomli"} & requires
    provides = query(rpm, "--provides")
    vendored = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "packaging/rpm/vendor.txt").read_text(),
                               re.M))
    for name, version in vendored.items():
        assert f"bundled(python3dist({name.replace('_', '-')})) = {version}" in provides
    assert "python3 >= 3.9" in query(rpm, "-R")


def test_rpmlint_clean(rpm: Path) -> None:
    require_root_tools("rpmlint")
    out = sh("rpmlint", "-r", str(ROOT / "packaging/rpm/burstwatch.rpmlintrc"), str(rpm), check=False)
    assert re.search(r"0 errors, 0 warnings", out.stdout), out.stdout + out.stderr


def test_rpm_payload_runs_from_its_private_tree(rpm: Path, tmp_path: Path) -> None:
    """The package's own files: the CLI starts with the bundled prometheus_client and tomli, and
    check-config accepts the shipped config."""
    sh("sh", "-c", f"rpm2cpio {rpm} | cpio -idm --quiet", cwd=tmp_path)
    lib, vendor = tmp_path / "usr/lib/burstwatch", tmp_path / "usr/lib/burstwatch/vendor"
    code = (f"import sys; sys.path[:0] = [{str(lib)!r}, {str(vendor)!r}]\n"
            "import prometheus_client, tomli\n"
            f"assert prometheus_client.__file__.startswith({str(vendor)!r}), prometheus_client.__file__\n"
            "from agent.cli import main\n"
            f"sys.exit(main(['check-config', '--config', {str(tmp_path / 'etc/burstwatch/burstwatch.toml')!r}]))\n")
    out = subprocess.run(["/usr/bin/python3", "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "burstwatch.toml: ok" in out.stdout
    launcher = (tmp_path / "usr/bin/burstwatch").read_text(encoding="utf-8")
    assert launcher == (ROOT / "packaging/bin/burstwatch").read_text(encoding="utf-8")
