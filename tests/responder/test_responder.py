"""The responder: allow list, caps, rate limit, timeouts in every state, and abuse, over real sockets."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import signal
import socket
import struct
import subprocess
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.config import ResponderConfig
from agent.exporters.responder import ResponderView
from agent.iperf3 import protocol as p
from agent.iperf3.client import ProbeError, ProbeRequest, run_probe
from agent.iperf3.params import TestParams
from agent.models.profile import BandwidthProfile
from agent.responder.policy import (
    RateLimiter,
    Refused,
    check_caps,
    expected_bytes,
    is_allowed,
    parse_allow,
    resolve_allow,
)
from agent.responder.session import Timeouts
from tests.support.iperf3 import iperf3_bin, iperf3_client, responder, wait_until

# -- pure parts ----------------------------------------------------------------------------------------

def test_resolve_allow() -> None:
    assert [str(n) for n in resolve_allow(["10.1.0.0/16"], lambda: ["172.31.0.0/16"])] == ["10.1.0.0/16"]
    assert [str(n) for n in resolve_allow(None, lambda: ["172.31.0.0/16"])] == ["172.31.0.0/16"]
    assert [str(n) for n in resolve_allow(None, lambda: [])] == ["127.0.0.0/8", "::1/128"]

    def broken() -> list[str]:
        raise OSError("IMDS unreachable")

    assert [str(n) for n in resolve_allow(None, broken)] == ["127.0.0.0/8", "::1/128"]
    assert resolve_allow([], lambda: ["172.31.0.0/16"]) == []  # an explicit empty list allows nobody


def test_is_allowed() -> None:
    allow = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")]
    assert is_allowed("10.2.3.4", allow)
    assert is_allowed("::ffff:10.2.3.4", allow)  # a dual-stack listener's view of an IPv4 client
    assert is_allowed("fd00::1", allow)
    assert not is_allowed("192.168.1.1", allow)
    assert not is_allowed("::ffff:192.168.1.1", allow)
    assert not is_allowed("not-an-ip", allow)


def test_rate_limiter_slides_over_an_hour() -> None:
    now = [1000.0]
    rl = RateLimiter(2, clock=lambda: now[0])
    assert rl.allow("10.0.0.1")
    now[0] += 500
    assert rl.allow("10.0.0.1")
    assert not rl.allow("10.0.0.1")
    assert rl.allow("10.0.0.2")  # per source
    now[0] += 3099
    assert not rl.allow("10.0.0.1")
    now[0] += 2  # the first test is now more than an hour old, the second is not
    assert rl.allow("10.0.0.1")
    assert not rl.allow("10.0.0.1")


CAPS = ResponderConfig(max_duration=30, max_streams=8, max_bytes=10**9, max_tests_per_hour=12)


@pytest.mark.parametrize(("params", "reason"), [
    (TestParams(duration=3600), "duration"),
    (TestParams(duration=25, omit=10), "duration"),
    (TestParams(duration=0), "duration"),  # iperf3 -t 0: until interrupted
    (TestParams(num_streams=128), "streams"),
    (TestParams(bytes=2 * 10**9, duration=0), "bytes"),
    (TestParams(blocks=10**5, blksize=128 * 1024, duration=0), "bytes"),
    (TestParams(protocol="udp", bandwidth=10**9, num_streams=8, duration=10, blksize=1460), "bytes"),
    (TestParams(protocol="sctp"), "unsupported"),
    (TestParams(bidirectional=True, num_streams=5), "streams"),  # 2 x 5 data connections > 8
    (TestParams(protocol="udp", bandwidth=10**9, num_streams=4, duration=10, blksize=1460, bidirectional=True),
     "bytes"),  # each way
    (TestParams(blksize=64 * 1024 * 1024), "unsupported"),
    (TestParams(protocol="udp", blksize=70000, bandwidth=1000), "unsupported"),
])
def test_caps_refuse(params: TestParams, reason: str) -> None:
    with pytest.raises(Refused) as exc:
        check_caps(params, CAPS)
    assert exc.value.reason == reason


@pytest.mark.parametrize("params", [
    TestParams(duration=30, num_streams=8),
    TestParams(duration=5, reverse=True, num_streams=1),
    TestParams(duration=0, bytes=10**8),
    TestParams(protocol="udp", bandwidth=10**6, num_streams=2, duration=10, blksize=1460, reverse=True),
    TestParams(duration=5, num_streams=4, bidirectional=True),
])
def test_caps_allow(params: TestParams) -> None:
    check_caps(params, CAPS)


def test_every_state_has_a_timeout() -> None:
    t = Timeouts()
    for name in ("cookie", "params", "streams", "stream_cookie", "end_grace", "results", "done"):
        assert 0 < getattr(t, name) <= 30, name


# -- over sockets ----------------------------------------------------------------------------------------

def probe(r: object, **kw: object) -> dict:
    host, port = r.address  # type: ignore[attr-defined]
    args: dict = {"streams": 2, "duration": 1.0}
    args.update(kw)
    doc = run_probe(ProbeRequest(host, port, **args))
    # The client is done once it has sent IPERF_DONE; the responder books the test a moment later.
    wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")  # type: ignore[attr-defined]
    return doc


def test_probe_both_ways_and_counters() -> None:
    with responder() as r:
        fwd = probe(r, streams=2)
        rev = probe(r, streams=2, reverse=True)
        snap = r.stats.snapshot()
    assert snap.tests == {"completed": 2, "aborted": 0}
    # The responder counted exactly what it reported to the client.
    assert snap.bytes["in"] == fwd["end"]["sum_received"]["bytes"] > 0
    assert snap.bytes["out"] == rev["end"]["sum_sent"]["bytes"] > 0
    assert not snap.busy and snap.listening
    assert snap.last_test_timestamp > time.time() - 60


def test_back_to_back_tests_find_the_responder_free() -> None:
    """A client that starts its next test the moment the last one ended is served, not told "busy"."""
    with responder(max_tests_per_hour=100) as r:
        for i in range(6):
            run_probe(ProbeRequest(*r.address, streams=2, duration=0.2, reverse=bool(i % 2)))
        wait_until(lambda: r.stats.snapshot().tests["completed"] == 6, what="six tests booked")
        assert r.stats.snapshot().refused["busy"] == 0


def test_udp_both_ways() -> None:
    with responder() as r:
        fwd = probe(r, udp=True, bitrate=20_000_000, streams=2)
        rev = probe(r, udp=True, bitrate=20_000_000, streams=1, reverse=True)
    for doc in (fwd, rev):
        recv = doc["end"]["sum_received"]
        assert recv["packets"] > 0 and recv["lost_percent"] < 5
        assert 0.8 * 20e6 * len(doc["end"]["streams"]) < recv["bits_per_second"] < 1.2 * 20e6 * len(
            doc["end"]["streams"])


def test_disallowed_source_gets_access_denied() -> None:
    with responder(allow=["10.0.0.0/8"]) as r:
        with pytest.raises(ProbeError) as exc:
            probe(r)
        out = iperf3_client("127.0.0.1", r.address[1], "-t", "1")
        snap = r.stats.snapshot()
    assert exc.value.kind == "refused"
    assert "not in the responder's allow list" in str(exc.value)
    assert str(exc.value).startswith(f"peer 127.0.0.1:{r.address[1]}: ")
    assert out.returncode == 1 and "the server is busy running a test" in out.stderr  # ACCESS_DENIED's text
    assert snap.refused["not_allowed"] == 2 and snap.tests["completed"] == 0


def test_silent_client_does_not_hold_the_door() -> None:
    with responder() as r:
        silent = socket.create_connection(r.address)
        t0 = time.monotonic()
        doc = probe(r)  # runs while the silent connection still owes its cookie
        assert doc["end"]["sum_received"]["bytes"] > 0
        assert dropped(silent, 5)  # after the cookie timeout (0.8 s)
        assert time.monotonic() - t0 < 4
        silent.close()
        wait_until(lambda: r.stats.snapshot().dropped["timeout"] == 1, what="drop counted")
        assert r.stats.snapshot().tests["completed"] == 1


@pytest.mark.parametrize("junk", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 20, bytes(range(37)),
                                  b"\x00" * 37])
def test_garbage_instead_of_a_cookie_is_dropped(junk: bytes) -> None:
    with responder() as r:
        s = socket.create_connection(r.address)
        s.sendall(junk)
        assert dropped(s, 3)
        s.close()
        wait_until(lambda: r.stats.snapshot().dropped["garbage"] == 1, what="garbage drop")
        probe(r, duration=0.5)  # the next test is not disturbed
        assert r.stats.snapshot().tests == {"completed": 1, "aborted": 0}


def dropped(sock: socket.socket, timeout: float) -> bool:
    """Whether the peer closed (FIN, or RST when it left our bytes unread) within `timeout`."""
    sock.settimeout(timeout)
    try:
        return sock.recv(16) == b""
    except ConnectionResetError:
        return True


def handshake(addr: tuple[str, int]) -> p.Control:
    """A hand-rolled client up to the parameter exchange."""
    ctrl = p.Control(socket.create_connection(addr), "responder")
    ctrl.send(p.make_cookie())
    assert ctrl.recv_state(2.0) == p.PARAM_EXCHANGE
    return ctrl


@pytest.mark.parametrize(("send", "reason"), [
    (struct.pack("!I", 0x7FFFFFFF), "garbage"),                   # a 2 GiB message is refused unread
    (struct.pack("!I", 5) + b"nope!", "garbage"),                  # not JSON
    (p.encode_message({"tcp": True, "time": "ten"}), "garbage"),   # JSON, wrong types
    (struct.pack("!I", 100) + b"{", "timeout"),                    # a message that never finishes
    (b"", "timeout"),                                              # silence after PARAM_EXCHANGE
])
def test_bad_parameters_are_dropped(send: bytes, reason: str) -> None:
    with responder() as r:
        ctrl = handshake(r.address)
        if send:
            ctrl.send(send)
        assert dropped(ctrl.sock, 4)
        ctrl.sock.close()
        wait_until(lambda: r.stats.snapshot().dropped[reason] == 1, what=f"{reason} drop")
        assert not r.stats.snapshot().busy
        probe(r, duration=0.5)


def test_wrong_stream_cookie_and_client_terminate() -> None:
    with responder() as r:
        ctrl = handshake(r.address)
        ctrl.send_message(TestParams(duration=1, num_streams=1).to_json())
        assert ctrl.recv_state(2.0) == p.CREATE_STREAMS
        intruder = socket.create_connection(r.address)
        intruder.sendall(p.make_cookie())  # right source, wrong cookie
        intruder.settimeout(3)
        assert intruder.recv(1) == p.encode_state(p.ACCESS_DENIED)
        intruder.close()
        ctrl.send_state(p.CLIENT_TERMINATE)
        wait_until(lambda: r.stats.snapshot().dropped["terminated"] == 1, what="terminate")
        ctrl.sock.close()
        assert r.stats.snapshot().tests["aborted"] == 1
        probe(r, duration=0.5)


def test_streams_that_never_come_time_out() -> None:
    with responder() as r:
        ctrl = handshake(r.address)
        ctrl.send_message(TestParams(duration=1, num_streams=4).to_json())
        assert ctrl.recv_state(2.0) == p.CREATE_STREAMS
        t0 = time.monotonic()
        assert dropped(ctrl.sock, 5)  # after Timeouts.streams (2 s)
        assert 1.5 < time.monotonic() - t0 < 4
        ctrl.sock.close()
        wait_until(lambda: r.stats.snapshot().dropped["timeout"] == 1, what="streams timeout")


def test_missing_test_end_aborts_and_the_sender_stops() -> None:
    """A reverse test whose client never says TEST_END: the responder stops sending at the test's length
    (+ send_slack) and gives up at the length + end_grace."""
    with responder() as r:
        cookie = p.make_cookie()
        ctrl = p.Control(socket.create_connection(r.address), "responder")
        ctrl.send(cookie)
        assert ctrl.recv_state(2.0) == p.PARAM_EXCHANGE
        ctrl.send_message(TestParams(duration=1, num_streams=1, reverse=True).to_json())
        assert ctrl.recv_state(2.0) == p.CREATE_STREAMS
        data = socket.create_connection(r.address)
        data.sendall(cookie)
        assert ctrl.recv_state(2.0) == p.TEST_START
        assert ctrl.recv_state(2.0) == p.TEST_RUNNING
        t0 = time.monotonic()
        got = 0
        last_data = t0
        data.settimeout(0.2)
        while time.monotonic() - t0 < 5:
            try:
                chunk = data.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                break
            if not chunk:
                break
            got += len(chunk)
            last_data = time.monotonic()
        assert dropped(ctrl.sock, 1)  # the control connection was dropped
        assert got > 0
        assert last_data - t0 < 1 + 0.5 + 0.5  # duration + send_slack + scheduling slack
        wait_until(lambda: r.stats.snapshot().dropped["timeout"] >= 1, what="TEST_END timeout")
        assert r.stats.snapshot().tests["aborted"] == 1
        data.close()
        ctrl.sock.close()


def test_second_client_while_busy() -> None:
    with responder() as r:
        first = subprocess.Popen([iperf3_bin(), "-c", "127.0.0.1", "-p", str(r.address[1]), "-t", "2", "-P", "2"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: r.stats.snapshot().busy, what="first test running")
            with pytest.raises(ProbeError) as exc:
                probe(r)
            second = iperf3_client("127.0.0.1", r.address[1], "-t", "1")
        finally:
            out, err = first.communicate(timeout=20)
        # The client exits once it has the results; the responder counts the test as completed when its own
        # session has closed, a moment later (a loaded machine stretches that moment).
        wait_until(lambda: r.stats.snapshot().tests["completed"] >= 1, what="the first test counted")
        snap = r.stats.snapshot()
    assert exc.value.kind == "busy" and "busy running a test" in str(exc.value)
    assert second.returncode == 1 and "the server is busy running a test" in second.stderr
    assert first.returncode == 0, err
    assert snap.refused["busy"] == 2 and snap.tests["completed"] == 1


def test_caps_are_refused_with_a_reason() -> None:
    with responder(max_duration=10, max_streams=4) as r:
        long = iperf3_client("127.0.0.1", r.address[1], "-t", "3600")
        wide = iperf3_client("127.0.0.1", r.address[1], "-t", "1", "-P", "128")
        with pytest.raises(ProbeError) as exc:
            probe(r, duration=3600)
        snap = r.stats.snapshot()
    for out in (long, wide):
        assert out.returncode == 1 and "test authorization failed" in out.stderr, out.stderr
    assert exc.value.kind == "refused" and "exceeds max_duration 10s" in str(exc.value)
    assert snap.refused["duration"] == 2 and snap.refused["streams"] == 1
    assert snap.tests == {"completed": 0, "aborted": 0}


def test_byte_cap_bounds_what_the_responder_sends_and_takes() -> None:
    cap = 64 * 1024 * 1024
    with responder(max_bytes=cap) as r:
        rev = probe(r, streams=4, reverse=True, duration=1.5)
        fwd = probe(r, streams=4, duration=1.5)
        snap = r.stats.snapshot()
    # Loopback moves far more than 64 MiB in 1.5 s, so both directions hit the cap.
    assert rev["end"]["sum_sent"]["bytes"] == cap
    assert snap.bytes["out"] == cap
    assert fwd["end"]["sum_received"]["bytes"] == cap == snap.bytes["in"]
    assert fwd["end"]["sum_sent"]["bytes"] > cap  # what sat in socket buffers when the responder stopped reading
    assert snap.tests["completed"] == 2


def test_rate_limit_per_source() -> None:
    with responder(max_tests_per_hour=2) as r:
        probe(r, duration=0.3, streams=1)
        probe(r, duration=0.3, streams=1)
        with pytest.raises(ProbeError) as exc:
            probe(r, duration=0.3, streams=1)
        snap = r.stats.snapshot()
    assert exc.value.kind == "refused" and "max_tests_per_hour" in str(exc.value)
    assert snap.refused["rate_limited"] == 1 and snap.tests["completed"] == 2


def test_client_killed_mid_test_then_next_test_runs() -> None:
    with responder() as r:
        victim = subprocess.Popen([iperf3_bin(), "-c", "127.0.0.1", "-p", str(r.address[1]), "-t", "5"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: r.stats.snapshot().busy, what="victim running")
        time.sleep(0.3)
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
        wait_until(lambda: not r.stats.snapshot().busy, timeout=3, what="abort after the client died")
        probe(r, duration=0.5)
        snap = r.stats.snapshot()
    assert snap.tests == {"completed": 1, "aborted": 1}
    assert snap.dropped["closed"] == 1


def test_stop_during_a_test_is_prompt() -> None:
    with responder() as r:
        proc = subprocess.Popen([iperf3_bin(), "-c", "127.0.0.1", "-p", str(r.address[1]), "-t", "10", "-R"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: r.stats.snapshot().busy, what="test running")
            t0 = time.monotonic()
            r.stop(5.0)
            assert time.monotonic() - t0 < 3
            assert proc.wait(10) != 0  # the client saw its server go away
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not r.stats.snapshot().listening


def test_port_in_use_is_a_metric_not_a_crash() -> None:
    with responder() as r:
        clash = ResponderConfig(listen=f"127.0.0.1:{r.address[1]}")
        from agent.responder.server import Responder

        other = Responder(clash, ["127.0.0.0/8"])
        other.start()  # logs an error, does not raise
        assert not other.stats.snapshot().listening
        other.stop(1.0)


def test_prometheus_view() -> None:
    with responder() as r:
        probe(r, duration=0.5, streams=1)
        registry = CollectorRegistry()
        registry.register(ResponderView(r.stats.snapshot))  # type: ignore[arg-type]
        text = generate_latest(registry).decode()
        get = registry.get_sample_value
        assert get("burstwatch_responder_tests_total", {"result": "completed"}) == 1
        assert get("burstwatch_responder_refused_total", {"reason": "busy"}) == 0
        assert (get("burstwatch_responder_bytes_total", {"direction": "in"}) or 0) > 0
        assert get("burstwatch_responder_listening") == 1
        assert get("burstwatch_responder_allowed_networks") == 1
        assert "burstwatch_responder_dropped_total{reason=\"timeout\"} 0.0" in text


def test_reconfigure_applies_caps_and_allow_list_to_the_next_test() -> None:
    with responder() as r:
        probe(r, duration=0.3, streams=1)
        # (a new listen address waits for a restart: the reload hands the running one, tests/test_reload_keys.py)
        r.reconfigure(ResponderConfig(listen="127.0.0.1:0", max_streams=1), ["10.0.0.0/8"])
        with pytest.raises(ProbeError) as exc:
            probe(r, duration=0.3, streams=1)
        assert "allow list" in str(exc.value)
        r.reconfigure(ResponderConfig(max_streams=1), ["127.0.0.0/8"])
        with pytest.raises(ProbeError) as exc:
            probe(r, duration=0.3, streams=2)
        assert "max_streams 1" in str(exc.value)
        probe(r, duration=0.3, streams=1)
        assert r.stats.snapshot().tests["completed"] == 2


def test_busy_while_this_host_runs_its_own_probe() -> None:
    with responder() as r:
        r.external_busy = lambda: True
        with pytest.raises(ProbeError) as exc:
            probe(r, duration=0.3, streams=1)
        assert exc.value.kind == "busy"
        r.external_busy = lambda: False
        probe(r, duration=0.3, streams=1)
        assert r.stats.snapshot().refused["busy"] >= 1


# -- issue 13: rows 4 and 6 to 9 ---------------------------------------------------------------------------

def test_deeply_nested_parameters_are_garbage_logged_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Row 4: `[` x 60,000 as parameters made json's parser raise RecursionError, counted as stream_error
    with a 20-line traceback per connection."""
    caplog.set_level(logging.INFO, logger="agent.responder")
    with responder() as r:
        ctrl = handshake(r.address)
        ctrl.send(struct.pack("!I", 60_000) + b"[" * 60_000)
        assert dropped(ctrl.sock, 4)
        ctrl.sock.close()
        wait_until(lambda: r.stats.snapshot().dropped["garbage"] == 1, what="garbage drop")
        snap = r.stats.snapshot()
    assert snap.dropped["stream_error"] == 0
    lines = [x for x in caplog.records if x.name.startswith("agent.responder")]
    assert not [x for x in lines if x.exc_info], "a traceback was logged"
    assert any("reason=garbage" in x.getMessage() and "nested too deeply" in x.getMessage() for x in lines)


