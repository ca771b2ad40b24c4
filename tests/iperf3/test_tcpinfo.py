"""struct tcp_info parsing: offsets computed from include/uapi/linux/tcp.h's layout, and a live read on loopback."""

from __future__ import annotations

import ctypes
import re
import socket
import threading
from pathlib import Path
from typing import Any, Union

import pytest

from agent.iperf3 import tcpinfo as ti

# struct tcp_info as include/uapi/linux/tcp.h declares it (Linux 5.4 onwards ends at tcpi_snd_wnd; Debian 12's
# linux-libc-dev 6.1 header), field by field. ctypes lays a Structure out as the C compiler does (natural
# alignment, padding, bitfields packed into their __u8), so the offsets below are computed from the
# declaration rather than typed in by hand: the hand-written OFF_* constants in agent/iperf3/tcpinfo.py
# are checked against them.
Field = Union[tuple[str, Any], tuple[str, Any, int]]
U8, U32, U64 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_uint64
TCP_INFO_FIELDS: list[Field] = [
    ("tcpi_state", U8), ("tcpi_ca_state", U8), ("tcpi_retransmits", U8), ("tcpi_probes", U8),
    ("tcpi_backoff", U8), ("tcpi_options", U8), ("tcpi_snd_wscale", U8, 4), ("tcpi_rcv_wscale", U8, 4),
    ("tcpi_delivery_rate_app_limited", U8, 1), ("tcpi_fastopen_client_fail", U8, 2),
    ("tcpi_rto", U32), ("tcpi_ato", U32), ("tcpi_snd_mss", U32), ("tcpi_rcv_mss", U32),
    ("tcpi_unacked", U32), ("tcpi_sacked", U32), ("tcpi_lost", U32), ("tcpi_retrans", U32), ("tcpi_fackets", U32),
    ("tcpi_last_data_sent", U32), ("tcpi_last_ack_sent", U32), ("tcpi_last_data_recv", U32),
    ("tcpi_last_ack_recv", U32),
    ("tcpi_pmtu", U32), ("tcpi_rcv_ssthresh", U32), ("tcpi_rtt", U32), ("tcpi_rttvar", U32),
    ("tcpi_snd_ssthresh", U32), ("tcpi_snd_cwnd", U32), ("tcpi_advmss", U32), ("tcpi_reordering", U32),
    ("tcpi_rcv_rtt", U32), ("tcpi_rcv_space", U32),
    ("tcpi_total_retrans", U32),
    ("tcpi_pacing_rate", U64), ("tcpi_max_pacing_rate", U64), ("tcpi_bytes_acked", U64),
    ("tcpi_bytes_received", U64), ("tcpi_segs_out", U32), ("tcpi_segs_in", U32),
    ("tcpi_notsent_bytes", U32), ("tcpi_min_rtt", U32), ("tcpi_data_segs_in", U32), ("tcpi_data_segs_out", U32),
    ("tcpi_delivery_rate", U64),
    ("tcpi_busy_time", U64), ("tcpi_rwnd_limited", U64), ("tcpi_sndbuf_limited", U64),
    ("tcpi_delivered", U32), ("tcpi_delivered_ce", U32),
    ("tcpi_bytes_sent", U64), ("tcpi_bytes_retrans", U64), ("tcpi_dsack_dups", U32), ("tcpi_reord_seen", U32),
    ("tcpi_rcv_ooopack", U32),
    ("tcpi_snd_wnd", U32),
]


def layout(fields: list[Field]) -> type[ctypes.Structure]:
    return type("tcp_info", (ctypes.Structure,), {"_fields_": fields})


TcpInfoStruct = layout(TCP_INFO_FIELDS)

