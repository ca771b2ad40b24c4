"""Default-route interface discovery from /proc/net/route and /proc/net/ipv6_route.

Fixtures: tests/fixtures/routes/ — an EC2-like host with two ENIs (ens5, ens6 each with a default route),
a docker bridge, and IPv6 with an unreachable default on lo (as the kernel adds it)."""

from __future__ import annotations

from pathlib import Path

from agent.readers.routes import default_route_interfaces, parse_default_route_interfaces

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "routes"


def test_default_route_interfaces_from_fixture() -> None:
    v4 = (FIX / "route").read_text()
    v6 = (FIX / "ipv6_route").read_text()
    assert parse_default_route_interfaces(v4, v6) == ["ens5", "ens6"]
    assert parse_default_route_interfaces(v4, "") == ["ens5", "ens6"]
    assert parse_default_route_interfaces("", v6) == ["ens5"]
    assert parse_default_route_interfaces("", "") == []


def test_reader_takes_a_procfs_root(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "route").write_text((FIX / "route").read_text())
    assert default_route_interfaces(str(tmp_path)) == ["ens5", "ens6"]   # no ipv6_route: IPv4 only
