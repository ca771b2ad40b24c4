"""top_owners and flow_count: who fills the conntrack table, from flows."""

from __future__ import annotations

from pathlib import Path

from agent.models.flows import REMEDIES, flow_count, listening_ports, top_owners
from agent.readers.flows import Flow, ProcFlowSource

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "flows"


def out(port: int, n: int, proto: str = "tcp", peer: str = "10.0.0.9") -> list[Flow]:
    return [Flow(proto, "10.0.0.1", 40000 + i, peer, port, "ESTABLISHED") for i in range(n)]


def test_lab_capture() -> None:
    flows = ProcFlowSource(str(FIXTURES)).flows()
    owners = top_owners(flows, 3)
    # 3 x tcp/8002, 2 x udp/8003, then the ties of one flow ordered by protocol and port; loopback and
    # listeners are no flows
    assert [(o.protocol, o.direction, o.port, o.count) for o in owners] == [
        ("tcp", "out", 8002, 3), ("udp", "out", 8003, 2), ("tcp", "out", 8001, 1)]
    assert flow_count(flows) == 8     # 3 + 1 tcp v4, 1 tcp v6, 2 udp v4, 1 udp v6
    assert ("tcp", 5432) in listening_ports(flows) and ("udp", 5353) in listening_ports(flows)


def test_inbound_flows_group_on_the_listening_port() -> None:
    flows = [Flow("tcp", "0.0.0.0", 443, "0.0.0.0", 0, "LISTEN")]
    flows += [Flow("tcp", "10.0.0.1", 443, f"10.0.1.{i % 4}", 50000 + i, "ESTABLISHED") for i in range(10)]
    flows += out(5432, 4) + out(53, 6, "udp", "10.0.0.2")
    owners = top_owners(flows)
    assert [(o.direction, o.protocol, o.port, o.count) for o in owners] == [
        ("in", "tcp", 443, 10), ("out", "udp", 53, 6), ("out", "tcp", 5432, 4)]
    assert owners[0].peer_count == 4 and owners[0].peers == (("10.0.1.0", 3), ("10.0.1.1", 3), ("10.0.1.2", 2))


def test_closed_listeners_and_loopback_are_no_flows() -> None:
    flows = [Flow("tcp", "10.0.0.1", 1, "10.0.0.2", 80, "TIME_WAIT"),
             Flow("tcp", "10.0.0.1", 3, "10.0.0.2", 80, "FIN_WAIT2"),
             Flow("tcp", "127.0.0.1", 2, "127.0.0.1", 80, "ESTABLISHED"),
             Flow("tcp", "0.0.0.0", 80, "0.0.0.0", 0, "LISTEN")]
    assert flow_count(flows) == 1 and top_owners(flows)[0].port == 80 and top_owners(flows)[0].count == 1
    assert top_owners([], 3) == []


def test_remedies_name_what_aws_documents() -> None:
    text = " ".join(REMEDIES)
    assert "0.0.0.0/0" in text and "432,000" in text and "NAT gateway" in text and "ICMP" in text
