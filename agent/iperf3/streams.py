"""The data plane: one thread per TCP/UDP stream moving bytes with the GIL released in send/recv."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Optional

from agent.iperf3.tcpinfo import TcpInfo, tcp_info

log = logging.getLogger(__name__)

# One write or read per call moves up to 1 MiB. Measured on loopback (2 vCPUs, Linux 6.x, Python 3.11,
# docs/probes.md): 1 MiB send() beats 128 KiB (iperf3's block) by ~25 % per stream because the
# interpreter's per-call cost is paid 8x less often; os.sendfile() from a memfd was ~2x *slower*
# (page-reference skbs on loopback), so plain send() of one pre-filled buffer it is. iperf3 peers read
# in their own `len` blocks: TCP is a byte stream, so our write size is invisible to them.
TCP_CHUNK = 1024 * 1024
# How often a blocked worker wakes to look at its stop flag.
POLL = 0.2
# A receive buffer shared by all TCP receivers: with MSG_TRUNC the kernel never writes into it, so an
# anonymous mapping (pages become resident only when written) costs no memory, where a zero-filled
# bytearray kept 1 MiB resident in the daemon for the responder's sake.
_DISCARD = mmap.mmap(-1, TCP_CHUNK)
_payload_lock = threading.Lock()
_payload: Optional[bytes] = None


def payload() -> bytes:
    """1 MiB of random bytes, made once per process (iperf3 also sends random data by default, so a
    compressing middlebox cannot flatter the result)."""
    global _payload
    with _payload_lock:
        if _payload is None:
            _payload = os.urandom(TCP_CHUNK)
        return _payload


def kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Blocking mode with SO_RCVTIMEO/SO_SNDTIMEO instead of Python's settimeout(): Python implements
    settimeout with non-blocking I/O plus a poll() before every call, so each call returns as soon as the
    socket buffer is full/empty. In blocking mode one send()/recv(MSG_WAITALL) moves the whole 1 MiB per
    GIL release, which is what lets several streams run on several cores."""
    sock.settimeout(None)
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


class ByteBudget:
    """Bytes a whole test may still move (the responder's max_bytes, a client's `-n`); thread-safe."""

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, want: int) -> int:
        """Reserve up to `want` bytes; returns how many may be moved (0 when exhausted)."""
        if self.limit is None:
            return want
        with self._lock:
            n = max(0, min(want, self.limit - self.used))
            self.used += n
            return n

    def give_back(self, n: int) -> None:
        if self.limit is not None and n > 0:
            with self._lock:
                self.used -= n

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.used >= self.limit


@dataclass
class Sample:
    """A stream's cumulative counters at one instant (monotonic time `t`)."""

    t: float
    bytes: int
    info: Optional[TcpInfo] = None
    packets: int = 0
    errors: int = 0
    outoforder: int = 0
    jitter: float = 0.0


@dataclass(frozen=True)
class StreamSettings:
    rate: int = 0                    # bits per second for this stream; 0 = as fast as possible
    blksize: int = 128 * 1024        # UDP datagram size (TCP writes TCP_CHUNK regardless)
    udp_counters_64bit: bool = False
    deadline: Optional[float] = None  # monotonic time after which a sender stops on its own


