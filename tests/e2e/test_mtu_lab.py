"""The MTU lab: `burstwatch check` in a namespace behind a router with a 1500-byte hop finds the path MTU,
and finds the black hole when the router's ICMP "fragmentation needed" is dropped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BURSTWATCH, require_root_tools
from tests.support.lab import Lab

pytestmark = pytest.mark.netns

PEER = "10.96.2.2"


def _lab(lab: Lab, hop_mtu: int, drop_frag_needed: bool = False) -> str:
    """a (eth0, MTU 9001) -- r (router) -- b; the r-b link has `hop_mtu`. Returns a's namespace."""
    a, r, b = lab.host("a"), lab.host("r", forwarding=True), lab.host("b")
    lab.link(a, r, "10.96.1.2/24", "10.96.1.1/24", mtu=9001, names=("eth0", "eth0"))
    lab.link(r, b, "10.96.2.1/24", f"{PEER}/24", mtu=hop_mtu, names=("eth1", "eth0"))
    lab.run(a, "ip", "route", "add", "default", "via", "10.96.1.1")
    lab.run(b, "ip", "route", "add", "default", "via", "10.96.2.1")
    if drop_frag_needed:
        # What a firewall that drops all ICMP does to path MTU discovery (RFC 2923's "black hole").
        lab.run(r, "nft", "add table inet fw; add chain inet fw out { type filter hook output priority 0; }; "
                "add rule inet fw out icmp type destination-unreachable icmp code frag-needed drop")
    return a


def _check(lab: Lab, ns: str, tmp_path: Path, as_json: bool = True) -> tuple[int, Any]:
    cfg = tmp_path / "burstwatch.toml"
    cfg.write_text(f'interfaces = ["eth0"]\n[probe]\npeers = ["{PEER}"]\n'
                   '[imds]\nendpoint = "http://127.0.0.1:1"\ntimeout = 0.2\nretries = 0\n')
    res = lab.run(ns, *BURSTWATCH, "check", "--config", str(cfg), *(["--json"] if as_json else []),
                  check=False, timeout=120)
    return res.returncode, (json.loads(res.stdout) if as_json else res.stdout)


def _path_mtu(doc: dict) -> dict:
    (v,) = [v for v in doc["verdicts"] if v["check"] == "path_mtu"]
    assert v["interface"] == PEER
    return v


def test_path_mtu_below_the_interface_mtu(tmp_path: Path) -> None:
    require_root_tools("ip", "sysctl")
    with Lab() as lab:
        a = _lab(lab, hop_mtu=1500)
        code, doc = _check(lab, a, tmp_path)
        v = _path_mtu(doc)
        ev = v["evidence"]
        assert v["status"] == "warn"
        assert (ev["interface"], ev["interface_mtu"], ev["path_mtu"], ev["reported_mtu"]) == ("eth0", 9001, 1500, 1500)
        assert ev["reporters"] == ["10.96.1.1"] and ev["black_hole"] is False
        assert "path MTU to 10.96.2.2 is 1500, below eth0's 9001" in v["summary"]
        assert code == doc["exit_code"] == 2          # veth is not ENA: the driver check fails, as it should
        _code, table = _check(lab, a, tmp_path, as_json=False)
        assert "path_mtu" in table and "WARN" in table


def test_black_hole_when_frag_needed_is_dropped(tmp_path: Path) -> None:
    require_root_tools("ip", "nft")
    with Lab() as lab:
        a = _lab(lab, hop_mtu=1500, drop_frag_needed=True)
        code, doc = _check(lab, a, tmp_path)
        v = _path_mtu(doc)
        ev = v["evidence"]
        assert v["status"] == "fail" and ev["black_hole"] is True
        assert (ev["interface_mtu"], ev["path_mtu"], ev["reported_mtu"]) == (9001, 1500, None)
        assert "MTU black hole" in v["summary"]
        assert f"sudo ip route replace {PEER}/32 via 10.96.1.1 dev eth0 mtu lock 1500" in v["remedy"]
        assert code == 2


def test_clean_jumbo_path(tmp_path: Path) -> None:
    require_root_tools("ip")
    with Lab() as lab:
        a = _lab(lab, hop_mtu=9001)
        _code, doc = _check(lab, a, tmp_path)
        v = _path_mtu(doc)
        assert v["status"] == "ok" and v["evidence"]["path_mtu"] == 9001
