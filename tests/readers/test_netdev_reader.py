"""The hot path's kept-fd and ioctl reads agree with the plain file reads they replace."""

from __future__ import annotations

import os

from agent.readers.netdev import NetDevReader, parse_proc_net_dev, read_ifindex, read_proc_net_dev


def test_pread_and_ioctl_agree_with_the_files() -> None:
    r = NetDevReader()
    try:
        for _ in range(3):                   # the kept fd re-reads fresh text every time
            kept = parse_proc_net_dev(r.read())
            plain = parse_proc_net_dev(read_proc_net_dev())
            assert set(kept) == set(plain) and "lo" in kept
            assert kept["lo"].rx_bytes <= plain["lo"].rx_bytes
        for name in os.listdir("/sys/class/net"):
            assert r.ifindex(name) == read_ifindex(name)
        assert r.ifindex("no-such-if0") is None
        assert r.ifindex("x" * 40) is None   # longer than IFNAMSIZ: not an interface name
    finally:
        r.close()


def test_test_roots_use_the_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "dev").write_text("h1\nh2\n  lo: 1 2 0 0 0 0 0 0 3 4 0 0 0 0 0 0\n")
    (tmp_path / "class" / "net" / "lo").mkdir(parents=True)
    (tmp_path / "class" / "net" / "lo" / "ifindex").write_text("7\n")
    r = NetDevReader(str(tmp_path), str(tmp_path))
    assert parse_proc_net_dev(r.read())["lo"].rx_bytes == 1 and r.ifindex("lo") == 7
