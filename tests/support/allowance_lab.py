"""Lab stand-ins for the ENA PPS and conntrack allowances: nftables limiters in a namespace, their counters, traffic.

Test support only: the daemon's own lab source is decided later (issue 22), and nothing here is an ENA
reader. What stands for what (/work/shared/containers.md, "Lab notes for the other allowances"):

- `pps_allowance_exceeded`: the drop counter of `udp dport P limit rate over N/second counter drop` in the
  instance namespace's input hook. The interface counts a datagram before netfilter drops it, so the packets
  that *passed* (what an instance's own counters show on EC2, where the dropped ones never arrive) are
  counted by a rule after the limiter.
- `conntrack_allowance_exceeded`: the drop counter of `ct state new ct count over N counter drop` in the
  instance's output hook (the instance opens the flows; nf_conntrack_max cannot be set per namespace here).
- `conntrack_allowance_available`: N minus the entries that limit applies to: the namespace's conntrack
  entries this host opened towards the peer, without TCP TIME_WAIT/CLOSE ones (nf_conncount treats those as
  gone, net/netfilter/nf_conncount.c already_closed()).

Everything lives in namespaces a Lab owns (10.77.x addresses); Lab.close() removes them and the traffic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Optional

from tests.support.lab import Lab

TABLE = "bwlab"
PPS_COMMENT = "pps"
PPS_PASSED_COMMENT = "pps-passed"
CONNTRACK_COMMENT = "conntrack"


def install_table(lab: Lab, ns: str) -> None:
    """An inet table with an input and an output filter chain (policy accept) for the limiters."""
    lab.run(ns, "nft", "add", "table", "inet", TABLE)
    for chain, hook in (("input", "input"), ("output", "output")):
        lab.run(ns, "nft", "add", "chain", "inet", TABLE, chain, f"{{ type filter hook {hook} priority 0; }}")


def add_pps_limiter(lab: Lab, ns: str, rate: int, port: int, burst: Optional[int] = None,
                    chain: str = "input") -> None:
    """Drop UDP to `port` above `rate` packets per second; a second rule counts what passed, so drops and
    passed packets come from one `nft list` snapshot (the interface's counters, read a few ms apart from
    nft's at thousands of packets per second, would skew every sample).

    The burst defaults to 50 ms of the rate. nft's default, 5 packets, loses the tokens of any gap longer
    than 5/rate between arrivals (2.5 ms at 2,000/s): a sender descheduled for a few ms on a shared machine
    then let through 1,700/s instead of 2,000 in whole samples, and the lab's ceiling was 12 % under its
    nominal rate. The rate over seconds is still `rate`.

    `chain` "output" limits what this namespace sends: dropped datagrams then never reach the interface, so
    its own packet counters count only what passed, as an instance's do on EC2 (the daemon's lab,
    tests/e2e/test_allowance_daemon.py)."""
    burst = burst if burst is not None else max(5, rate // 20)
    lab.run(ns, "nft", "add", "rule", "inet", TABLE, chain, "udp", "dport", str(port), "limit", "rate", "over",
            f"{rate}/second", "burst", str(burst), "packets", "counter", "drop", "comment", f'"{PPS_COMMENT}"')
    lab.run(ns, "nft", "add", "rule", "inet", TABLE, chain, "udp", "dport", str(port), "counter",
            "comment", f'"{PPS_PASSED_COMMENT}"')


def add_conntrack_limiter(lab: Lab, ns: str, limit: int, daddr: Optional[str] = None) -> None:
    """Refuse new connections this namespace opens beyond `limit` live ones (towards `daddr` only, when
    given: a daemon in the namespace is scraped over loopback, and those connections must not count)."""
    match = ["ip", "daddr", daddr] if daddr else []
    lab.run(ns, "nft", "add", "rule", "inet", TABLE, "output", *match, "ct", "state", "new", "ct", "count", "over",
            str(limit), "counter", "drop", "comment", f'"{CONNTRACK_COMMENT}"')


def parse_counters(text: str) -> dict[str, int]:
    """`nft -j list table` JSON -> packets of each commented rule's counter, by comment."""
    out: dict[str, int] = {}
    for item in json.loads(text).get("nftables", []):
        rule = item.get("rule")
        if not rule or "comment" not in rule:
            continue
        for expr in rule.get("expr", []):
            if "counter" in expr:
                out[rule["comment"]] = int(expr["counter"]["packets"])
    return out