# Each constant the parser reads at, and the field of struct tcp_info it must point to.
PARSED = {
    "OFF_STATE": "tcpi_state", "OFF_SND_MSS": "tcpi_snd_mss", "OFF_RCV_MSS": "tcpi_rcv_mss",
    "OFF_UNACKED": "tcpi_unacked", "OFF_LOST": "tcpi_lost", "OFF_RETRANS": "tcpi_retrans", "OFF_PMTU": "tcpi_pmtu",
    "OFF_RTT": "tcpi_rtt", "OFF_RTTVAR": "tcpi_rttvar", "OFF_SND_CWND": "tcpi_snd_cwnd",
    "OFF_RCV_RTT": "tcpi_rcv_rtt", "OFF_TOTAL_RETRANS": "tcpi_total_retrans", "OFF_BYTES_ACKED": "tcpi_bytes_acked",
    "OFF_BYTES_RECEIVED": "tcpi_bytes_received", "OFF_MIN_RTT": "tcpi_min_rtt",
    "OFF_DELIVERY_RATE": "tcpi_delivery_rate", "OFF_BYTES_SENT": "tcpi_bytes_sent", "OFF_SND_WND": "tcpi_snd_wnd",
}


def offset(struct: type[ctypes.Structure], name: str) -> int:
    return int(getattr(struct, name).offset)


def synthetic(size: int = ctypes.sizeof(TcpInfoStruct)) -> bytes:
    """A tcp_info with marker values, laid out by ctypes from the field list (not from the OFF_* constants the
    parser uses), cut to `size` bytes as an older kernel would return it."""
    info = TcpInfoStruct(
        tcpi_state=1, tcpi_snd_mss=1448, tcpi_rcv_mss=536, tcpi_unacked=7, tcpi_lost=2, tcpi_pmtu=9001,
        tcpi_rtt=250, tcpi_rttvar=40, tcpi_snd_cwnd=10, tcpi_rcv_rtt=333, tcpi_total_retrans=17,
        tcpi_bytes_acked=5 * 2**32, tcpi_bytes_received=99, tcpi_min_rtt=120, tcpi_delivery_rate=1_250_000_000,
        tcpi_bytes_sent=6 * 2**32, tcpi_snd_wnd=65535,
        # Neighbours of the parsed fields, so an offset that is off by one field reads a wrong value.
        tcpi_ato=0xA70, tcpi_sacked=0x5AC, tcpi_retrans=3, tcpi_fackets=0xFAC, tcpi_rcv_ssthresh=0x55,
        tcpi_snd_ssthresh=0x77, tcpi_advmss=0xAD, tcpi_rcv_space=0x5BACE, tcpi_pacing_rate=0x9ACE,
        tcpi_max_pacing_rate=0x3A8, tcpi_segs_out=0x5E6, tcpi_notsent_bytes=0x4075, tcpi_data_segs_in=0xD5,
        tcpi_busy_time=0xB05, tcpi_bytes_retrans=0xBE7, tcpi_rcv_ooopack=0x000)
    return bytes(info)[:size]


@pytest.mark.parametrize("constant,field", sorted(PARSED.items()))
def test_offsets_are_the_kernel_layouts(constant: str, field: str) -> None:
    assert getattr(ti, constant) == offset(TcpInfoStruct, field)


def test_min_size_is_where_the_u64_block_starts() -> None:
    # Every kernel since 2.6 returns tcp_info through tcpi_total_retrans; the first field past it is the
    # __u64 tcpi_pacing_rate (3.15). It must follow total_retrans with no padding, so a 104-byte answer is
    # exactly "the old fields, whole" and the first 8-byte read starts 8-aligned.
    end_of_old = offset(TcpInfoStruct, "tcpi_total_retrans") + ctypes.sizeof(U32)
    assert ti.MIN_SIZE == end_of_old == offset(TcpInfoStruct, "tcpi_pacing_rate")
    assert ti.MIN_SIZE % ctypes.alignment(U64) == 0
    assert ti.READ_SIZE >= ctypes.sizeof(TcpInfoStruct)


