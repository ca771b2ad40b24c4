"""The nft lab source: limiter counters from `nft -j list table` and the entries a `ct count` limit counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.readers.errors import NotSupported
from agent.readers.nft import NftCounters, NftReader, parse_nf_conntrack, parse_nft_table

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nft"


def test_parse_nft_table_finds_the_limiters_by_their_expressions() -> None:
    text = (FIXTURES / "list_table_bwlab.json").read_text()
    assert parse_nft_table(text) == NftCounters(1995, 20, 20)


@pytest.mark.parametrize("text, want", [
    ('{"nftables": []}', NftCounters(None, None, None)),
    # a limiter without a counter is no stand-in; a plain counter rule is neither kind
    ('{"nftables": [{"rule": {"expr": [{"limit": {"rate": 5, "inv": true}}, {"drop": null}]}},'
     ' {"rule": {"expr": [{"counter": {"packets": 7, "bytes": 9}}]}}]}', NftCounters(None, None, None)),
    # `limit rate` without `over` (inv) accepts rather than drops: not the stand-in
    ('{"nftables": [{"rule": {"expr": [{"limit": {"rate": 5}}, {"counter": {"packets": 3}}]}}]}',
     NftCounters(None, None, None)),
])
def test_parse_nft_table_edge_cases(text: str, want: NftCounters) -> None:
    assert parse_nft_table(text) == want


def test_parse_nft_table_rejects_what_is_not_nft_json() -> None:
    with pytest.raises(ValueError):
        parse_nft_table("[1, 2]")
    with pytest.raises(ValueError):
        parse_nft_table("Error: No such file or directory")


def test_parse_nf_conntrack_counts_live_non_loopback_entries() -> None:
    # ESTABLISHED tcp, UNREPLIED udp, CLOSE_WAIT tcp; the loopback one is left out
    assert parse_nf_conntrack((FIXTURES / "nf_conntrack.txt").read_text()) == 3
    closed = ("ipv4 2 tcp 6 59 TIME_WAIT src=10.0.0.1 dst=10.0.0.2 sport=1 dport=2 src=10.0.0.2 dst=10.0.0.1 "
              "sport=2 dport=1 [ASSURED] mark=0 zone=0 use=2\n")
    assert parse_nf_conntrack(closed) == 0
    assert parse_nf_conntrack("") == 0


def test_reader_without_the_table_or_the_command_is_not_supported(tmp_path: Path) -> None:
    with pytest.raises(NotSupported):
        NftReader("inet bwlab", nft=str(tmp_path / "no-nft")).counters()
    fake = tmp_path / "nft"
    fake.write_text("#!/bin/sh\necho 'Error: No such file or directory' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(NotSupported, match="inet bwlab"):
        NftReader("inet bwlab", nft=str(fake)).counters()


def test_reader_reads_the_table_and_the_namespace_entries(tmp_path: Path) -> None:
    fake = tmp_path / "nft"
    fake.write_text(f"#!/bin/sh\n[ \"$*\" = '-j list table ip lab' ] && cat {FIXTURES / 'list_table_bwlab.json'}\n")
    fake.chmod(0o755)
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "nf_conntrack").write_text((FIXTURES / "nf_conntrack.txt").read_text())
    r = NftReader("ip lab", procfs=str(tmp_path), nft=str(fake))
    assert r.counters().pps_dropped == 1995
    assert r.conntrack_entries() == 3
    assert NftReader("bwlab").family == "inet"
    assert NftReader("bwlab", procfs=str(tmp_path / "none")).conntrack_entries() == 0
