"""Network-namespace lab: throwaway hosts joined by veth, with tc shaping; always cleaned up.

Every namespace and link is created inside namespaces this harness owns (names carry a per-run
prefix), addresses are 10.x/192.168.x inside them only, and `close()` deletes them all even when
the test failed. Nothing here touches the host's own interfaces.
"""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
import time
import uuid
from typing import Any, Optional

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
    def host(self, name: str, forwarding: bool = False) -> str:
        ns = f"{self.prefix}-{name}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        self.run(ns, "ip", "link", "set", "lo", "up")
        if forwarding:
            self.run(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
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
            if addr:
                self.run(ns, "ip", "addr", "add", addr, "dev", ifname)
            self.run(ns, "ip", "link", "set", ifname, "up")
        return ia, ib

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
        code = ("import sys,urllib.request;"
                f"sys.stdout.write(urllib.request.urlopen({url!r},timeout={timeout}).read().decode())")
        return self.run(ns, "python3", "-c", code, timeout=timeout + 5).stdout

    def wait_http(self, ns: str, url: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                return self.http_get(ns, url, timeout=2.0)
            except subprocess.CalledProcessError as exc:
                last = exc
                time.sleep(0.2)
        raise TimeoutError(f"{url} in {ns} did not answer within {timeout}s: {last}")

    # -- shaping ------------------------------------------------------------------------------
    def tbf(self, ns: str, dev: str, rate_bit: int, burst_bytes: int, peak_bit: Optional[int] = None,
            latency_ms: int = 200, mtu: int = 65536) -> None:
        """An EC2-like shaper: tokens at `rate` up to `burst` bytes; `peakrate` caps the burst rate."""
        cmd = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_bit}bit",
               "burst", str(burst_bytes), "latency", f"{latency_ms}ms"]
        if peak_bit:
            cmd += ["peakrate", f"{peak_bit}bit", "mtu", str(mtu)]
        self.run(ns, *cmd)

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

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def leftover_namespaces(prefix: str = "bw") -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in out if line.startswith(prefix)]


def quote(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)