@pytest.mark.parametrize(("send", "reason"), [
    (b"", "timeout"),                                              # silence after PARAM_EXCHANGE
    (p.encode_message({"tcp": True, "parallel": "many"}), "garbage"),
    (b"\x00\x00", "closed"),                                       # half a length prefix, then gone
])
def test_a_connection_whose_parameters_were_never_accepted_is_not_a_test(send: bytes, reason: str) -> None:
    """Row 6: tests_total counts tests whose cookie *and parameters* were accepted; the rest count only
    under their drop reason."""
    with responder() as r:
        ctrl = handshake(r.address)
        if send:
            ctrl.send(send)
        if reason == "closed":
            ctrl.sock.close()
        else:
            assert dropped(ctrl.sock, 4)
            ctrl.sock.close()
        wait_until(lambda: r.stats.snapshot().dropped[reason] == 1, what=f"{reason} drop")
        wait_until(lambda: not r.stats.snapshot().busy, what="responder free")
        snap = r.stats.snapshot()
    assert snap.tests == {"completed": 0, "aborted": 0}


def test_udp_without_a_rate_is_planned_at_the_peak() -> None:
    """Row 7: UDP `-b 0` (unlimited) was planned as 0 bytes; it is planned at this size's peak, and at
    max_bytes for the credit guard when the peak is unknown."""
    unlimited = TestParams(protocol="udp", bandwidth=0, num_streams=1, duration=10, blksize=1460, reverse=True)
    cfg = ResponderConfig(max_bytes=10**9)
    with pytest.raises(Refused) as exc:
        check_caps(unlimited, cfg, peak_bytes_per_second=1.25e9)  # 10 Gbit/s x 10 s = 12.5 GB
    assert exc.value.reason == "bytes" and "unlimited (-b 0)" in str(exc.value)
    check_caps(unlimited, cfg, peak_bytes_per_second=50e6)  # 500 MB fits
    check_caps(unlimited, cfg)  # no known peak: only the run-time cap bounds it
    assert expected_bytes(unlimited, None, cfg) == 10**9
    assert expected_bytes(unlimited, 50e6, cfg) == 500e6
    assert expected_bytes(dataclasses.replace(unlimited, protocol="tcp", blksize=128 * 1024), None, cfg) is None


