"""MAC addresses from a sysfs tree and the ENI -> interface match."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.readers.sysfs_net import NetIf, match_macs, parse_mac, parse_net_interfaces, read_net_interfaces

SYSFS = str(Path(__file__).resolve().parent.parent / "fixtures" / "sysfs")


def test_read_fixture_tree() -> None:
    nifs = {n.name: n for n in parse_net_interfaces(read_net_interfaces(SYSFS))}
    assert sorted(nifs) == ["docker0", "ens5", "ens5.100", "ens6", "lo"]   # bonding_masters is a file
    assert nifs["ens5"] == NetIf("ens5", "0a:1b:2c:3d:4e:01", True)
    assert nifs["ens6"].mac == "0a:1b:2c:3d:4e:02"                          # upper case in the file
    assert nifs["ens5.100"] == NetIf("ens5.100", "0a:1b:2c:3d:4e:01", False)
    assert nifs["lo"].mac is None


def test_missing_sysfs_is_empty(tmp_path: Path) -> None:
    assert read_net_interfaces(str(tmp_path / "nope")) == {}


def test_match_prefers_the_device_backed_interface() -> None:
    nifs = parse_net_interfaces(read_net_interfaces(SYSFS))
    got = match_macs(["0a:1b:2c:3d:4e:01", "0A:1B:2C:3D:4E:02", "0a:1b:2c:3d:4e:99"], nifs)
    assert got == {"0a:1b:2c:3d:4e:01": "ens5", "0a:1b:2c:3d:4e:02": "ens6"}


@pytest.mark.parametrize(("text", "mac"), [
    ("0a:1b:2c:3d:4e:01\n", "0a:1b:2c:3d:4e:01"),
    ("0A:1B:2C:3D:4E:01", "0a:1b:2c:3d:4e:01"),
    ("00:00:00:00:00:00\n", None),                       # loopback
    ("", None),                                          # tun devices have no address
    ("00:00:00:00:fe:80:00:00:00:00:00:00:00:00:00:01", None),   # InfiniBand-style, not Ethernet
])
def test_parse_mac(text: str, mac: str | None) -> None:
    assert parse_mac(text) == mac
