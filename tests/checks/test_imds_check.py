"""The imds check against a real IMDSv2 server on loopback: ok, disabled, unreachable, switched off."""

from __future__ import annotations

import pytest

from agent import config as configmod
from agent.checks import run_checks
from agent.readers.imds import ImdsClient
from tests.checks.helpers import fixture_context
from tests.conftest import free_port
from tests.support.imds_server import ImdsServer


def _verdict(endpoint: str, extra: str = ""):  # type: ignore[no-untyped-def]
    cfg = configmod.parse(f'{extra}\n[imds]\nendpoint = "{endpoint}"\ntimeout = 0.5\nretries = 0\n')
    client = ImdsClient(cfg.imds.endpoint, timeout=cfg.imds.timeout, retries=cfg.imds.retries)
    (v,) = run_checks(fixture_context("ena-2.12.3g-m6i.xlarge", cfg=cfg, imds_probe=client.probe), ["imds"])
    return v


def test_imdsv2_reachable() -> None:
    with ImdsServer() as imds:
        v = _verdict(imds.url)
    assert v.status == "ok" and "IMDSv2" in v.summary and v.evidence["imdsv2"] is True and v.interface == ""


def test_imds_disabled_is_a_failure() -> None:
    with ImdsServer(disabled=True) as imds:
        v = _verdict(imds.url)
    assert v.status == "fail" and "403" in v.summary and "--http-endpoint enabled" in v.remedy


@pytest.mark.parametrize("extra, status", [
    ("", "fail"),
    ('interfaces = ["eth0"]\n[instance]\ntype = "m6i.xlarge"', "warn"),   # it can run on the config alone
])
def test_imds_unreachable(extra: str, status: str) -> None:
    v = _verdict(f"http://127.0.0.1:{free_port()}", extra)
    assert v.status == status and "not reachable" in v.summary and "hop-limit" in v.remedy


def test_imds_switched_off() -> None:
    cfg = configmod.parse("[imds]\nenabled = false\n")
    (v,) = run_checks(fixture_context("ena-2.12.3g-m6i.xlarge", cfg=cfg), ["imds"])
    assert v.status == "skip" and "imds.enabled = false" in v.summary