def test_udp_without_a_rate_is_refused_over_sockets_when_the_peak_says_so() -> None:
    profile = BandwidthProfile(baseline_bytes_per_second=125e6, peak_bytes_per_second=1.25e9)
    with responder(max_bytes=10**9, profile=lambda: profile) as r:
        out = iperf3_client("127.0.0.1", r.address[1], "-u", "-b", "0", "-t", "2", "-R")
        snap = r.stats.snapshot()
    assert out.returncode == 1 and "test authorization failed" in out.stderr, out.stderr
    assert snap.refused["bytes"] == 1 and snap.bytes == {"in": 0, "out": 0}


@pytest.mark.parametrize("reverse", [False, True], ids=["we-receive", "we-send"])
def test_udp_without_a_rate_stops_at_max_bytes(reverse: bool) -> None:
    """Row 7, at run time: unlimited UDP moves at most max_bytes either way. Receiving, the responder
    closes the stream at the cap (the sender's datagrams then bounce); before, it counted on."""
    cap = 8 * 1024 * 1024
    with responder(max_bytes=cap) as r:
        out = iperf3_client("127.0.0.1", r.address[1], "-u", "-b", "0", "-t", "2", "-l", "1400",
                            *(["-R"] if reverse else []))
        wait_until(lambda: not r.stats.snapshot().busy, timeout=10, what="test over")
        snap = r.stats.snapshot()
    moved = snap.bytes["out" if reverse else "in"]
    assert 0 < moved <= cap, (moved, out.stdout[-500:], out.stderr)
    assert snap.tests["completed"] + snap.tests["aborted"] == 1


