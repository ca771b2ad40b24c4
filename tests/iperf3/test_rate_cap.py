"""A baseline-capped probe (iperf3's -b per stream) is paced in both directions: forward our client paces,
with -R the server does, from the rate in the parameters JSON. Checked against burstwatch's responder and
Debian's stock `iperf3 -s` over loopback, where an uncapped test would run at several Gbit/s."""

from __future__ import annotations

from typing import Any

import pytest

from agent.iperf3.client import ProbeRequest, run_probe
from tests.support.iperf3 import free_port, iperf3_server, responder, wait_until

PER_STREAM = 40_000_000         # bit/s: 2 streams x 40 Mbit/s = an 80 Mbit/s "baseline"
STREAMS = 2
DURATION = 2.0


def _check(doc: dict[str, Any]) -> None:
    cap = PER_STREAM * STREAMS
    assert doc["start"]["test_start"]["reverse"] in (0, 1)
    for side in ("sum_sent", "sum_received"):
        rate = doc["end"][side]["bits_per_second"]
        # Paced to the cap (a little under: the pacing starts from zero each stream; never much over).
        assert 0.85 * cap < rate < 1.05 * cap, (side, rate)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_responder_paces_a_capped_probe(reverse: bool) -> None:
    with responder() as r:
        host, port = r.address
        doc = run_probe(ProbeRequest(host, port, streams=STREAMS, duration=DURATION, reverse=reverse,
                                     bitrate=PER_STREAM))
        wait_until(lambda: not r.stats.snapshot().busy, what="responder settled")
    _check(doc)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_stock_iperf3_server_paces_a_capped_probe(reverse: bool) -> None:
    port = free_port()
    with iperf3_server(port, one_off=True):
        doc = run_probe(ProbeRequest("127.0.0.1", port, streams=STREAMS, duration=DURATION, reverse=reverse,
                                     bitrate=PER_STREAM))
    _check(doc)
