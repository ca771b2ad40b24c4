"""Interop with Debian's iperf3 3.12 and a current iperf3 (3.21+) both ways: burstwatch -> `iperf3 -s`,
`iperf3 -c` -> the responder, one-way and --bidir.

The two sides of every test must agree: what one side says it received is what the other side's report
shows as received, and sender and receiver rates differ only by what was in flight at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.iperf3.client import ProbeRequest, run_probe
from agent.iperf3.report import summarize
from tests.conftest import require_root_tools
from tests.iperf3.test_report import fixture, missing, shape
from tests.support.iperf3 import (
    free_port,
    iperf3_bin,
    iperf3_json,
    iperf3_new_bin,
    iperf3_server,
    listening,
    responder,
    wait_until,
)
from tests.support.lab import Lab

pytestmark = pytest.mark.slow  # real iperf3 runs of 1-2 s each, about 25 of them

ROOT = Path(__file__).resolve().parents[2]
BIG = 2**50  # the default 10 GiB max_bytes is reached in ~2 s on loopback; these tests measure, not cap


def server_doc(proc: Any) -> dict[str, Any]:
    return json.loads(proc.output())


def close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b))


@pytest.mark.parametrize(("streams", "reverse"), [(1, False), (4, False), (4, True)])
def test_burstwatch_against_iperf3_server(streams: int, reverse: bool) -> None:
    port = free_port()
    with iperf3_server(port, "--json", one_off=True) as srv:
        ours = run_probe(ProbeRequest("127.0.0.1", port, streams=streams, duration=1.5, reverse=reverse))
        theirs = server_doc(srv)
    assert missing(shape(fixture("tcp-reverse" if reverse else "tcp-forward")), shape(ours)) == []
    assert len(ours["end"]["streams"]) == streams == theirs["start"]["test_start"]["num_streams"]
    o, t = ours["end"], theirs["end"]
    # iperf3 3.12's server report holds only its own side. That side equals what our document shows for
    # the server, stream ids matched up; the other side is ours and is at most what the server saw.
    side = "sum_sent" if reverse else "sum_received"
    assert o[side]["bytes"] == t[side]["bytes"] > 0
    assert close(o[side]["bits_per_second"], t[side]["bits_per_second"], 0.05)
    ratio = o["sum_received"]["bytes"] / o["sum_sent"]["bytes"]
    assert 0.9 <= ratio <= 1.0, ratio
    assert close(o["sum_sent"]["bits_per_second"], o["sum_received"]["bits_per_second"], 0.10)
    s = summarize(ours)
    assert s.retransmits is not None and s.retransmits >= 0
    assert s.rtt_mean_seconds is not None and 0 < s.rtt_mean_seconds < 0.1


@pytest.mark.parametrize(("streams", "reverse"), [(1, False), (4, False), (4, True)])
def test_iperf3_client_against_responder(streams: int, reverse: bool) -> None:
    with responder(max_bytes=BIG) as r:
        doc = iperf3_json("127.0.0.1", r.address[1], "-t", "2", "-P", str(streams), *(["-R"] if reverse else []))
        wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
        snap = r.stats.snapshot()
    end = doc["end"]
    assert snap.tests == {"completed": 1, "aborted": 0}
    if reverse:
        assert end["sum_sent"]["bytes"] == snap.bytes["out"] > 0  # iperf3 shows our count as the sender's
    else:
        assert end["sum_received"]["bytes"] == snap.bytes["in"] > 0  # and as the receiver's
    ratio = end["sum_received"]["bytes"] / end["sum_sent"]["bytes"]
    assert 0.9 <= ratio <= 1.0, ratio
    assert close(end["sum_sent"]["bits_per_second"], end["sum_received"]["bits_per_second"], 0.10)
    assert [s["sender" if not reverse else "receiver"]["bytes"] > 0 for s in end["streams"]] == [True] * streams
    if reverse:
        assert end["sum_sent"]["retransmits"] >= 0  # from the responder's TCP_INFO
        assert end["sender_tcp_congestion"] not in ("", "unknown")


def test_udp_both_ways() -> None:
    port = free_port()
    with iperf3_server(port, "--json", one_off=True) as srv:
        ours = run_probe(ProbeRequest("127.0.0.1", port, streams=2, duration=1.5, udp=True, bitrate=50_000_000))
        theirs = server_doc(srv)
    assert missing(shape(fixture("udp-forward")), shape(ours)) == []
    assert ours["end"]["sum_received"]["bytes"] == theirs["end"]["sum_received"]["bytes"] > 0
    assert close(ours["end"]["sum_received"]["bits_per_second"], 100e6, 0.1)
    with responder(max_bytes=BIG) as r:
        doc = iperf3_json("127.0.0.1", r.address[1], "-u", "-b", "20M", "-t", "2", "-R")
    recv = doc["end"]["sum_received"]
    assert close(recv["bits_per_second"], 20e6, 0.1), recv
    assert recv["lost_percent"] < 5 and recv["jitter_ms"] >= 0


def _netns_probe(ns: str, lab: Lab, target: str, seconds: float) -> dict[str, Any]:
    code = ("import json, sys\nfrom agent.iperf3.client import ProbeRequest, run_probe\n"
            f"print(json.dumps(run_probe(ProbeRequest({target!r}, 5201, streams=4, duration={seconds}))))")
    return json.loads(lab.run(ns, sys.executable, "-c", code, timeout=60).stdout)


@pytest.mark.netns
def test_shaped_link_both_tools_agree_with_the_shaper(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 200 Mbit/s tbf between two namespaces: iperf3 and burstwatch both read the shaper's rate."""
    require_root_tools("ip", "tc", "iperf3")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    rate = 200_000_000
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        ia, _ = lab.link(a, b, "10.77.9.1/24", "10.77.9.2/24")
        lab.tbf(a, ia, rate, burst_bytes=256 * 1024)
        lab.popen(b, "iperf3", "-s", "-p", "5201")
        wait_until(lambda: listening(5201, b), timeout=10, what="iperf3 -s in the namespace")
        theirs = json.loads(lab.run(a, "iperf3", "-c", "10.77.9.2", "-t", "3", "-P", "4", "--json").stdout)
        ours = _netns_probe(a, lab, "10.77.9.2", 3.0)
    t_rate = theirs["end"]["sum_received"]["bits_per_second"]
    o_rate = ours["end"]["sum_received"]["bits_per_second"]
    # tbf counts IP packets; the tools count TCP payload (~3 % less at MTU 1500: 1448 of 1500 bytes).
    assert close(t_rate, rate, 0.06), t_rate
    assert close(o_rate, rate, 0.06), o_rate
    assert close(o_rate, t_rate, 0.03), (o_rate, t_rate)