_HEADER = Path("/usr/include/linux/tcp.h")
_TYPES = {"__u8": U8, "__u16": ctypes.c_uint16, "__u32": U32, "__u64": U64}


def header_fields(text: str) -> list[Field]:
    """The fields of `struct tcp_info` in a tcp.h: `__u32 tcpi_rto;`, `__u8 a : 4, b : 4;` (bitfields)."""
    body = re.search(r"struct tcp_info \{(.*?)\n\};", text, re.S)
    assert body is not None, "no struct tcp_info in the header"
    code = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    out: list[Field] = []
    for decl in (d.strip() for d in code.split(";") if d.strip()):
        ctype, names = decl.split(None, 1)
        for name in names.split(","):
            ident, _, bits = (part.strip() for part in name.partition(":"))
            out.append((ident, _TYPES[ctype], int(bits)) if bits else (ident, _TYPES[ctype]))
    return out


@pytest.mark.skipif(not _HEADER.exists(), reason=f"needs {_HEADER} (Debian: apt-get install linux-libc-dev)")
def test_field_list_matches_the_installed_header() -> None:
    # Newer kernels append fields; what we declare must be the header's prefix, name, type and width.
    declared = header_fields(_HEADER.read_text(encoding="utf-8"))
    assert declared[:len(TCP_INFO_FIELDS)] == TCP_INFO_FIELDS
    from_header = layout(declared)
    for constant, field in PARSED.items():
        assert getattr(ti, constant) == offset(from_header, field), constant


def test_the_header_reader_reads_bitfields_and_comments() -> None:
    text = "struct tcp_info {\n\t__u8\ta : 4, b : 4;\n\t__u32\tc; /* x; y */\n\t__u64 d;\n};\n"
    assert header_fields(text) == [("a", U8, 4), ("b", U8, 4), ("c", U32), ("d", U64)]


def test_parse_full_struct() -> None:
    info = ti.parse_tcp_info(synthetic())
    assert info is not None
    assert (info.state, info.snd_mss, info.rcv_mss, info.pmtu, info.rtt_us, info.rttvar_us) == (1, 1448, 536, 9001,
                                                                                              250, 40)
    assert (info.unacked, info.lost) == (7, 2)
    assert info.snd_cwnd_bytes == 14480  # iperf3 reports cwnd as segments x MSS (tcp_info.c)
    assert (info.total_retrans, info.rcv_rtt_us, info.min_rtt_us, info.snd_wnd) == (17, 333, 120, 65535)
    assert info.bytes_acked == 5 * 2**32 and info.bytes_sent == 6 * 2**32 and info.bytes_received == 99
    assert info.delivery_rate == 1_250_000_000


def test_parse_old_kernel_struct() -> None:
    # A 2.6-era tcp_info ends after tcpi_total_retrans: newer fields are None, not garbage.
    info = ti.parse_tcp_info(synthetic(ti.MIN_SIZE))
    assert info is not None and info.total_retrans == 17
    assert info.bytes_acked is None and info.min_rtt_us is None and info.snd_wnd is None
    assert ti.parse_tcp_info(b"") is None
    assert ti.parse_tcp_info(synthetic(ti.MIN_SIZE - 4)) is None


def test_live_socket_counts_bytes() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    payload = b"x" * (4 * 1024 * 1024)

    def read_all() -> None:
        got = 0
        while got < len(payload):
            got += len(conn.recv(1 << 20))

    reader = threading.Thread(target=read_all)
    with srv, cli, conn:
        reader.start()
        cli.sendall(payload)
        reader.join(5)
        info = ti.tcp_info(cli)
        assert info is not None
        assert info.state == 1
        assert info.snd_mss > 0 and info.pmtu > 0
        if info.bytes_sent is not None:  # Linux >= 4.19
            assert info.bytes_sent >= len(payload)
        assert ti.congestion_control(cli) in ("cubic", "bbr", "reno", "htcp", "dctcp", "bic", "westwood")
