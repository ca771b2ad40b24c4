"""A 30-second CloudWatch outage, for real: the endpoint goes away and comes back, and no datapoint is lost."""

from __future__ import annotations

import logging
import math
import threading
import time

import pytest

from agent.models.credit_model import CreditReading
from tests.cloudwatch.test_publisher import (  # _publishers_end_with_their_test is an autouse fixture
    COMMON,
    _publishers_end_with_their_test,  # noqa: F401
    assert_stats_match,
    cw_client,
    expected_sets,
    make_publisher,
    rising,
    snapshot,
    statistics,
    wait_for,
)
from tests.support.throttle_proxy import ThrottleProxy

# The figure, run as is (once, ~40 s of the suite): a scaled-down outage would not show that
# botocore's backoff, the connection pool and the backlog together ride out half a minute.
OUTAGE_SECONDS = 30.0


@pytest.mark.slow
def test_endpoint_down_for_30_seconds_loses_nothing_within_the_backlog(
        moto: str, proxy: ThrottleProxy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent.cloudwatch.publisher")
    # high resolution (1 s periods, a flush each second): the outage spans ~30 periods and ~30 flushes
    pub = make_publisher(proxy.url, period=1, flush_interval=1.0)
    pub.start()
    fed: dict[str, list[tuple[float, float]]] = {"in": [], "out": []}
    done = threading.Event()

    def sampler() -> None:          # the daemon's sampler at 10 Hz, with figures we can check
        k = 0
        while not done.is_set():
            t = time.time()
            rates = {"in": 1e6 + k, "out": 2e6 + 3 * k}
            credits = {d: CreditReading(d, rates[d], 1e9, 2e9, 0.5, math.inf, math.inf) for d in rates}
            pub.observe(snapshot(t, credits, rates, rising(k, {"in": 5, "out": 0})))
            for d, rate in rates.items():
                fed[d].append((t, rate))
            k += 1
            done.wait(0.1)

    feeder = threading.Thread(target=sampler, name="fake-sampler")
    feeder.start()
    try:
        wait_for(lambda: pub.snapshot().published > 0, 10, "publishing before the outage")
        proxy.down()
        time.sleep(OUTAGE_SECONDS)
        during = pub.snapshot()
        proxy.up()
        time.sleep(2.0)
    finally:
        done.set()
        feeder.join()
    wait_for(lambda: pub.snapshot().backlog == 0, 60, "the backlog to drain after the outage")
    pub.stop(1.5)                                   # and the last open second goes out at stop

    # the outage was real: calls failed and ~30 s of datapoints waited in the backlog
    assert during.errors["network"] >= 5
    # (at least half the outage's periods: on a loaded machine botocore's retry backoff delays some flushes;
    # that nothing was lost is checked against CloudWatch below, second by second)
    assert during.backlog >= 8 * (OUTAGE_SECONDS / 2)
    st = pub.snapshot()
    assert st.backlog == 0 and not any(st.dropped.values()), st.dropped
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("network error" in m for m in warnings) == 1      # one line for ~30 failed flushes
    assert any("works again" in r.getMessage() for r in caplog.records)

    # every second that had samples is in CloudWatch with its exact statistic set
    cw = cw_client(moto)
    for d, samples in fed.items():
        first, last = samples[0][0], samples[-1][0]
        got = statistics(cw, "ThroughputBytesPerSecond", [*COMMON, {"Name": "Direction", "Value": d}],
                         math.floor(first), math.floor(last) + 1, 1)
        want = expected_sets(samples, 1)
        assert len(want) >= OUTAGE_SECONDS + 3
        assert_stats_match(got, want, "Bytes/Second")
    shaping = statistics(cw, "ShapingEvents", [*COMMON, {"Name": "Direction", "Value": "in"}],
                         math.floor(fed["in"][0][0]), math.floor(fed["in"][-1][0]) + 1, 1)
    assert sum(p["Sum"] for p in shaping.values()) == 5 * (len(fed["in"]) - 1)   # every increase counted