@pytest.mark.parametrize("options", [
    ["-n", "100M"],                 # a byte count instead of a time (time 0)
    ["-k", "200"],                  # a block count (200 x 128 KiB)
    ["-t", "1", "-O", "1"],         # omit the first second
    ["-t", "1", "-w", "1M", "-C", "reno", "-S", "16", "--fq-rate", "2G", "-R"],
    ["-t", "1", "--get-server-output", "-P", "2"],
    ["-t", "1", "-u", "-b", "10M", "--udp-counters-64bit", "-R"],
])
def test_iperf3_options_against_responder(options: list[str]) -> None:
    with responder(max_bytes=BIG) as r:
        doc = iperf3_json("127.0.0.1", r.address[1], *options)
        wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
        snap = r.stats.snapshot()
    end = doc["end"]
    assert snap.tests == {"completed": 1, "aborted": 0}
    assert end["sum_received"]["bytes"] > 0
    if "-n" in options:
        assert end["sum_sent"]["bytes"] >= 100 * 1024 * 1024
    if "-k" in options:
        assert end["sum_sent"]["bytes"] == 200 * 128 * 1024
    if "-O" in options:
        assert 0.9 < end["sum_received"]["seconds"] < 1.2  # the omitted second is not in the results
    if "-C" in options:
        assert end["sender_tcp_congestion"] == "reno"
    if "--get-server-output" in options:
        assert "burstwatch responder: 2 streams" in doc["server_output_text"]


# -- --bidir (issue 13, row 9) and a current iperf3 ----------------------------------------------------------

VERSIONS = {"3.12": iperf3_bin, "3.21": iperf3_new_bin}


