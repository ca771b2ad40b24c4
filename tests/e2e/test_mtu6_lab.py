"""The IPv6 MTU lab: `burstwatch check` in a namespace behind a router whose far link has IPv6's minimum MTU
(1280) finds the path MTU from ICMPv6 Packet Too Big, and still finds it, as a black hole, when the router's
Packet Too Big is dropped (the PLPMTUD search)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BURSTWATCH, require_root_tools
from tests.support.lab import Lab

pytestmark = pytest.mark.netns

# ULA addresses (fd00::/8), only inside the lab's namespaces
ROUTER, CLIENT, SERVER = "fd96:1::1", "fd96:1::2", "fd96:2::2"
CHECK_TIMEOUT = 60   # seconds; one check run takes ~2-5 s here (1 s of it is the counter window)


def _lab(lab: Lab, drop_ptb: bool = False) -> tuple[str, str]:
    """client (eth0, MTU 1500) -- router -- server, the router-server link at 1280. Returns the client and
    the router."""
    c, r, s = lab.host("c", ipv6=True), lab.host("r", forwarding=True, ipv6=True), lab.host("s", ipv6=True)
    lab.link(c, r, f"{CLIENT}/64", f"{ROUTER}/64", mtu=1500, names=("eth0", "eth0"))
    lab.link(r, s, "fd96:2::1/64", f"{SERVER}/64", mtu=1280, names=("eth1", "eth0"))
    lab.run(c, "ip", "-6", "route", "add", "default", "via", ROUTER)
    lab.run(s, "ip", "-6", "route", "add", "default", "via", "fd96:2::1")
    # As systemd sets it: the agent may open unprivileged ping sockets (IPv6 ones included).
    lab.run(c, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")
    if drop_ptb:
        # A firewall that drops ICMPv6 Packet Too Big (type 2): the IPv6 form of RFC 2923's black hole.
        lab.run(r, "nft", "add table inet fw; add chain inet fw out { type filter hook output priority 0; }; "
                "add rule inet fw out icmpv6 type packet-too-big counter drop")
    lab.wait_ipv6(c, r, s)
    return c, r


def _check(lab: Lab, ns: str, peer: str, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    cfg = tmp_path / "burstwatch.toml"
    cfg.write_text(f'interfaces = ["eth0"]\n[probe]\npeers = ["{peer}"]\n'
                   '[imds]\nendpoint = "http://127.0.0.1:1"\ntimeout = 0.2\nretries = 0\n')
    res = lab.run(ns, *BURSTWATCH, "check", "--config", str(cfg), "--json", check=False, timeout=CHECK_TIMEOUT)
    return res.returncode, json.loads(res.stdout)


def _path_mtu(doc: dict[str, Any], peer: str) -> dict[str, Any]:
    (v,) = [v for v in doc["verdicts"] if v["check"] == "path_mtu"]
    assert v["interface"] == peer
    return v


def test_ipv6_path_mtu_from_packet_too_big(tmp_path: Path) -> None:
    require_root_tools("ip", "sysctl")
    with Lab() as lab:
        c, _r = _lab(lab)
        code, doc = _check(lab, c, SERVER, tmp_path)
        v = _path_mtu(doc, SERVER)
        ev = v["evidence"]
        assert v["status"] == "warn", v
        assert (ev["address"], ev["method"], ev["interface"], ev["interface_mtu"]) == (SERVER, "icmp", "eth0", 1500)
        assert (ev["route_mtu"], ev["path_mtu"], ev["reported_mtu"]) == (1500, 1280, 1280)
        assert ev["reporters"] == [ROUTER] and ev["black_hole"] is False
        assert f"path MTU to {SERVER} is 1280, below eth0's 1500 (routers {ROUTER} reported 1280)" in v["summary"]
        assert v["remedy"].startswith(f"sudo ip -6 route replace {SERVER}/128 via {ROUTER} dev eth0 mtu 1280 ")
        assert code == doc["exit_code"] == 2      # veth is not ENA: the driver check fails, as it should


def test_ipv6_black_hole_when_packet_too_big_is_dropped(tmp_path: Path) -> None:
    require_root_tools("ip", "nft")
    peer = f"[{SERVER}]:5201"                      # the bracketed form with a port, as [probe] peers allows
    with Lab() as lab:
        c, r = _lab(lab, drop_ptb=True)
        code, doc = _check(lab, c, peer, tmp_path)
        v = _path_mtu(doc, peer)
        ev = v["evidence"]
        assert v["status"] == "fail", v
        assert ev["black_hole"] is True and ev["reporters"] == [] and ev["reported_mtu"] is None
        # The search ends exactly on the hop's MTU: it bisects to the byte once a common size (1280) answers.
        assert (ev["interface_mtu"], ev["route_mtu"], ev["path_mtu"]) == (1500, 1500, 1280)
        assert 'no ICMPv6 "packet too big" comes back (blocked on the path' in v["summary"]
        remedy = v["remedy"].splitlines()
        assert remedy[0] == f"sudo ip -6 route replace {SERVER}/128 via {ROUTER} dev eth0 mtu lock 1280"
        assert "allow ICMPv6 Packet Too Big (type 2)" in remedy[2]
        assert code == 2
        # The premise: the router did send Packet Too Big, and the firewall dropped it.
        rules = lab.run(r, "nft", "list", "chain", "inet", "fw", "out").stdout
        m = re.search(r"packet-too-big counter packets (\d+)", rules)
        assert m and int(m.group(1)) >= 1, rules