def read_counters(lab: Lab, ns: str) -> tuple[float, dict[str, int]]:
    """(monotonic time of the snapshot: the middle of the nft call, counters by comment)."""
    t0 = time.monotonic()
    text = lab.run(ns, "nft", "-j", "list", "table", "inet", TABLE, timeout=10).stdout
    return (t0 + time.monotonic()) / 2, parse_counters(text)


def anchor(lab: Lab, ns: str) -> str:
    """A process parked in `ns`; its /proc/PID is a procfs root that shows that namespace's /proc/net."""
    p = lab.popen(ns, "sleep", "600", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # `ip netns exec` execs sleep in place, so the pid is sleep's once the exec is done.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{p.pid}/exe").endswith("sleep"):
                break
        except OSError:
            pass
        time.sleep(0.01)
    return f"/proc/{p.pid}"


def conntrack_entries(procfs: str, dst: str) -> int:
    """Entries the conntrack limiter applies to: opened towards `dst`, not a closed TCP connection."""
    n = 0
    with open(os.path.join(procfs, "net/nf_conntrack"), encoding="ascii") as f:
        for line in f:
            v = line.split()
            if f"dst={dst}" not in v or (v[2] == "tcp" and v[5] in ("TIME_WAIT", "CLOSE")):
                continue
            n += 1
    return n


def tc_overlimits(lab: Lab, ns: str, dev: str) -> int:
    """The root qdisc's overlimits (the lab's bandwidth shaping signal, as shaping_source = "tc" reads it)."""
    for q in json.loads(lab.run(ns, "tc", "-s", "-j", "qdisc", "show", "dev", dev, timeout=10).stdout):
        if q.get("root"):
            return int(q.get("overlimits", 0))
    return 0


# -- traffic (separate processes, so the test's sampling thread does not slow the senders) --------------
_UDP_BLAST = r"""
import socket, sys, time
dst, port, pps, seconds, size = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
s.connect((dst, port))
data = b"x" * size
start = time.monotonic(); sent = 0
while True:
    now = time.monotonic() - start
    if now >= seconds:
        break
    due = int(now * pps) - sent
    for _ in range(due):
        try:
            s.send(data)
        except OSError:
            pass
    sent += max(due, 0)
    time.sleep(0.0005)
"""

_SERVER = r"""
import select, socket, sys
socks = []
for port in map(int, sys.argv[2:]):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_INET, kind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((sys.argv[1], port))
        if kind == socket.SOCK_STREAM:
            s.listen(4096)
        socks.append(s)
held = []
print("ready", flush=True)
while True:
    for s in select.select(socks + held, [], [], 1.0)[0]:
        if s in held:
            if not s.recv(65536):       # the client closed: close too, so the flow ends (TIME_WAIT there)
                held.remove(s)
                s.close()
        elif s.type == socket.SOCK_STREAM:
            held.append(s.accept()[0])
        else:
            s.recv(65536)
"""

# Opens flows at a steady pace and holds them; prints "t ok|fail proto port" per attempt, "done" at the end.
_CLIENT = r"""
import socket, sys, time
dst, rate, hold = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
plan = []
for item in sys.argv[4:]:
    proto, port, count = item.split(":")
    plan += [(proto, int(port))] * int(count)
held = []
start = time.monotonic()
for i, (proto, port) in enumerate(plan):
    delay = start + i / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    s = socket.socket(socket.AF_INET, kind)
    s.settimeout(0.2)
    t = time.monotonic()
    try:
        s.connect((dst, port))
        if kind == socket.SOCK_DGRAM:
            s.send(b"hello")
        held.append(s)
        ok = "ok"
    except OSError:
        s.close()
        ok = "fail"
    # an open: when it completed (the table took it); a refusal: when it was attempted (the drop)
    print(f"{time.monotonic() if ok == 'ok' else t:.4f} {ok} {proto} {port}", flush=True)
print("done", flush=True)
time.sleep(hold)
"""

# Bursty churn: every `period` s open `burst` TCP flows, hold them `life` s, close them (then TIME_WAIT,
# which the conntrack limiter no longer counts).
_CHURN = r"""
import socket, sys, time
dst, port, burst = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
period, life, seconds = float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
start = time.monotonic()
k = 0
while time.monotonic() - start < seconds:
    socks = []
    for _ in range(burst):
        s = socket.socket(); s.settimeout(0.2)
        t = time.monotonic()
        try:
            s.connect((dst, port)); socks.append(s)
        except OSError:
            s.close()
            print(f"{t:.4f} fail tcp {port}", flush=True)
    time.sleep(life)
    for s in socks:
        s.close()
    k += 1
    time.sleep(max(0.0, start + k * period - time.monotonic()))
"""


def churn_flows(lab: Lab, ns: str, dst: str, port: int, burst: int, period: float, life: float,
                seconds: float) -> subprocess.Popen:
    """Bursty connection churn: `burst` short TCP flows every `period` s, each held `life` s."""
    return lab.popen(ns, sys.executable, "-c", _CHURN, dst, str(port), str(burst), str(period), str(life),
                     str(seconds), text=True)


def stop_and_read(p: subprocess.Popen) -> list[str]:
    """Kill a traffic process and return what it printed."""
    p.kill()
    out, _ = p.communicate(timeout=5)
    return [line.strip() for line in (out or "").splitlines()]


def udp_blast(lab: Lab, ns: str, dst: str, port: int, pps: float, seconds: float,
              size: int = 64) -> subprocess.Popen:
    """Paced UDP datagrams of `size` bytes to dst:port at `pps` for `seconds` (back to back in 0.5-ms slots),
    at a raised priority so that other work on a shared machine leaves fewer gaps in it."""
    return lab.popen(ns, "nice", "-n", "-10", sys.executable, "-c", _UDP_BLAST, dst, str(port), str(pps),
                     str(seconds), str(size), stdout=subprocess.DEVNULL)


def flow_server(lab: Lab, ns: str, addr: str, ports: list[int]) -> subprocess.Popen:
    """TCP and UDP listeners on `ports` that accept and hold every connection until its client closes it;
    returns once they listen."""
    p = lab.popen(ns, sys.executable, "-c", _SERVER, addr, *map(str, ports), text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"flow server in {ns} did not start: {line!r} {p.stderr.read() if p.stderr else ''}")
    return p


def open_flows(lab: Lab, ns: str, dst: str, plan: list[tuple[str, int, int]], rate: float,
               hold: float = 30.0) -> subprocess.Popen:
    """Open the flows of `plan` ((proto, port, count), in order) to `dst` at `rate` per second and hold them
    `hold` s. Its stdout says, per attempt, when it finished and whether it connected."""
    return lab.popen(ns, sys.executable, "-c", _CLIENT, dst, str(rate), str(hold),
                     *(f"{p}:{port}:{n}" for p, port, n in plan), text=True)


def wait_line(p: subprocess.Popen, want: str, timeout: float) -> list[str]:
    """Lines of `p`'s stdout until one equals `want` (blocking reads; bounded by the caller's timeout)."""
    assert p.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        line = line.strip()
        if line == want:
            return lines
        lines.append(line)
    raise TimeoutError(f"{want!r} not seen within {timeout}s; got {lines[-3:]}")


def pair(lab: Lab) -> tuple[str, str, str, str]:
    """Two namespaces joined by veth: (inst, peer, inst interface, peer interface). inst is 10.77.0.1,
    peer 10.77.0.2."""
    inst, peer = lab.host("inst"), lab.host("peer")
    ia, ib = lab.link(inst, peer, "10.77.0.1/24", "10.77.0.2/24")
    return inst, peer, ia, ib


INST_ADDR, PEER_ADDR = "10.77.0.1", "10.77.0.2"


def first_fail_time(lines: list[str]) -> Optional[float]:
    """The monotonic time of the client's first refused attempt."""
    for line in lines:
        v = line.split()
        if len(v) == 4 and v[1] == "fail":
            return float(v[0])
    return None