class Stream:
    """One data connection. `start()` runs a worker thread; counters are plain ints the worker alone
    writes and others read (an int read is atomic under the GIL)."""

    def __init__(self, sid: int, sock: socket.socket, sender: bool, udp: bool, settings: StreamSettings,
                 budget: Optional[ByteBudget] = None, label: str = "") -> None:
        self.id = sid
        self.sock = sock
        self.fd = sock.fileno()
        self.sender = sender
        self.udp = udp
        self.settings = settings
        self.budget = budget or ByteBudget(None)
        self.label = label
        self.bytes = 0
        self.packets = 0          # UDP: datagrams sent, or the highest sequence number received
        self.errors = 0           # UDP receiver: datagrams lost
        self.outoforder = 0
        self.jitter = 0.0         # UDP receiver: RFC 1889 interarrival jitter, seconds
        self.counting = True      # receivers keep draining after the end without counting
        self.error: Optional[str] = None
        self.eof = False
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.stop_event = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self._prev_transit: Optional[float] = None
        try:
            self.local = sock.getsockname()
            self.remote = sock.getpeername()
        except OSError:
            self.local = self.remote = ("", 0)

    # -- control --------------------------------------------------------------------------------------
    def start(self, t0: float) -> None:
        self.started_at = t0
        target = {(False, True): self._tcp_send, (False, False): self._tcp_recv,
                  (True, True): self._udp_send, (True, False): self._udp_recv}[(self.udp, self.sender)]
        self.thread = threading.Thread(target=self._run, args=(target,), daemon=True,
                                       name=f"iperf3-{self.label}{'tx' if self.sender else 'rx'}{self.id}")
        self.thread.start()

    def stop_counting(self) -> None:
        """The test is over for the books: a receiver keeps draining (so a blocking peer is never
        stuck) but counts nothing more."""
        if not self.stopped_at:
            self.stopped_at = time.monotonic()
        self.counting = False

    def stop(self) -> None:
        """Ask the worker to stop after its current call; receivers stop counting at once."""
        if not self.stopped_at:
            self.stopped_at = time.monotonic()
        self.counting = False
        self.stop_event.set()

    def join(self, timeout: float) -> bool:
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    def close(self) -> None:
        """Wake a worker blocked in the kernel (shutdown), wait briefly, then close the socket."""
        self.stop()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.join(2.0)
        try:
            self.sock.close()
        except OSError:
            pass

    def sample(self, now: Optional[float] = None) -> Sample:
        info = tcp_info(self.sock) if not self.udp else None
        return Sample(t=now if now is not None else time.monotonic(), bytes=self.bytes, info=info,
                      packets=self.packets, errors=self.errors, outoforder=self.outoforder,
                      jitter=self.jitter)

    # -- workers --------------------------------------------------------------------------------------
    def _run(self, target: object) -> None:
        try:
            target()  # type: ignore[operator]
        except OSError as exc:
            if not self.stop_event.is_set():
                self.error = f"{'send' if self.sender else 'receive'} failed: {exc}"
                log.debug("stream %s: %s", self.id, self.error)
        except Exception as exc:  # a bug must not kill the daemon
            self.error = f"unexpected error: {exc!r}"
            log.exception("stream %s failed", self.id)

    def _pace(self, sent: int, rate_bytes: float) -> float:
        """Seconds to wait before the next write to hold `rate_bytes` per second (0 = go)."""
        if rate_bytes <= 0:
            return 0.0
        ahead = sent / rate_bytes - (time.monotonic() - self.started_at)
        return ahead if ahead > 0 else 0.0

    def _tcp_send(self) -> None:
        sock, stop, budget = self.sock, self.stop_event, self.budget
        data = memoryview(payload())
        rate_bytes = self.settings.rate / 8.0
        # With a rate, write about 10 ms worth at a time so pacing stays smooth.
        chunk = TCP_CHUNK if rate_bytes <= 0 else int(min(TCP_CHUNK, max(1448, rate_bytes / 100)))
        deadline = self.settings.deadline
        kernel_timeouts(sock, POLL)
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return
            wait = self._pace(self.bytes, rate_bytes)
            if wait > 0:
                stop.wait(min(wait, POLL))
                continue
            n = budget.take(chunk)
            if n == 0:
                stop.wait(POLL)  # cap reached: stay connected, send nothing more
                continue
            try:
                sent = sock.send(data[:n])
            except OSError as exc:
                budget.give_back(n)
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                    continue
                raise
            budget.give_back(n - sent)
            self.bytes += sent

    def _tcp_recv(self) -> None:
        sock, stop, budget = self.sock, self.stop_event, self.budget
        # MSG_TRUNC on a TCP socket makes Linux discard the data instead of copying it to us (tcp(7),
        # tcp_recvmsg: "if (!(flags & MSG_TRUNC)) copy"): the receiver's copy is most of its CPU.
        # MSG_WAITALL: one call returns a whole chunk (or what came before SO_RCVTIMEO), not every skb.
        flags = getattr(socket, "MSG_TRUNC", 0)
        waitall = getattr(socket, "MSG_WAITALL", 0)
        buf = _DISCARD if flags else bytearray(TCP_CHUNK)
        kernel_timeouts(sock, POLL)
        while not stop.is_set():
            counting = self.counting
            want = budget.take(TCP_CHUNK) if counting else TCP_CHUNK
            if want == 0:
                # Cap reached: stop reading, so TCP flow control holds the sender back.
                stop.wait(POLL)
                continue
            try:
                got = sock.recv_into(buf, want, flags | waitall)
            except OSError as exc:
                if counting:
                    budget.give_back(want)
                if exc.errno == errno.EINVAL and flags:
                    flags, buf = 0, bytearray(TCP_CHUNK)  # not Linux: copy after all
                    continue
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    continue
                if exc.errno in (errno.ECONNRESET, errno.EPIPE) and not counting:
                    return  # the peer closed after the end: nothing left to count
                raise
            if counting:
                budget.give_back(want - got)
                self.bytes += got
            if got == 0:
                self.eof = True
                return

    # -- UDP (iperf_udp.c's datagram format: sec, usec, sequence as big-endian u32, or a u64 sequence
    #    with udp_counters_64bit; sequence numbers start at 1) -------------------------------------------
    def _udp_send(self) -> None:
        sock, stop, budget = self.sock, self.stop_event, self.budget
        size = self.settings.blksize
        header = "!IIQ" if self.settings.udp_counters_64bit else "!III"
        if size < struct.calcsize(header):
            raise OSError(errno.EINVAL, f"UDP block size {size} is smaller than the iperf3 header")
        buf = bytearray(payload()[:size].ljust(size, b"\0"))
        rate_bytes = self.settings.rate / 8.0
        deadline = self.settings.deadline
        kernel_timeouts(sock, POLL)
        while not stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            wait = self._pace(self.bytes, rate_bytes)
            if wait > 0:
                # Sleeping in slices of at most 1 ms keeps bursts short (iperf3's pacing_timer is 1 ms).
                stop.wait(min(wait, 0.001))
                continue
            if budget.take(size) < size:
                stop.wait(POLL)
                continue
            # iperf3 stamps datagrams with its monotonic clock (iperf_time.c); only differences matter.
            t = time.monotonic()
            struct.pack_into(header, buf, 0, int(t) & 0xFFFFFFFF, int((t % 1) * 1e6), self.packets + 1)
            try:
                sent = sock.send(buf)
            except OSError as exc:
                budget.give_back(size)
                if exc.errno in (errno.ENOBUFS, errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNREFUSED):
                    continue  # a full queue or an ICMP bounce: the datagram is lost, go on
                raise
            self.packets += 1
            self.bytes += sent

    def _udp_recv(self) -> None:
        sock, stop, budget = self.sock, self.stop_event, self.budget
        header = "!IIQ" if self.settings.udp_counters_64bit else "!III"
        hsize = struct.calcsize(header)
        buf = bytearray(65536)
        kernel_timeouts(sock, POLL)
        while not stop.is_set():
            try:
                got = sock.recv_into(buf)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNREFUSED):
                    continue
                raise
            if not self.counting or got < hsize:
                continue
            took = budget.take(got)
            if took < got:
                budget.give_back(took)
                # Cap reached. A UDP sender does not wait for its receiver, so reading less would not slow
                # it: close the socket instead, and the kernel answers its datagrams with ICMP port
                # unreachable, which makes iperf3 (and burstwatch) senders fail their sends and stop.
                self.counting = False
                sock.close()
                return
            arrival = time.monotonic()
            sec, usec, seq = struct.unpack_from(header, buf, 0)
            self.bytes += got
            self.account(seq, arrival - (sec + usec / 1e6))

    def account(self, seq: int, transit: float) -> None:
        """Loss, reordering and jitter for one datagram, as iperf_udp.c iperf_udp_recv counts them:
        a gap counts as loss, a late datagram as out of order (and takes one loss back), jitter is
        RFC 1889's running mean of |transit difference| with gain 1/16. Clocks need not agree: only
        differences of transit times matter."""
        if seq >= self.packets + 1:
            if seq > self.packets + 1:
                self.errors += seq - 1 - self.packets
            self.packets = seq
        else:
            self.outoforder += 1
            if self.errors > 0:
                self.errors -= 1
        if self._prev_transit is None:
            self._prev_transit = transit
        d = abs(transit - self._prev_transit)
        self._prev_transit = transit
        self.jitter += (d - self.jitter) / 16.0


class CpuMeter:
    """This process's CPU use since creation, as iperf_util.c cpu_util computes it: user and system time
    from getrusage over wall-clock time, in percent of one CPU (so above 100 with several busy threads)."""

    def __init__(self) -> None:
        import resource

        self._resource = resource
        self.t0 = time.monotonic()
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)

    def read(self) -> tuple[float, float, float]:
        """(total, user, system) percent."""
        r1 = self._resource.getrusage(self._resource.RUSAGE_SELF)
        wall = time.monotonic() - self.t0
        if wall <= 0:
            return 0.0, 0.0, 0.0
        user = (r1.ru_utime - self.r0.ru_utime) / wall * 100.0
        system = (r1.ru_stime - self.r0.ru_stime) / wall * 100.0
        return user + system, user, system
