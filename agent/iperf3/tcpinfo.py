"""Read a TCP socket's `struct tcp_info` (getsockopt TCP_INFO) and parse the fields iperf3 reports."""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple, Optional

# Linux's TCP_INFO option number (include/uapi/linux/tcp.h); Python exposes it on Linux only.
TCP_INFO = getattr(socket, "TCP_INFO", 11)
# Ask for more than we parse: the kernel copies min(optlen, sizeof(struct tcp_info)) and newer kernels
# append fields, so a short read only means an older kernel.
READ_SIZE = 256

# Byte offsets in struct tcp_info, from include/uapi/linux/tcp.h (checked against Debian 12's
# linux-libc-dev 6.1 /usr/include/linux/tcp.h): eight __u8 fields (0..7), then __u32s from offset 8 —
# tcpi_rto 8, ato 12, snd_mss 16, rcv_mss 20, unacked 24, sacked 28, lost 32, retrans 36, fackets 40,
# last_data_sent 44, last_ack_sent 48, last_data_recv 52, last_ack_recv 56, pmtu 60, rcv_ssthresh 64,
# rtt 68, rttvar 72, snd_ssthresh 76, snd_cwnd 80, advmss 84, reordering 88, rcv_rtt 92, rcv_space 96,
# total_retrans 100 — then __u64 pacing_rate 104, max_pacing_rate 112, bytes_acked 120 (Linux 4.1),
# bytes_received 128, __u32 segs_out 136, segs_in 140, notsent_bytes 144, min_rtt 148 (4.6),
# data_segs_in 152, data_segs_out 156, __u64 delivery_rate 160 (4.9), busy_time 168, rwnd_limited 176,
# sndbuf_limited 184, __u32 delivered 192, delivered_ce 196, __u64 bytes_sent 200 (4.19),
# bytes_retrans 208, __u32 dsack_dups 216, reord_seen 220, rcv_ooopack 224 (5.4), snd_wnd 228 (5.4).
OFF_STATE = 0
OFF_SND_MSS = 16
OFF_RCV_MSS = 20
OFF_UNACKED = 24
OFF_LOST = 32
OFF_RETRANS = 36
OFF_PMTU = 60
OFF_RTT = 68
OFF_RTTVAR = 72
OFF_SND_CWND = 80
OFF_RCV_RTT = 92
OFF_TOTAL_RETRANS = 100
OFF_BYTES_ACKED = 120
OFF_BYTES_RECEIVED = 128
OFF_MIN_RTT = 148
OFF_DELIVERY_RATE = 160
OFF_BYTES_SENT = 200
OFF_SND_WND = 228
MIN_SIZE = 104  # through tcpi_total_retrans: every kernel since 2.6 has these


class TcpInfo(NamedTuple):
    """The subset iperf3 reports (tcp_info.c: retransmits = total_retrans, snd_cwnd = snd_cwnd x snd_mss,
    rtt, rttvar, pmtu, snd_wnd) plus the receiver-side RTT estimate. Times are microseconds; fields a
    kernel does not provide are None."""

    state: int
    snd_mss: int
    rcv_mss: int
    unacked: int
    lost: int
    pmtu: int
    rtt_us: int
    rttvar_us: int
    snd_cwnd_segments: int
    rcv_rtt_us: int
    total_retrans: int
    bytes_acked: Optional[int]
    bytes_received: Optional[int]
    min_rtt_us: Optional[int]
    delivery_rate: Optional[int]   # bytes per second
    bytes_sent: Optional[int]
    snd_wnd: Optional[int]         # bytes: the peer's advertised receive window after scaling

    @property
    def snd_cwnd_bytes(self) -> int:
        return self.snd_cwnd_segments * self.snd_mss


def read_tcp_info(sock: socket.socket) -> bytes:
    """Raw struct tcp_info of a connected TCP socket (b"" when the OS has no TCP_INFO)."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, READ_SIZE)
    except (OSError, ValueError):
        return b""


def _u32(raw: bytes, off: int) -> Optional[int]:
    return struct.unpack_from("=I", raw, off)[0] if len(raw) >= off + 4 else None


def _u64(raw: bytes, off: int) -> Optional[int]:
    return struct.unpack_from("=Q", raw, off)[0] if len(raw) >= off + 8 else None


def parse_tcp_info(raw: bytes) -> Optional[TcpInfo]:
    """Parse getsockopt(TCP_INFO) bytes in host byte order; None when too short to be a tcp_info."""
    if len(raw) < MIN_SIZE:
        return None

    def req(off: int) -> int:
        value = _u32(raw, off)
        assert value is not None
        return value

    return TcpInfo(
        state=raw[OFF_STATE], snd_mss=req(OFF_SND_MSS), rcv_mss=req(OFF_RCV_MSS), unacked=req(OFF_UNACKED),
        lost=req(OFF_LOST), pmtu=req(OFF_PMTU), rtt_us=req(OFF_RTT), rttvar_us=req(OFF_RTTVAR),
        snd_cwnd_segments=req(OFF_SND_CWND), rcv_rtt_us=req(OFF_RCV_RTT),
        total_retrans=req(OFF_TOTAL_RETRANS), bytes_acked=_u64(raw, OFF_BYTES_ACKED),
        bytes_received=_u64(raw, OFF_BYTES_RECEIVED), min_rtt_us=_u32(raw, OFF_MIN_RTT),
        delivery_rate=_u64(raw, OFF_DELIVERY_RATE), bytes_sent=_u64(raw, OFF_BYTES_SENT),
        snd_wnd=_u32(raw, OFF_SND_WND))


def tcp_info(sock: socket.socket) -> Optional[TcpInfo]:
    return parse_tcp_info(read_tcp_info(sock))


def congestion_control(sock: socket.socket) -> Optional[str]:
    """The socket's TCP congestion control algorithm (TCP_CONGESTION), e.g. "cubic" or "bbr"."""
    opt = getattr(socket, "TCP_CONGESTION", 13)
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, opt, 16)  # TCP_CA_NAME_MAX
    except (OSError, ValueError):
        return None
    return raw.split(b"\0", 1)[0].decode("ascii", "replace") or None
