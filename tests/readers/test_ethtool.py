"""The ethtool reader: parsers on captured text, the fixture replay, and the real SIOCETHTOOL path on veth."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from agent.readers import ethtool as ethtoolmod
from agent.readers.ethtool import (
    Channels,
    DriverInfo,
    FixtureEthtoolReader,
    IoctlEthtoolReader,
    NoSuchInterface,
    Rings,
    parse_ethtool_g,
    parse_ethtool_i,
    parse_ethtool_l,
    parse_ethtool_S,
)
from agent.sampling import NotSupported
from tests.conftest import require_root_tools
from tests.support.lab import Lab, run_in_ns

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ethtool"

ALLOWANCE = ["bw_in_allowance_exceeded", "bw_out_allowance_exceeded", "pps_allowance_exceeded",
             "conntrack_allowance_exceeded", "linklocal_allowance_exceeded"]

# fixture -> (stat count, {stat: value} spot checks, stats that must be absent, DriverInfo, Channels, Rings)
CASES = {
    "ena-1.5.0g-r4.large": (
        60, {"queue_1_rx_empty_rx_ring": 0, "interface_up": 2, "ena_admin_q_completed_cmd": 97},
        ALLOWANCE + ["conntrack_allowance_available", "ena_srd_mode"],
        DriverInfo("ena", "1.5.0g", "", "0000:00:03.0"),
        Channels(combined=0, max_combined=0, rx=2, tx=2, max_rx=2, max_tx=2), Rings(1024, 16384, 1024, 1024)),
    "ena-intree-6.1-m5.large": (
        85, {"linklocal_allowance_exceeded": 12, "bw_in_allowance_exceeded": 0},
        ["conntrack_allowance_available", "ena_srd_mode", "reset_fail"],
        DriverInfo("ena", "6.1.0-18-cloud-amd64", "", "0000:00:05.0"),
        Channels(combined=2, max_combined=2), Rings(1024, 16384, 1024, 1024)),
    "ena-2.12.3g-m6i.xlarge": (
        172, {"bw_in_allowance_exceeded": 3241329, "bw_out_allowance_exceeded": 530, "pps_allowance_exceeded": 784,
              "conntrack_allowance_available": 615471, "ena_srd_mode": 0, "queue_3_rx_lpc_wrong_numa": 0},
        ["queue_4_tx_cnt"],
        DriverInfo("ena", "2.12.3g", "", "0000:00:05.0"),
        Channels(combined=4, max_combined=4), Rings(1024, 16384, 1024, 1024)),
    "ena-2.12.3g-c6in.32xlarge-express": (
        320, {"ena_srd_mode": 3, "ena_srd_resource_utilization": 7, "conntrack_allowance_available": 2097152},
        ["queue_8_tx_cnt"],
        DriverInfo("ena", "2.12.3g", "", "0000:20:03.0"),
        Channels(combined=8, max_combined=32), Rings(1024, 16384, 512, 512)),
    "vif-xen-m4.large": (
        1, {"rx_gso_checksum_fixup": 0}, ALLOWANCE, DriverInfo("vif", "", "", "vif-0"), None, None),
    "ixgbevf-4.1.0-k-c4.large": (
        20, {"tx_restart_queue": 3, "rx_queue_1_packets": 40617283}, ALLOWANCE,
        DriverInfo("ixgbevf", "4.1.0-k", "", "0000:00:03.0"), None, Rings(1024, 4096, 1024, 4096)),
    "veth-lab": (
        10, {"peer_ifindex": 2, "rx_queue_0_drops": 0}, ALLOWANCE, DriverInfo("veth", "1.0", "", ""),
        Channels(combined=0, max_combined=0, rx=1, tx=1, max_rx=2, max_tx=2), None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_files_say_where_they_came_from(name: str) -> None:
    files = sorted((FIXTURES / name).glob("*.txt"))
    assert files, f"no captured output under {FIXTURES / name}"
    for f in files:
        head = f.read_text().splitlines()[:2]
        assert head[0].startswith("# ethtool -") and "--" in head[0], f
        assert "CAPTURED" in head[1] or "RECONSTRUCTED" in head[1], f


@pytest.mark.parametrize("name", sorted(CASES))
def test_parsers_on_fixtures(name: str) -> None:
    count, spot, absent, drv, chan, rings = CASES[name]
    d = FIXTURES / name
    stats = parse_ethtool_S((d / "S.txt").read_text())
    assert len(stats) == count
    for k, v in spot.items():
        assert stats[k] == v
    for k in absent:
        assert k not in stats
    assert parse_ethtool_i((d / "i.txt").read_text()) == drv
    assert (parse_ethtool_l((d / "l.txt").read_text()) if (d / "l.txt").exists() else None) == chan
    assert (parse_ethtool_g((d / "g.txt").read_text()) if (d / "g.txt").exists() else None) == rings


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_reader_replays_through_the_reader_interface(name: str) -> None:
    count, spot, _absent, drv, chan, rings = CASES[name]
    r = FixtureEthtoolReader({"eth0": FIXTURES / name})
    stats = r.stats("eth0")
    assert len(stats) == count and all(stats[k] == v for k, v in spot.items())
    assert r.driver("eth0") == drv
    assert r.channels("eth0") == chan      # a missing l.txt means "not supported": None
    assert r.rings("eth0") == rings
    with pytest.raises(NoSuchInterface):
        r.stats("eth9")
    assert r.driver("eth9") is None and r.channels("eth9") is None and r.rings("eth9") is None


@pytest.mark.parametrize("text, expected", [
    ("NIC statistics:\n     rx_packets: 12\n     tx_bytes: 3400\n", {"rx_packets": 12, "tx_bytes": 3400}),
    ("# header\nNIC statistics:\n     a: 0\n", {"a": 0}),
    # per-queue group headers some drivers print, and a non-numeric line
    ("NIC statistics:\n     queue_0:\n     q0_rx: 5\n     note: n/a\n", {"q0_rx": 5}),
    ("NIC statistics:\n     name: with: colon: 7\n", {"name: with: colon": 7}),
])
def test_parse_ethtool_S_table(text: str, expected: dict[str, int]) -> None:
    assert parse_ethtool_S(text) == expected


def test_parse_ethtool_S_no_stats() -> None:
    with pytest.raises(NotSupported):
        parse_ethtool_S("no stats available\n")


@pytest.mark.parametrize("text, expected", [
    ("Channel parameters for eth0:\nPre-set maximums:\nRX:\t\tn/a\nTX:\t\tn/a\nOther:\t\tn/a\nCombined:\t8\n"
     "Current hardware settings:\nRX:\t\tn/a\nTX:\t\tn/a\nOther:\t\tn/a\nCombined:\t2\n",
     Channels(combined=2, max_combined=8)),
    ("Channel parameters for eth0:\nPre-set maximums:\nRX:\t\t4\nTX:\t\t4\nOther:\t\t1\nCombined:\t0\n"
     "Current hardware settings:\nRX:\t\t3\nTX:\t\t2\nOther:\t\t1\nCombined:\t0\n",
     Channels(combined=0, max_combined=0, rx=3, tx=2, other=1, max_rx=4, max_tx=4, max_other=1)),
])
def test_parse_ethtool_l_table(text: str, expected: Channels) -> None:
    assert parse_ethtool_l(text) == expected


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_ethtool_l("netlink error: Operation not supported\n")
    with pytest.raises(ValueError):
        parse_ethtool_i("Cannot get driver information: No such device\n")


# -- the real ioctl path ----------------------------------------------------------------------------

def _ethtool_text(lab: Lab, ns: str, flag: str, dev: str) -> str:
    return lab.run(ns, "ethtool", flag, dev).stdout


@pytest.mark.netns
def test_ioctl_reader_matches_ethtool_on_veth(tmp_path: Path) -> None:
    """SIOCETHTOOL through pyroute2's socket reads exactly what `ethtool -S/-i/-l` print, and the captured
    text replayed by the fixture reader gives the same answers through the same interface."""
    require_root_tools("ip", "ethtool")
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        ia, ib = lab.link(a, b, "10.93.0.1/24", "10.93.0.2/24", names=("eth0", "eth1"))
        real = run_in_ns(a, IoctlEthtoolReader)
        peer_index = int(lab.run(b, "cat", f"/sys/class/net/{ib}/ifindex").stdout)
        for flag, what in (("-S", "S"), ("-i", "i"), ("-l", "l")):
            (tmp_path / f"{what}.txt").write_text(_ethtool_text(lab, a, flag, ia))
        fixture = FixtureEthtoolReader({ia: tmp_path})
        stats = run_in_ns(a, lambda: real.stats(ia))
        assert stats == fixture.stats(ia)
        assert stats["peer_ifindex"] == peer_index          # a real value, not just names
        assert run_in_ns(a, lambda: real.driver(ia)) == fixture.driver(ia) == DriverInfo("veth", "1.0", "", "")
        assert run_in_ns(a, lambda: real.channels(ia)) == fixture.channels(ia)
        assert run_in_ns(a, lambda: real.rings(ia)) is None  # veth has no ring settings: ethtool -g fails too
        with pytest.raises(NotSupported):
            run_in_ns(a, lambda: real.stats("lo"))
        with pytest.raises(NoSuchInterface) as exc:
            run_in_ns(a, lambda: real.stats("nosuch0"))
        assert exc.value.errno == errno.ENODEV
        assert run_in_ns(a, lambda: real.driver("nosuch0")) is None
        real.close()


@pytest.mark.netns
def test_ioctl_reader_beyond_256_stats_and_count_changes() -> None:
    """pyroute2's own GSTRINGS/GSTATS buffers stop at 256 entries; ours follow the device's count, and a
    count change (`ethtool -L`, as ENA queue changes do) invalidates the cached names."""
    require_root_tools("ip", "ethtool")
    with Lab() as lab:
        a = lab.host("a")
        lab.run(a, "ip", "link", "add", "va", "numrxqueues", "64", "numtxqueues", "64", "type", "veth",
                "peer", "name", "vb", "numrxqueues", "64", "numtxqueues", "64")
        lab.run(a, "ip", "link", "set", "va", "up")
        lab.run(a, "ip", "link", "set", "vb", "up")
        lab.run(a, "ethtool", "-L", "va", "rx", "64", "tx", "64")
        reader = run_in_ns(a, IoctlEthtoolReader)
        big = run_in_ns(a, lambda: reader.stats("va"))
        assert len(big) > 256
        assert big == parse_ethtool_S(lab.run(a, "ethtool", "-S", "va").stdout)
        lab.run(a, "ethtool", "-L", "va", "rx", "2", "tx", "2")
        small = run_in_ns(a, lambda: reader.stats("va"))
        assert len(small) < len(big)
        assert small == parse_ethtool_S(lab.run(a, "ethtool", "-S", "va").stdout)
        assert run_in_ns(a, lambda: reader.channels("va")) == parse_ethtool_l(lab.run(a, "ethtool", "-l", "va").stdout)
        # Hot path: the stats read runs every sample, so the names are fetched once and kept until the
        # device's count changes (its cost is in `make bench`'s sampling step, never asserted as a time).
        cached = reader._cache["va"]
        run_in_ns(a, lambda: reader.stats("va"))
        assert reader._cache["va"] is cached
        reader.close()


@pytest.mark.netns
def test_reader_without_pyroute2_socket_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a future pyroute2 stop exposing IoctlEthtool.sock, the reader opens its own socket."""
    require_root_tools("ip")
    import pyroute2.ethtool.ioctl as p2

    class NoSock:
        def __init__(self) -> None:
            pass

    monkeypatch.setattr(p2, "IoctlEthtool", NoSock)
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        ia, _ = lab.link(a, b, None, None)
        reader = run_in_ns(a, IoctlEthtoolReader)
        assert "peer_ifindex" in run_in_ns(a, lambda: reader.stats(ia))
        reader.close()


def test_socket_comes_from_pyroute2() -> None:
    from pyroute2.ethtool.ioctl import IoctlEthtool

    assert hasattr(IoctlEthtool(), "sock")   # the socket the real reader uses (pyroute2 0.7.2 and later)
    sock = ethtoolmod._ethtool_socket()
    assert sock.family.name == "AF_INET"
    sock.close()
