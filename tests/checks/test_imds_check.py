"""The imds check against a real IMDSv2 server: ok, disabled, unreachable, switched off on loopback; and in
a network-namespace lab, the hop limit that keeps the token from a pod without host networking."""

from __future__ import annotations

import pytest

from agent import config as configmod
from agent.checks import run_checks
from agent.readers.imds import ImdsClient
from tests.checks.helpers import fixture_context
from tests.conftest import free_port, require_root_tools
from tests.support.imds_server import ImdsServer
from tests.support.lab import Lab, run_in_ns


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


# -- hop limit: a router between the client and IMDS, as a pod's own network namespace is on EC2 --------

HOP_REMEDY = "aws ec2 modify-instance-metadata-options --instance-id <instance-id> --http-put-response-hop-limit 2"


def _hop_lab(lab: Lab) -> tuple[str, str, str]:
    """pod --veth-- node (forwarding) --veth-- imds, 10.77.x inside the lab only; returns the namespaces."""
    pod, node, imds = lab.host("pod"), lab.host("node", forwarding=True), lab.host("imds")
    lab.link(pod, node, "10.77.1.2/24", "10.77.1.1/24")
    lab.link(node, imds, "10.77.2.1/24", "10.77.2.2/24")
    lab.run(pod, "ip", "route", "add", "default", "via", "10.77.1.1")
    lab.run(imds, "ip", "route", "add", "default", "via", "10.77.2.1")
    return pod, node, imds


def _verdict_in(ns: str, url: str):  # type: ignore[no-untyped-def]
    cfg = configmod.parse(f'[imds]\nendpoint = "{url}"\ntimeout = 0.5\nretries = 1\n')
    client = ImdsClient(cfg.imds.endpoint, timeout=cfg.imds.timeout, retries=cfg.imds.retries)
    return run_in_ns(ns, lambda: run_checks(
        fixture_context("ena-2.12.3g-m6i.xlarge", cfg=cfg, imds_probe=client.probe), ["imds"])[0])


@pytest.mark.netns
@pytest.mark.parametrize("hop_limit, client, status", [
    (1, "pod", "fail"),    # one router hop: the token answer dies there (a pod without hostNetwork)
    (1, "node", "ok"),     # the node's own namespace: hop limit 1 is enough (hostNetwork: true)
    (2, "pod", "ok"),      # AWS's fix for containers
])
def test_hop_limit_seen_from_a_pod(hop_limit: int, client: str, status: str) -> None:
    require_root_tools("ip", "sysctl")
    with Lab() as lab:
        pod, node, imds_ns = _hop_lab(lab)
        server = run_in_ns(imds_ns, lambda: ImdsServer(host="10.77.2.2", hop_limit=hop_limit).start())
        try:
            v = _verdict_in(pod if client == "pod" else node, server.url)
        finally:
            server.stop()
        # Both attempts reached the server: the handshake and the request crossed the router.
        assert server.count("PUT", "/latest/api/token") >= 1
    assert v.status == status, v.summary
    if status == "fail":
        assert "hop limit" in v.summary and "accepted the connection" in v.summary
        assert v.evidence["hop_limit_suspected"] is True
        assert HOP_REMEDY in v.remedy and "--http-endpoint enabled" in v.remedy
    else:
        assert "IMDSv2" in v.summary


def test_nothing_listening_is_not_called_a_hop_limit() -> None:
    """A refused connection is an absent IMDS, not the hop limit."""
    v = _verdict(f"http://127.0.0.1:{free_port()}")
    assert "not reachable" in v.summary and "hop_limit_suspected" not in v.evidence
