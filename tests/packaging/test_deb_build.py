"""The .deb as built by packaging/build.sh: lintian, control fields, file layout."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT, require_root_tools
from tests.packaging.conftest import Debs
from tests.packaging.debroot import read_version, sh

UNIT = "/lib/systemd/system/burstwatch.service"  # dh_installsystemd's place on Debian 12
CONFFILE = "/etc/burstwatch/burstwatch.toml"


def test_deb_is_lintian_clean(debs: Debs) -> None:
    require_root_tools("lintian")
    out = sh("lintian", "--pedantic", "--display-info", "--fail-on", "error,warning",
             str(debs.v1), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not re.search(r"^[EWIP]: ", out.stdout, re.M), out.stdout


def test_deb_control_depends_on_debian_packages_that_exist(debs: Debs) -> None:
    control = sh("dpkg-deb", "-f", str(debs.v1), "Depends", "Version", "Architecture").stdout
    fields = dict(line.split(": ", 1) for line in control.strip().splitlines())
    assert fields["Version"] == debs.version1
    assert fields["Architecture"] == "all"
    depends = fields["Depends"]
    for need in ("python3-pyroute2 (>= 0.7.2)", "python3-prometheus-client (>= 0.16)", "python3-boto3",
                 "python3-systemd", "python3 (>= 3.11) | python3-tomli", "procps"):
        assert need in depends, depends
    # Every package named (first alternatives included) is a real Debian 12 package.
    names = {re.sub(r"[:\s(].*", "", alt.strip()) for dep in depends.split(",") for alt in dep.split("|")}
    shown = sh("apt-cache", "show", "--no-all-versions", *sorted(names), check=False)
    found = set(re.findall(r"^Package: (\S+)$", shown.stdout, re.M))
    virtual = {"systemd-sysusers"}  # a virtual package some sysusers implementations provide
    assert names - found <= virtual, f"unknown packages: {names - found - virtual}"


def test_deb_file_layout(debs: Debs) -> None:
    listing = sh("dpkg-deb", "-c", str(debs.v1)).stdout
    files = {line.split()[-1].lstrip(".") for line in listing.splitlines()
             if not line.startswith("d")}
    for path in ("/usr/bin/burstwatch", UNIT, CONFFILE, "/usr/lib/sysusers.d/burstwatch.conf",
                 "/usr/lib/burstwatch/agent/__init__.py", "/usr/lib/burstwatch/agent/cli.py",
                 "/usr/share/doc/burstwatch/install.md", "/usr/share/man/man1/burstwatch.1.gz",
                 "/usr/share/burstwatch/burstwatch.toml"):
        assert path in files, path
    for shared in ("packaging/prometheus/burstwatch.rules.yml", "packaging/grafana/burstwatch-dashboard.json",
                   "packaging/grafana/burstwatch-fleet-dashboard.json"):
        assert (ROOT / shared).exists(), shared
        assert f"/usr/share/burstwatch/{Path(shared).name}" in files, shared
    # `agent` is private: never a global module.
    assert not [f for f in files if "dist-packages" in f or "site-packages" in f]
    assert not [f for f in files if f.endswith(".pyc")]
    ctrl = sh("dpkg-deb", "--info", str(debs.v1), "conffiles").stdout.split()
    assert ctrl == [CONFFILE]


def test_ubuntu2204_deb_bundles_what_jammy_lacks(ubuntu2204_deb: Path, tmp_path: Path) -> None:
    """Ubuntu 22.04's pyroute2 (0.6.4) and prometheus_client (0.9) are too old: this flavour bundles
    both (packaging/debian/vendor-ubuntu22.04.txt) and depends on Ubuntu for the rest."""
    version = read_version()
    assert ubuntu2204_deb.name == f"burstwatch_{version}~ubuntu22.04_all.deb"
    depends = sh("dpkg-deb", "-f", str(ubuntu2204_deb), "Depends").stdout
    assert "pyroute2" not in depends and "prometheus" not in depends
    for need in ("python3-boto3", "python3-systemd", "python3 (>= 3.11) | python3-tomli"):
        assert need in depends
    out = sh("lintian", "--pedantic", "--display-info", "--fail-on", "error,warning",
             str(ubuntu2204_deb), check=False)
    assert out.returncode == 0 and not re.search(r"^[EWIP]: ", out.stdout, re.M), out.stdout
    # The payload runs from its own files, the bundled libraries winning over the system's.
    sh("dpkg-deb", "-x", str(ubuntu2204_deb), str(tmp_path))
    lib, vendor = tmp_path / "usr/lib/burstwatch", tmp_path / "usr/lib/burstwatch/vendor"
    code = (f"import sys; sys.path[:0] = [{str(lib)!r}, {str(vendor)!r}]\n"
            "import prometheus_client, pyroute2\n"
            f"assert prometheus_client.__file__.startswith({str(vendor)!r}), prometheus_client.__file__\n"
            f"assert pyroute2.__file__.startswith({str(vendor)!r}), pyroute2.__file__\n"
            "from pyroute2 import IPRoute\n"
            "with IPRoute() as ipr: assert ipr.get_links()\n"
            "from agent.cli import main\n"
            f"sys.exit(main(['check-config', '--config', {str(tmp_path / 'etc/burstwatch/burstwatch.toml')!r}]))\n")
    run = sh("/usr/bin/python3", "-I", "-c", code, check=False)
    assert run.returncode == 0, run.stderr
    assert "burstwatch.toml: ok" in run.stdout
