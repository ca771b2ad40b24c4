"""ENIs attached and detached while the real daemon runs: in a network namespace the test owns, with the
test IMDS server listing the ENIs' MACs, a new veth joins the monitored set within a sample or two (matched
by MAC, as at start-up) and a removed one leaves without a spike in rates or shaping counters."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from agent.discovery import EniWatcher
from agent.readers.imds import ImdsClient
from tests.conftest import ROOT, require_root_tools
from tests.support.credit_lab import parse_metrics
from tests.support.daemon_config import daemon_config
from tests.support.imds_server import FakeEni, ImdsServer, metadata_tree
from tests.support.lab import Lab, run_in_ns

pytestmark = pytest.mark.netns

MAC0, MAC1 = "0a:1b:2c:3d:4e:01", "0a:1b:2c:3d:4e:02"
ENI0 = FakeEni(MAC0, interface_id="eni-0a1b2c3d4e5f60001")
ENI1 = FakeEni(MAC1, device_number=1, interface_id="eni-0a1b2c3d4e5f60002", local_ipv4s=("10.79.1.1",))
METRICS = "http://127.0.0.1:9786/metrics"
# Lab timing: sample_interval 0.5 s (EC2 default 1 s).
SAMPLE = 0.5


@dataclass
class EniLab:
    lab: Lab
    a: str                 # the instance's namespace (daemon, IMDS)
    b: str                 # the rest of the VPC
    imds: ImdsServer
    proc: Any
    log: Path

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.lab.http_get(self.a, METRICS))

    def attach(self, name: str, mac: str, addr_a: str, addr_b: str) -> None:
        """A veth with the ENI's MAC appears in the instance's namespace (its peer in b), as an attach does."""
        self.lab.run(self.a, "ip", "link", "add", name, "address", mac, "type", "veth", "peer", "name",
                     f"p{name}", "netns", self.b)
        self.lab.run(self.a, "ip", "addr", "add", addr_a, "dev", name)
        self.lab.run(self.b, "ip", "addr", "add", addr_b, "dev", f"p{name}")
        self.lab.run(self.b, "ip", "link", "set", f"p{name}", "up")
        self.lab.run(self.a, "ip", "link", "set", name, "up")

    def samples(self, n: int) -> dict[str, float]:
        """The metrics once the daemon has taken `n` more samples (proof that time passed for it; no pause)."""
        start = self.metrics()["burstwatch_samples_total"]
        return self.wait(lambda m: m["burstwatch_samples_total"] >= start + n, 10 + n * SAMPLE, f"{n} more samples")

    def wait(self, cond: Callable[[dict[str, float]], bool], timeout: float, what: str) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        m: dict[str, float] = {}
        while time.monotonic() < deadline:
            m = self.metrics()
            if cond(m):
                return m
            time.sleep(0.05)
        raise AssertionError(f"{what} not reached within {timeout}s; log:\n{self.log.read_text()[-3000:]}")


@contextlib.contextmanager
def eni_lab(tmp_path: Path, imds: Optional[ImdsServer] = None,
            extra: Optional[dict[str, Any]] = None) -> Iterator[EniLab]:
    """Namespace a holds eth0 (ENI0's MAC), the IMDS server and the daemon, which discovers its
    interfaces from IMDS (no `interfaces` in the config); `extra` adds config keys (tables)."""
    require_root_tools("ip", "tc")
    imds = imds or ImdsServer(metadata_tree(enis=(ENI0,)))
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, "10.79.0.1/24", "10.79.0.2/24", names=("eth0", "eth0"))
        lab.run(a, "ip", "link", "set", "eth0", "address", MAC0)
        run_in_ns(a, imds.start)
        try:
            cfg = daemon_config(tmp_path, sample_interval=SAMPLE, interfaces=None,
                                metrics={"listen": "127.0.0.1:9786"}, imds={"endpoint": imds.url, "timeout": 0.5},
                                instance={"describe_api": False}, credits={"shaping_source": "tc"}, **(extra or {}))
            log = tmp_path / "agent.log"
            proc = lab.popen(a, sys.executable, "-m", "agent", "run", "--config", str(cfg), cwd=str(ROOT),
                             stdout=open(tmp_path / "stdout", "wb"), stderr=open(log, "wb"))
            lab.wait_http(a, METRICS)
            yield EniLab(lab, a, b, imds, proc, log)
        finally:
            imds.stop()


def udp_burst(lab: Lab, ns: str, src: str, dst: str, seconds: float, rate_bytes: float) -> int:
    """Send UDP from `src` to `dst` (in another namespace) at about `rate_bytes` for `seconds`; returns bytes."""
    sock = run_in_ns(ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sock.bind((src, 0))
    payload = b"x" * 1400
    sent = 0
    start = time.monotonic()
    try:
        while (now := time.monotonic()) < start + seconds:
            for _ in range(10):
                try:
                    sock.sendto(payload, (dst, 9999))
                    sent += len(payload)
                except OSError:
                    pass          # the qdisc is full: what a shaper does
            time.sleep(max(0.0, start + sent / rate_bytes - now))
    finally:
        sock.close()
    return sent


IN, OUT = '{direction="in"}', '{direction="out"}'
SHAPED_OUT = 'burstwatch_shaping_packets_total{direction="out",source="tc"}'


def present(name: str) -> str:
    return f'burstwatch_interface_present{{interface="{name}"}}'


def test_an_attached_eni_joins_within_two_samples_and_a_detached_one_leaves_without_a_spike(
        tmp_path: Path) -> None:
    with eni_lab(tmp_path) as e:
        # A shaper on eth0 too (20 Mbit/s, tbf), with some overlimits of its own: the shaping signal stays
        # supported after eth1 leaves, so a spike would show.
        e.lab.tbf(e.a, "eth0", 20_000_000, 3000, limit_bytes=30_000)
        udp_burst(e.lab, e.a, "10.79.0.1", "10.79.0.2", 0.5, 10e6)
        m = e.wait(lambda m: m.get(SHAPED_OUT, 0) > 0 and m.get(present("eth0")) == 1.0, 10, "eth0 shaped")
        assert present("eth1") not in m

        # Attach: IMDS lists the new ENI, and its interface appears.
        e.imds.tree = metadata_tree(enis=(ENI0, ENI1))
        before = e.metrics()["burstwatch_samples_total"]
        e.attach("eth1", MAC1, "10.79.1.1/24", "10.79.1.2/24")
        e.lab.tbf(e.a, "eth1", 20_000_000, 3000, limit_bytes=30_000)
        m = e.wait(lambda m: m.get(present("eth1")) == 1.0, 10, "eth1 joining")
        # The first sample after the attach sees the new name (one listdir) and starts the re-match; the
        # next one samples eth1. Scrapes lag by at most one sample.
        assert m["burstwatch_samples_total"] - before <= 3, m["burstwatch_samples_total"] - before
        assert "eth1 joined (ENI eni-0a1b2c3d4e5f60002, mac 0a:1b:2c:3d:4e:02, card 0, device 1)" in e.log.read_text()
        info = [k for k in m if k.startswith("burstwatch_imds_requests_total")]
        assert info, "IMDS requests are counted"

        # Traffic over eth1 above its shaper: counted on eth1, in the instance rate and the shaping signal.
        sent = udp_burst(e.lab, e.a, "10.79.1.1", "10.79.1.2", 1.5, 6e6)
        m = e.samples(2)
        counted = m['burstwatch_interface_bytes_total{direction="out",interface="eth1"}']
        assert counted >= 0.3 * sent      # what passed the shaper (20 Mbit/s of 48 offered), with headers
        shaped = m[SHAPED_OUT]
        quiet = e.samples(2)             # quiet: rates back to ~0
        assert quiet[SHAPED_OUT] == shaped and quiet["burstwatch_throughput_bytes_per_second" + OUT] < 50_000

        # Detach: the ENI leaves IMDS and its interface goes away (with its large counters).
        e.imds.tree = metadata_tree(enis=(ENI0,))
        before = quiet["burstwatch_samples_total"]
        e.lab.run(e.a, "ip", "link", "del", "eth1")
        seen: list[dict[str, float]] = []
        deadline = time.monotonic() + 8 * SAMPLE
        while time.monotonic() < deadline:
            seen.append(e.metrics())
            time.sleep(0.05)
        gone = next(i for i, s in enumerate(seen) if present("eth1") not in s)
        assert seen[gone]["burstwatch_samples_total"] - before <= 2
        for s in seen:
            # no spike: the instance rate stays at the quiet level, the shaping total does not move
            assert s["burstwatch_throughput_bytes_per_second" + OUT] < 50_000, s
            assert s["burstwatch_throughput_bytes_per_second" + IN] < 50_000, s
            assert s[SHAPED_OUT] == shaped
        assert seen[-1][present("eth0")] == 1.0
        assert "interface(s) eth1 gone" in e.log.read_text()


def test_an_interface_imds_lists_late_joins_on_retry_and_one_it_never_lists_is_left_alone(tmp_path: Path) -> None:
    with eni_lab(tmp_path) as e:
        e.attach("eth1", MAC1, "10.79.1.1/24", "10.79.1.2/24")       # the kernel first, IMDS later
        assert present("eth1") not in e.samples(4)
        e.imds.tree = metadata_tree(enis=(ENI0, ENI1))
        # retried after 1 s, then 2 s, 4 s ...: within ~4 s of IMDS listing it
        e.wait(lambda m: m.get(present("eth1")) == 1.0, 10, "eth1 joining once IMDS lists it")
        e.lab.run(e.a, "ip", "link", "add", "dock0", "type", "bridge")   # not an ENI
        m = e.samples(6)
        assert present("dock0") not in m and m[present("eth0")] == 1.0 and m[present("eth1")] == 1.0


def eni_info(interface: str, eni: FakeEni) -> str:
    """The burstwatch_interface_info series the daemon should expose for `eni` on `interface`."""
    return (f'burstwatch_interface_info{{device_index="{eni.device_number}",eni_id="{eni.interface_id}",'
            f'interface="{interface}",mac="{eni.mac}",network_card="{eni.network_card_index}"}}')


def test_interface_info_names_each_interfaces_eni_from_imds_and_follows_attach_and_detach(tmp_path: Path) -> None:
    """burstwatch_interface_info carries IMDS's interface-id, device-number and network-card-index for each
    monitored interface (matched by MAC), so interface series join on ENI IDs; an ENI IMDS lists without an
    interface here has no row, and the rows follow an attach and a detach."""
    card1 = FakeEni(MAC1, device_number=1, network_card_index=1, interface_id="eni-0a1b2c3d4e5f60002")
    absent = FakeEni("0a:1b:2c:3d:4e:09", device_number=2, interface_id="eni-0a1b2c3d4e5f60009")
    with eni_lab(tmp_path, imds=ImdsServer(metadata_tree(enis=(ENI0, absent)))) as e:
        m = e.wait(lambda m: m.get(eni_info("eth0", ENI0)) == 1.0, 10, "eth0's ENI row")
        rows = sorted(k for k in m if k.startswith("burstwatch_interface_info"))
        assert rows == [eni_info("eth0", ENI0)], rows          # not the ENI without an interface here

        e.imds.tree = metadata_tree(enis=(ENI0, card1, absent))
        e.attach("eth1", MAC1, "10.79.1.1/24", "10.79.1.2/24")
        m = e.wait(lambda m: m.get(eni_info("eth1", card1)) == 1.0, 10, "eth1's ENI row (network card 1)")
        assert m[eni_info("eth0", ENI0)] == 1.0

        e.imds.tree = metadata_tree(enis=(ENI0, absent))
        e.lab.run(e.a, "ip", "link", "del", "eth1")
        m = e.wait(lambda m: eni_info("eth1", card1) not in m and m.get(present("eth1")) is None, 10,
                   "eth1's row gone after the detach")
        assert sorted(k for k in m if k.startswith("burstwatch_interface_info")) == [eni_info("eth0", ENI0)]


# -- the watcher itself, on a sysfs tree the test writes (fast; no namespace) ----------------------------
class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "class" / "net").mkdir(parents=True)

    def add(self, name: str, mac: str) -> None:
        d = self.root / "class" / "net" / name
        d.mkdir()
        (d / "address").write_text(mac + "\n")

    def remove(self, name: str) -> None:
        d = self.root / "class" / "net" / name
        (d / "address").unlink()
        d.rmdir()


def test_watcher_backs_off_while_imds_fails_and_publishes_each_change(tmp_path: Path) -> None:
    from agent.discovery import InstanceInfo
    from agent.models.profile import BandwidthProfile
    from agent.readers.imds import parse_eni

    sysfs = FakeSysfs(tmp_path)
    sysfs.add("eth0", MAC0)
    clock = [100.0]
    changes: list[list[str]] = []
    with ImdsServer(metadata_tree(enis=(ENI0,))) as imds:
        eni0 = parse_eni(MAC0, {"device-number": "0", "network-card-index": "0", "interface-id": ENI0.interface_id})
        info = InstanceInfo(True, None, [eni0], ["eth0"], [], None, BandwidthProfile(), {},
                            eni_interfaces={MAC0: "eth0"})
        w = EniWatcher(info, ImdsClient(imds.url, timeout=0.3, retries=0), lambda _e, ifs, _m: changes.append(ifs),
                       str(tmp_path), clock=lambda: clock[0], background=False)
        w.poll()
        assert w.refreshes == 0                       # nothing changed: no IMDS request at all
        sysfs.add("eth1", MAC1)
        imds.fail_next = 1000                         # IMDS answering 500s
        w.poll()
        assert w.refreshes == 1 and changes == []
        for step in (0.5, 0.6, 1.0, 1.0, 2.0):        # retried after 1 s, then 2 s, then 4 s
            clock[0] += step
            w.poll()
        assert w.refreshes == 3
        imds.fail_next = 0
        imds.tree = metadata_tree(enis=(ENI0, ENI1))
        clock[0] += 4.0
        w.poll()
        assert changes == [["eth0", "eth1"]] and w.refreshes == 4
        sysfs.remove("eth1")
        w.poll()                                      # leaves at once, without asking IMDS
        assert changes[-1] == ["eth0"] and w.refreshes == 4
