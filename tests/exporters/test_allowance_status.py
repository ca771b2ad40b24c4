"""`burstwatch status`'s allowance section, from the exposition of the fixture readings (exposition.py)."""

from __future__ import annotations

from agent.exporters.status import build_status, json_safe, render_text
from agent.readers.daemon_metrics import parse_metrics
from tests.exporters import exposition


def test_status_shows_the_table_the_ceiling_and_link_local() -> None:
    doc = build_status(parse_metrics(exposition.exposition().decode()))
    a = doc["allowances"]
    c, p, ll = a["conntrack"], a["pps"], a["linklocal"]
    assert (c["size"], c["size_method"], c["in_use_ratio"], c["full_seconds"]) == (4000.0, "exceeded", 0.75, 1800.0)
    assert c["owners"] == [{"protocol": "tcp", "direction": "out", "port": 443, "flows": 2500},
                           {"protocol": "udp", "direction": "in", "port": 53, "flows": 400}]
    assert (p["ceiling"], p["source"], p["near_ceiling"]) == (100000.0, "learned", True)
    assert ll["exceeded_total"] == 3 and "DNS" in ll["hint"]
    text = render_text(json_safe(doc))
    assert "conntrack: 75.0% of 4,000 (exceeded) in use, full in 30m00s; dropped 12" in text
    assert "busiest: tcp out 443 (2500), udp in 53 (400)" in text
    assert "pps: 95,000 packets/s of a 100,000/s ceiling (learned), 95%  NEAR CEILING" in text
    assert "link-local: 3 packets dropped: likely DNS" in text


def test_status_without_the_figures_says_nothing_of_them() -> None:
    doc = build_status(parse_metrics("burstwatch_samples_total 3\n"))
    assert doc["allowances"] is None
    assert "conntrack" not in render_text(doc)