def test_the_current_iperf3_is_what_it_says() -> None:
    import subprocess

    out = subprocess.run([iperf3_new_bin(), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("iperf 3.2"), out


@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_iperf3_bidir_against_responder(version: str, udp: bool) -> None:
    """`iperf3 -c --bidir` from 3.12 and 3.21 against the responder: one test, both directions, and each
    side's count of what it moved is what the other reports."""
    extra = ["-u", "-b", "20M"] if udp else []
    with responder(max_bytes=BIG) as r:
        doc = iperf3_json("127.0.0.1", r.address[1], "-t", "2", "-P", "2", "--bidir", *extra,
                          binary=VERSIONS[version]())
        wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
        snap = r.stats.snapshot()
    end = doc["end"]
    assert snap.tests == {"completed": 1, "aborted": 0}
    assert len(end["streams"]) == 4
    # The client's own direction: what the responder received is iperf3's receiver side; the reverse half:
    # what the responder sent is iperf3's sender side.
    assert end["sum_received"]["bytes"] == snap.bytes["in"] > 0
    assert end["sum_sent_bidir_reverse"]["bytes"] == snap.bytes["out"] > 0
    for half in ("", "_bidir_reverse"):
        ratio = end["sum_received" + half]["bytes"] / end["sum_sent" + half]["bytes"]
        # Slack above 1: a UDP datagram counted across the end; iperf3 3.16+ reads its sender threads'
        # counts while their last write may still go out.
        assert 0.9 <= ratio <= (1.01 if udp else 1.001), (half, ratio)
        if udp:
            assert close(end["sum_received" + half]["bits_per_second"], 2 * 20e6, 0.1), end["sum_received" + half]


@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_burstwatch_bidir_against_iperf3_server(version: str, udp: bool) -> None:
    port = free_port()
    with iperf3_server(port, "--json", one_off=True, binary=VERSIONS[version]()) as srv:
        ours = run_probe(ProbeRequest("127.0.0.1", port, streams=2, duration=1.5, bidir=True, udp=udp,
                                      bitrate=20_000_000 if udp else None))
        theirs = server_doc(srv)
    assert missing(shape(fixture("udp-bidir" if udp else "tcp-bidir")), shape(ours)) == []
    o, t = ours["end"], theirs["end"]
    # The server's report holds its own side: what it received of ours, and what it sent us.
    assert o["sum_received"]["bytes"] == t["sum_received"]["bytes"] > 0
    assert close(o["sum_sent_bidir_reverse"]["bytes"], t["sum_sent_bidir_reverse"]["bytes"], 0.01)
    for half in ("", "_bidir_reverse"):
        ratio = o["sum_received" + half]["bytes"] / o["sum_sent" + half]["bytes"]
        # Slack above 1: a UDP datagram counted across the end; iperf3 3.16+ reads its sender threads'
        # counts while their last write may still go out.
        assert 0.9 <= ratio <= (1.01 if udp else 1.001), (half, ratio)


@pytest.mark.parametrize("options", [[], ["-R"], ["-u", "-b", "20M"], ["-u", "-b", "20M", "-R"]],
                         ids=["tcp", "tcp-reverse", "udp", "udp-reverse"])
def test_current_iperf3_one_way_against_responder(options: list[str]) -> None:
    with responder(max_bytes=BIG) as r:
        doc = iperf3_json("127.0.0.1", r.address[1], "-t", "1", "-P", "2", *options, binary=iperf3_new_bin())
        wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
        snap = r.stats.snapshot()
    assert snap.tests == {"completed": 1, "aborted": 0}
    side = "out" if "-R" in options else "in"
    assert snap.bytes[side] > 0 and doc["end"]["sum_received"]["bytes"] > 0


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_burstwatch_told_busy_by_a_stock_server_says_busy_at_once(version: str) -> None:
    """A stock `iperf3 -s` sends ACCESS_DENIED and nothing after it: burstwatch's client, which reads a
    responder's reason after that state, must neither wait for one nor print one (docs/probes.md, "What a
    refused client sees")."""
    import subprocess
    import time

    from agent.iperf3.client import ProbeError

    port = free_port()
    binary = VERSIONS[version]()
    with iperf3_server(port, binary=binary):
        holder = subprocess.Popen([binary, "-c", "127.0.0.1", "-p", str(port), "-t", "3", "-b", "10M"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.8)                     # the holder's test is running
            t0 = time.monotonic()
            with pytest.raises(ProbeError) as exc:
                run_probe(ProbeRequest("127.0.0.1", port, streams=1, duration=1.0))
            assert time.monotonic() - t0 < 1.5
        finally:
            holder.wait(10)
    assert exc.value.kind == "busy"
    assert exc.value.reason == "the server is busy running a test (or refused us: access denied)"
