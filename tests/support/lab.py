"""Network-namespace lab: throwaway hosts joined by veth, with tc shaping; always cleaned up.

Every namespace and link is created inside namespaces this harness owns (names carry a per-run
prefix), addresses are 10.x/192.168.x and ULA fd00::/8 inside them only, and `close()` deletes them
all even when the test failed. Nothing here touches the host's own interfaces.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shlex
import subprocess
import threading
import time
import uuid
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def run_in_ns(ns: str, fn: Callable[[], T], timeout: float = 30.0) -> T:
    """Call fn on a fresh thread that has entered network namespace `ns` (setns is per thread), so
    sockets it opens live there; the caller's own thread never changes namespace."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({ns})")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"call in namespace {ns} took longer than {timeout}s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]

_counter = itertools.count()


def sh(*cmd: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, timeout=timeout)


class Lab:
    """Usage: with Lab() as lab: a = lab.host("a"); b = lab.host("b"); lab.link(a, b, "10.9.0.1/24", "10.9.0.2/24")."""

    def __init__(self) -> None:
        self.prefix = f"bw{os.getpid() % 10000}{next(_counter)}{uuid.uuid4().hex[:3]}"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self._links = 0

    # -- hosts and links ----------------------------------------------------------------------
    def host(self, name: str, forwarding: bool = False, ipv6: bool = False) -> str:
        ns = f"{self.prefix}-{name}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        self.run(ns, "ip", "link", "set", "lo", "up")
        if forwarding:
            self.run(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        if ipv6:
            # No duplicate address detection on the links made later: a tentative link-local address
            # delays everything by ~1 s and a router cannot send neighbour solicitations until it is
            # valid (Linux ndisc_send_ns needs a non-tentative link-local source).
            self.run(ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
            if forwarding:
                self.run(ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
        return ns

    def link(self, a: str, b: str, addr_a: Optional[str], addr_b: Optional[str], mtu: int = 1500,
             names: tuple[str, str] | None = None) -> tuple[str, str]:
        """A veth pair between namespaces a and b; returns the interface names (a side, b side)."""
        self._links += 1
        ia, ib = names or (f"v{self._links}a", f"v{self._links}b")
        tmp_a, tmp_b = f"{self.prefix[:8]}{self._links}a", f"{self.prefix[:8]}{self._links}b"
        # Created directly inside namespace a, so no interface ever appears in the host namespace.
        self.run(a, "ip", "link", "add", tmp_a, "mtu", str(mtu), "type", "veth", "peer", "name", tmp_b,
                 "mtu", str(mtu), "netns", b)
        self.run(a, "ip", "link", "set", tmp_a, "name", ia)
        self.run(b, "ip", "link", "set", tmp_b, "name", ib)
        for ns, ifname, addr in ((a, ia, addr_a), (b, ib, addr_b)):
            if addr:   # IPv6 addresses are usable at once (nodad), see host(ipv6=True)
                self.run(ns, "ip", "addr", "add", addr, "dev", ifname, *(["nodad"] if ":" in addr else []))
            self.run(ns, "ip", "link", "set", ifname, "up")
        return ia, ib

    def wait_ipv6(self, *namespaces: str, timeout: float = 5.0) -> None:
        """Wait until every interface that is up in these namespaces has its IPv6 link-local address. Linux
        adds it only when the carrier-up event is processed (linkwatch, up to ~1 s after `ip link set up`),
        and until then a router sends no neighbour solicitations, so the first packets wait or vanish."""
        deadline = time.monotonic() + timeout
        for ns in namespaces:
            while True:
                up = {line.split(":")[1].strip().split("@")[0]
                      for line in self.run(ns, "ip", "-o", "link", "show", "up").stdout.splitlines()}
                lls = self.run(ns, "ip", "-6", "-o", "addr", "show", "scope", "link", "-tentative").stdout
                ready = {line.split()[1] for line in lls.splitlines()}
                if up - {"lo"} <= ready:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{ns}: no IPv6 link-local address on {sorted(up - {'lo'} - ready)}")
                time.sleep(0.05)

    # -- running things -----------------------------------------------------------------------
    def run(self, ns: str, *cmd: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", ns, *cmd, check=check, timeout=timeout)

    def popen(self, ns: str, *cmd: str, **kw: Any) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        p = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], **kw)
        self.procs.append(p)
        return p

    def http_get(self, ns: str, url: str, timeout: float = 5.0) -> str:
        """GET a URL from inside a namespace (the agent's /metrics listens there)."""
        import urllib.request

        return run_in_ns(ns, lambda: urllib.request.urlopen(url, timeout=timeout).read().decode(),
                         timeout=timeout + 1)

    def wait_http(self, ns: str, url: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                return self.http_get(ns, url, timeout=2.0)
            except OSError as exc:
                last = exc
                time.sleep(0.2)
        raise TimeoutError(f"{url} in {ns} did not answer within {timeout}s: {last}")

    # -- shaping ------------------------------------------------------------------------------
    def tbf(self, ns: str, dev: str, rate_bit: int, burst_bytes: int, peak_bit: Optional[int] = None,
            limit_bytes: int = 2_000_000, mtu: int = 65536) -> None:
        """An EC2-like shaper: tokens at `rate` up to `burst` bytes; `peakrate` caps the burst rate.
        `limit` is set directly: tc's latency form would size the queue from the (huge) burst."""
        cmd = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_bit}bit",
               "burst", str(burst_bytes), "limit", str(limit_bytes)]
        if peak_bit:
            cmd += ["peakrate", f"{peak_bit}bit", "mtu", str(mtu)]
        self.run(ns, *cmd)

    def ifb_ingress(self, ns: str, dev: str, ifb: str = "ifb0") -> str:
        """Redirect `dev`'s ingress through an IFB device so a root qdisc on it shapes inbound traffic."""
        self.run(ns, "ip", "link", "add", ifb, "type", "ifb")
        self.run(ns, "ip", "link", "set", ifb, "up")
        self.run(ns, "tc", "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress")
        # u32 match-all (cls_matchall is not built into every kernel)
        self.run(ns, "tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "u32", "match",
                 "u32", "0", "0", "action", "mirred",
                 "egress", "redirect", "dev", ifb)
        return ifb

    # -- cleanup ------------------------------------------------------------------------------
    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        for ns in reversed(self.namespaces):
            # Killing everything still inside first: a namespace with live processes stays alive.
            sh("ip", "netns", "pids", ns, check=False)
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                sh("kill", "-9", pid, check=False)
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def leftover_namespaces(prefix: str = "bw") -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in out if line.startswith(prefix)]


def quote(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)
