"""The flow reader: /proc/net/{tcp,tcp6,udp,udp6} parsing from captured fixtures, sock_diag message parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.readers.flows import (
    Flow,
    ProcFlowSource,
    is_local,
    parse_diag,
    parse_proc_net,
    read_proc_net_flows,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "flows"


def test_reads_the_four_tables_and_skips_missing(tmp_path: Path) -> None:
    texts = read_proc_net_flows(str(FIXTURES))
    assert sorted(texts) == ["net/tcp", "net/tcp6", "net/udp", "net/udp6"]
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text((FIXTURES / "net" / "tcp").read_text())
    assert sorted(read_proc_net_flows(str(tmp_path))) == ["net/tcp"]     # IPv6 off: no tcp6/udp6


def test_parses_the_lab_capture() -> None:
    flows = ProcFlowSource(str(FIXTURES)).flows()
    assert Flow("tcp", "0.0.0.0", 5432, "0.0.0.0", 0, "LISTEN") in flows
    assert Flow("tcp", "10.77.0.1", 0x95BA, "10.77.0.2", 8002, "ESTABLISHED") in flows
    assert Flow("tcp", "127.0.0.1", 0xE2F2, "127.0.0.1", 5432, "ESTABLISHED") in flows
    assert Flow("tcp", "::", 2222, "::", 0, "LISTEN") in flows
    assert Flow("tcp", "fd00:77::1", 0xB22C, "fd00:77::2", 8443, "ESTABLISHED") in flows
    assert Flow("udp", "0.0.0.0", 5353, "0.0.0.0", 0, "CLOSE") in flows
    assert Flow("udp", "fd00:77::1", 0xE59A, "fd00:77::2", 53, "ESTABLISHED") in flows
    assert sum(1 for f in flows if f.protocol == "udp" and f.remote_port == 8003) == 2
    assert len(flows) == 13     # 7 tcp, 2 tcp6, 3 udp, 1 udp6


@pytest.mark.parametrize("line,want", [
    ("   6: 0100007F:A3D0 0100007F:C40B 06 00000000:00000000 03:0000043D 00000000     0        0 0 3 0",
     Flow("tcp", "127.0.0.1", 0xA3D0, "127.0.0.1", 0xC40B, "TIME_WAIT")),
    # an IPv4-mapped IPv6 peer, as a dual-stack socket lists it
    ("   0: 0000000000000000FFFF00000100007F:A83F 0000000000000000FFFF00000100007F:88BE 06 0 0 0 0 0 0 3 0",
     Flow("tcp", "::ffff:127.0.0.1", 0xA83F, "::ffff:127.0.0.1", 0x88BE, "TIME_WAIT")),
    ("   1: 01004D0A:95BA 02004D0A:1F42 0C 0 0 0 0 0 0 2 0", Flow("tcp", "10.77.0.1", 0x95BA, "10.77.0.2", 8002,
                                                             "NEW_SYN_RECV")),
])
def test_parse_lines(line: str, want: Flow) -> None:
    assert parse_proc_net("  sl  local_address rem_address   st\n" + line + "\n", "tcp") == [want]


def test_short_and_header_lines_are_skipped_and_bad_addresses_raise() -> None:
    assert parse_proc_net("header\n\n  garbage\n", "tcp") == []
    with pytest.raises(ValueError):
        parse_proc_net("h\n 0: 0100:0050 02004D0A:1F42 01 0 0\n", "tcp")


def test_is_local() -> None:
    assert is_local("127.0.0.1") and is_local("::1") and is_local("::ffff:127.0.0.5")
    assert not is_local("10.77.0.2") and not is_local("fd00:77::2") and not is_local("nonsense")


def test_parse_diag_messages() -> None:
    # the fields pyroute2 0.7.2's DiagSocket.get_sock_stats() returns (seen on this machine)
    msgs = [{"idiag_family": 2, "idiag_state": 1, "idiag_sport": 41473, "idiag_dport": 443,
             "idiag_src": "10.77.0.1", "idiag_dst": "10.77.0.2"},
            {"idiag_family": 2, "idiag_state": 10, "idiag_sport": 22, "idiag_dport": 0,
             "idiag_src": "0.0.0.0", "idiag_dst": "0.0.0.0"}]
    assert parse_diag(msgs, "tcp") == [Flow("tcp", "10.77.0.1", 41473, "10.77.0.2", 443, "ESTABLISHED"),
                                       Flow("tcp", "0.0.0.0", 22, "0.0.0.0", 0, "LISTEN")]
    assert parse_diag([{**msgs[1], "idiag_state": 7}], "udp")[0].state == "CLOSE"
