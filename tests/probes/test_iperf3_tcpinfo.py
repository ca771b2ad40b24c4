"""struct tcp_info parsing: offsets from include/uapi/linux/tcp.h, and a live read on loopback."""

from __future__ import annotations

import socket
import struct
import threading

from agent.iperf3 import tcpinfo as ti


def synthetic(size: int = 232) -> bytes:
    """A tcp_info laid out as include/uapi/linux/tcp.h (Linux 5.4+: 232 bytes) with marker values."""
    raw = bytearray(size)
    raw[0] = 1  # TCP_ESTABLISHED
    for off, value in ((ti.OFF_SND_MSS, 1448), (ti.OFF_RCV_MSS, 536), (ti.OFF_UNACKED, 7), (ti.OFF_LOST, 2),
                       (ti.OFF_PMTU, 9001), (ti.OFF_RTT, 250), (ti.OFF_RTTVAR, 40), (ti.OFF_SND_CWND, 10),
                       (ti.OFF_RCV_RTT, 333), (ti.OFF_TOTAL_RETRANS, 17), (ti.OFF_MIN_RTT, 120),
                       (ti.OFF_SND_WND, 65535)):
        if off + 4 <= size:
            struct.pack_into("=I", raw, off, value)
    for off, value in ((ti.OFF_BYTES_ACKED, 5 * 2**32), (ti.OFF_BYTES_RECEIVED, 99),
                       (ti.OFF_DELIVERY_RATE, 1_250_000_000), (ti.OFF_BYTES_SENT, 6 * 2**32)):
        if off + 8 <= size:
            struct.pack_into("=Q", raw, off, value)
    return bytes(raw)


def test_offsets_follow_the_kernel_header() -> None:
    # The __u64 block must start 8-aligned right after tcpi_total_retrans (offset 100, 4 bytes).
    assert ti.OFF_TOTAL_RETRANS + 4 == 104 and 104 % 8 == 0
    assert (ti.OFF_RTT, ti.OFF_SND_CWND, ti.OFF_BYTES_ACKED, ti.OFF_SND_WND) == (68, 80, 120, 228)


def test_parse_full_struct() -> None:
    info = ti.parse_tcp_info(synthetic())
    assert info is not None
    assert (info.state, info.snd_mss, info.pmtu, info.rtt_us, info.rttvar_us) == (1, 1448, 9001, 250, 40)
    assert info.snd_cwnd_bytes == 14480  # iperf3 reports cwnd as segments x MSS (tcp_info.c)
    assert (info.total_retrans, info.rcv_rtt_us, info.min_rtt_us, info.snd_wnd) == (17, 333, 120, 65535)
    assert info.bytes_acked == 5 * 2**32 and info.bytes_sent == 6 * 2**32
    assert info.delivery_rate == 1_250_000_000


def test_parse_old_kernel_struct() -> None:
    # A 2.6-era tcp_info ends after tcpi_total_retrans: newer fields are None, not garbage.
    info = ti.parse_tcp_info(synthetic(104))
    assert info is not None and info.total_retrans == 17
    assert info.bytes_acked is None and info.min_rtt_us is None and info.snd_wnd is None
    assert ti.parse_tcp_info(b"") is None
    assert ti.parse_tcp_info(synthetic(100)) is None


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