def test_a_scoped_allow_entry_matches_only_its_interface() -> None:
    """Row 8: `fe80::%eth0/64` lost its scope id and matched link-local peers on every interface."""
    scoped = parse_allow(["fe80::%lo/64"])
    lo = str(socket.if_nametoindex("lo"))
    assert is_allowed("fe80::1%lo", scoped)
    assert is_allowed(f"fe80::1%{lo}", scoped)  # the same interface by index
    assert not is_allowed("fe80::1%eth7", scoped)
    assert not is_allowed("fe80::1", scoped)  # no scope: not known to be on lo
    assert not is_allowed("fd00::1%lo", scoped)
    assert is_allowed("fe80::1%eth7", parse_allow(["fe80::/64"]))  # an entry without a scope: any link
    assert not is_allowed("fe80::1%lo", parse_allow(["fe80::%nosuchif0/64"]))


def test_bidir_against_the_responder_counts_both_ways() -> None:
    """Row 9: --bidir was refused; both directions' streams now run in one test."""
    with responder() as r:
        doc = probe(r, streams=2, bidir=True)
        snap = r.stats.snapshot()
    end = doc["end"]
    assert snap.tests == {"completed": 1, "aborted": 0}
    assert snap.bytes["in"] == end["sum_received"]["bytes"] > 0          # what we sent, as it took it
    assert snap.bytes["out"] == end["sum_sent_bidir_reverse"]["bytes"] > 0  # what it sent us
    assert [s["sender"]["sender"] for s in end["streams"]] == [True, True, False, False]
    assert doc["start"]["test_start"]["bidir"] == 1


def test_bidir_counts_both_directions_against_max_streams() -> None:
    with responder(max_streams=4) as r:
        with pytest.raises(ProbeError) as exc:
            probe(r, streams=3, bidir=True)
        probe(r, streams=2, bidir=True)
        snap = r.stats.snapshot()
    assert "2 x 3 streams (--bidir) exceed max_streams 4" in str(exc.value)
    assert snap.refused["streams"] == 1 and snap.tests["completed"] == 1
