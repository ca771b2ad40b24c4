"""Sockets for iperf3 tests: listening sockets, both ends of the data-connection handshake, and streams."""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any, Callable, Optional, Sequence, Union

from agent.iperf3 import protocol as p
from agent.iperf3.params import TestParams
from agent.iperf3.streams import ByteBudget, Stream, StreamSettings

log = logging.getLogger(__name__)

# Largest socket buffer a client may ask for ("window"); the kernel caps it again at net.core.*mem_max.
MAX_WINDOW = 64 * 1024 * 1024


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def bind_socket(host: str, port: int, *, udp: bool = False, backlog: int = 64) -> socket.socket:
    """A bound socket on host:port (listening when TCP). An IPv6 host ("::") is dual-stack, so "[::]"
    serves IPv4 too; a name is resolved; an empty host is every IPv4 address. The socket is closed
    again when binding fails (the OSError is raised)."""
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if host and ":" not in host and not _is_ip(host):
        family = socket.getaddrinfo(host, port, 0, kind)[0][0]
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
        if not udp:
            sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def connect_data(family: int, addr: Any, *, udp: bool, cookie: bytes, timeout: float) -> socket.socket:
    """The client's end of a data connection: TCP connects and sends the test's cookie (iperf_tcp.c
    iperf_tcp_connect); UDP connects, sends the 4-byte "connect" datagram and waits for the server's
    reply (iperf_udp.c iperf_udp_connect; any content: older servers differ). Raises socket.timeout or
    OSError, with the socket closed."""
    sock = socket.socket(family, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(addr)
        if udp:
            sock.send(p.UDP_CONNECT_MSG)
            sock.recv(64)
        else:
            sock.sendall(cookie)
    except OSError:
        sock.close()
        raise
    return sock


def answer_udp(sock: socket.socket, addr: Any, rebind: Callable[[], socket.socket]) -> socket.socket:
    """The server's end of the UDP handshake (iperf_udp.c iperf_udp_accept): the listener that got the
    client's datagram becomes that stream's socket, connected back to the client; `rebind` makes the
    next listener *before* the reply goes out (the client sends its next stream's datagram as soon as
    it reads the reply), and is returned."""
    sock.connect(addr)
    listener = rebind()
    sock.send(p.UDP_CONNECT_REPLY)
    return listener


def make_streams(socks: Sequence[socket.socket], *, sender: Union[bool, Sequence[bool]], udp: bool,
                 settings: StreamSettings, budget: Optional[ByteBudget], label: str,
                 send_budget: Optional[ByteBudget] = None) -> list[Stream]:
    """One Stream per data connection, numbered with iperf3's stream ids (1, 3, 4, ...): the client and
    the server number the same connections the same way, which is how results are matched. `sender` is
    every stream's role, or one role per connection (--bidir); sending streams draw on `send_budget`
    when it is given, the others on `budget`."""
    roles = [sender] * len(socks) if isinstance(sender, bool) else list(sender)
    if len(roles) != len(socks):
        raise ValueError(f"{len(roles)} roles for {len(socks)} data connections")
    return [Stream(sid, sock, sender=role, udp=udp, settings=settings,
                   budget=(send_budget or budget) if role else budget, label=label)
            for sid, sock, role in zip(p.stream_ids(len(socks)), socks, roles)]


def apply_test_options(sock: socket.socket, params: TestParams) -> None:
    """The socket options a client may ask the server for (-w, -N, -C, -S, --fq-rate), within reason;
    failures are ignored, as iperf3 only warns."""
    opts: list[tuple[int, int, Any]] = []
    if params.window:
        w = min(params.window, MAX_WINDOW)
        opts += [(socket.SOL_SOCKET, socket.SO_SNDBUF, w), (socket.SOL_SOCKET, socket.SO_RCVBUF, w)]
    if params.protocol == "tcp":
        if params.nodelay:
            opts.append((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1))
        if params.congestion:
            opts.append((socket.IPPROTO_TCP, getattr(socket, "TCP_CONGESTION", 13),
                         params.congestion.encode("ascii", "replace")))
    if params.tos:
        opts.append((socket.IPPROTO_IP, socket.IP_TOS, params.tos))
    if params.fqrate and hasattr(socket, "SO_MAX_PACING_RATE"):
        opts.append((socket.SOL_SOCKET, socket.SO_MAX_PACING_RATE, min(params.fqrate // 8, 2**32 - 1)))
    for level, opt, value in opts:
        try:
            sock.setsockopt(level, opt, value)
        except OSError as exc:
            log.debug("test stream: setsockopt(%s, %s) failed: %s", level, opt, exc)
