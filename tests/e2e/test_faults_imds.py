"""IMDS flapping: the real daemon starts through an IMDS that fails every third request, keeps sampling and
serving /metrics while IMDS fails or hangs outright, counts every failed attempt in
burstwatch_imds_requests_total, and finishes an ENI re-match once IMDS answers again."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_faults_eni import ENI0, ENI1, MAC1, SAMPLE, eni_lab, present
from tests.support.imds_server import ImdsServer, metadata_tree

pytestmark = [pytest.mark.netns, pytest.mark.slow]


class FlappingImds(ImdsServer):
    """Answers HTTP 500 to every third request while `flapping`; `down` fails them all."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.flapping = True
        self.down = False
        self._n = itertools.count(1)

    def _answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        n = next(self._n)
        if self.down or (self.flapping and n % 3 == 0):
            return 500, "Internal Server Error"
        return super()._answer(method, path, headers)


def errors(m: dict[str, float], result: str = "error") -> float:
    return sum(v for k, v in m.items() if k.startswith("burstwatch_imds_requests_total") and f'result="{result}"' in k)


def timeouts(m: dict[str, float]) -> float:
    return errors(m, "timeout")


def test_daemon_starts_runs_and_rematches_through_a_flapping_imds(tmp_path: Path) -> None:
    imds = FlappingImds(metadata_tree(enis=(ENI0,)))
    with eni_lab(tmp_path, imds) as e:
        m = e.metrics()
        # Discovery got through on the client's retries: on EC2, eth0 found by MAC, the errors counted.
        assert any(k.startswith("burstwatch_instance_info") and 'on_ec2="true"' in k for k in m), m
        assert m[present("eth0")] == 1.0
        assert errors(m) >= 1
        assert m['burstwatch_imds_requests_total{request="metadata",result="ok"}'] >= 5

        # IMDS fails outright while an ENI is attached: sampling and /metrics go on, the re-match waits.
        imds.down = True
        e.imds.tree = metadata_tree(enis=(ENI0, ENI1))
        e.attach("eth1", MAC1, "10.79.1.1/24", "10.79.1.2/24")
        t0, before = time.monotonic(), e.metrics()
        time.sleep(6 * SAMPLE)
        during = e.metrics()
        elapsed = time.monotonic() - t0
        assert during["burstwatch_samples_total"] - before["burstwatch_samples_total"] >= elapsed / SAMPLE - 2
        assert present("eth1") not in during
        assert errors(during) > errors(before)
        log = e.log.read_text()
        assert log.count("re-matching ENIs to interfaces failed") == 1, log    # once, not per retry

        # Then it hangs (timeouts) until a retry has timed out, and comes back: eth1 joins on a retry.
        imds.down, imds.hang = False, True
        hung = e.wait(lambda m: timeouts(m) >= 1, 20, "a re-match timing out")
        assert hung["burstwatch_samples_total"] > during["burstwatch_samples_total"]
        assert present("eth1") not in hung
        imds.hang = False
        e.wait(lambda m: m.get(present("eth1")) == 1.0, 20, "eth1 joining once IMDS answers")
        assert "re-matching ENIs to interfaces works again" in e.log.read_text()
        final: dict[str, Any] = e.metrics()
        assert final['burstwatch_collector_success{collector="netdev"}'] == 1.0
