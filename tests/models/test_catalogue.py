"""The bundled catalogue against DescribeInstanceTypes from moto in server mode, and its codec."""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from agent.models.catalogue import (
    DEFAULT_PATH,
    NetworkCard,
    TypeEntry,
    catalogue_entry,
    catalogue_source,
    decode_catalogue,
    encode_catalogue,
    entry_from_describe,
    load_catalogue,
)
from agent.readers import ec2api
from tests.conftest import ROOT

# Burstable (t3), "up to" sizes (m5.large, c5.4xlarge), a flat 100 Gbit/s type (c6gn.16xlarge, ENA
# Express), and multi-card types (p4d.24xlarge: 4 cards, c6in.32xlarge: 2).
SAMPLE = ["t3.micro", "t3.2xlarge", "m5.large", "c5.4xlarge", "r4.large", "c6gn.16xlarge", "p4d.24xlarge",
          "c6in.32xlarge"]


def _describe(moto: str, types: list[str] | None = None) -> dict[str, TypeEntry]:
    """DescribeInstanceTypes from moto over HTTP (all types when None: moto answers in one page), parsed
    from the raw XML the way readers/ec2api.py does."""
    client = ec2api.client_factory(moto)("us-east-1")
    captured: list[bytes] = []
    client.meta.events.register("after-call.ec2.DescribeInstanceTypes",
                                lambda http_response, **_: captured.append(http_response.content))
    resp = client.describe_instance_types(**({"InstanceTypes": types} if types else {}))
    assert "NextToken" not in resp
    infos = ec2api.parse_describe_instance_types(captured[-1].decode())
    return {i["InstanceType"]: entry_from_describe(i) for i in infos}


def _read_moto_json(pattern: str) -> list[dict[str, Any]]:
    hits = sorted(glob.glob(str(ROOT / pattern)))
    assert hits, f"{pattern} missing: run `make test-deps`"
    with gzip.open(hits[-1], "rt") if hits[-1].endswith(".gz") else open(hits[-1]) as f:
        return list(json.load(f).values())


def _source_infos() -> list[dict[str, Any]]:
    """The data the shipped catalogue was made from: the moto release its header names, which the Makefile
    unpacks into .tools/moto-VERSION (CATALOGUE_MOTO)."""
    words = catalogue_source().split()
    assert words[0] == "moto", words
    return _read_moto_json(f".tools/moto-{words[1]}/moto/ec2/resources/instance_types.json*")


def _stable(e: TypeEntry) -> TypeEntry:
    """An entry without the fields AWS added to older types after moto 5.0.22's data: the queue counts, and
    ENA Express on c6in, m6in, r6in and friends."""
    return dataclasses.replace(e, ena_srd_supported=None,
                               cards=tuple(dataclasses.replace(c, default_ena_queues=None) for c in e.cards))


def test_sample_matches_describe_instance_types(moto: str) -> None:
    """The catalogue's sample against the test moto's DescribeInstanceTypes. That server (moto 5.0.22, the
    Makefile's MOTO) is older than the catalogue's source; the bandwidth figures and cards agree."""
    api = _describe(moto, SAMPLE)
    cat = load_catalogue()
    assert sorted(api) == sorted(SAMPLE)
    for name in SAMPLE:
        assert _stable(cat[name]) == _stable(api[name]), name


def test_describe_instance_types_parses_to_the_source_data(moto: str) -> None:
    """Every type the server answers, parsed from its XML as readers/ec2api.py does, is the entry made from
    the same release's JSON data: the runtime API path and the generator's path read alike."""
    api = _describe(moto)
    data = {i["InstanceType"]: entry_from_describe(i)
            for i in _read_moto_json(".venv-moto/lib/python*/site-packages/moto/ec2/resources/instance_types.json*")}
    assert len(api) > 800 and api == data


# Families AWS launched before the catalogue's source (moto 5.2.5, built 2026-10-27) that the previous
# catalogue (moto 5.0.22) lacked (issue 30): a source older than these fails below.
LAUNCHED = {"m8i", "c8i", "r8i", "m8a", "c8a", "c8gn", "m8gn", "m9g", "i7i"}
FAMILY = re.compile(r"^([a-z]+)(\d+)([a-z0-9-]*)$")


def current_families(types: list[str]) -> set[str]:
    """Every family of each series' two newest generations in `types` (series m: m9g, m9gd, m8i, m8a, ...).
    Names outside the series-generation-options pattern (mac-m4, u-6tb1) are left out."""
    gens: dict[str, dict[int, set[str]]] = {}
    for t in types:
        m = FAMILY.match(t.split(".")[0])
        if m:
            gens.setdefault(m.group(1), {}).setdefault(int(m.group(2)), set()).add(m.group(0))
    return {f for by_gen in gens.values() for g in sorted(by_gen)[-2:] for f in by_gen[g]}


def test_current_generation_families_are_present() -> None:
    """The list comes from the source data itself, not from a table kept by hand: a generator that drops a
    family, or a catalogue made from an older source, fails here."""
    source = [i["InstanceType"] for i in _source_infos()]
    required = current_families(source)
    assert LAUNCHED <= required, sorted(LAUNCHED - required)
    cat = load_catalogue()
    have = {t.split(".")[0] for t in cat}
    assert sorted(required - have) == []
    # every size of those families, each with AWS's baseline and peak
    sizes = [t for t in source if t.split(".")[0] in required]
    assert all(t in cat and cat[t].baseline_gbps and cat[t].peak_gbps for t in sizes), sizes
    assert len(sizes) > 700


def test_whole_catalogue_is_its_source() -> None:
    cat = load_catalogue()
    source = _source_infos()
    assert len(cat) == len(source) > 1300
    assert all(cat[i["InstanceType"]] == entry_from_describe(i) for i in source)


def test_fields_botocore_parses_itself_agree(moto: str) -> None:
    """Independent of our XML parser: the members every botocore models (vCPUs, ENA, cards)."""
    c = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto)
    cat = load_catalogue()
    infos = c.describe_instance_types(InstanceTypes=SAMPLE)["InstanceTypes"]
    assert sorted(i["InstanceType"] for i in infos) == sorted(SAMPLE)          # every sample type compared
    for info in infos:
        e = cat[info["InstanceType"]]
        net = info["NetworkInfo"]
        assert e.vcpus == info["VCpuInfo"]["DefaultVCpus"]
        assert e.network_performance == net["NetworkPerformance"]
        assert e.ena_support == net["EnaSupport"]
        assert e.maximum_network_cards == net["MaximumNetworkCards"] == len(e.cards)
        assert [c.index for c in e.cards] == [card["NetworkCardIndex"] for card in net["NetworkCards"]]


@pytest.mark.parametrize(("name", "baseline", "peak"), [
    # AWS's published DescribeInstanceTypes figures (docs/ec2-network-facts.md, "Published bandwidth figures")
    ("m5.large", 0.75, 10.0),
    ("c5.4xlarge", 5.0, 10.0),
    ("t3.micro", 0.064, 5.0),
    ("c6gn.16xlarge", 100.0, 100.0),
    ("r4.large", 0.75, 10.0),      # seed 000 measured ~0.75 Gbit/s after the burst
    # current generations (AWS's m8i, c8gn and m9g pages list the same "up to" peaks)
    ("m8i.large", 0.937, 12.5),
    ("c8gn.large", 6.25, 30.0),
    ("m9g.large", 1.0, 15.0),
])
def test_published_figures(name: str, baseline: float, peak: float) -> None:
    e = load_catalogue()[name]
    assert (e.baseline_gbps, e.peak_gbps) == (baseline, peak)


def test_multi_card_types_keep_every_card() -> None:
    cat = load_catalogue()
    p4d = cat["p4d.24xlarge"]
    assert p4d.maximum_network_cards == 4 and [c.index for c in p4d.cards] == [0, 1, 2, 3]
    assert all((c.baseline_gbps, c.peak_gbps) == (100.0, 100.0) for c in p4d.cards)
    assert len(cat["c6in.32xlarge"].cards) == 2
    assert cat["c6gn.16xlarge"].ena_srd_supported is True      # moto writes "True"; parsed case-blind


def test_queue_counts_come_from_the_source() -> None:
    """moto 5.2.5's data carries DefaultEnaQueueCountPerInterface (5.0.22's did not): every type has one."""
    cat = load_catalogue()
    assert all(e.default_ena_queues for e in cat.values())
    assert (cat["m8i.large"].default_ena_queues, cat["m5.large"].default_ena_queues) == (2, 8)


def test_codec_round_trip_and_errors(tmp_path: Path) -> None:
    e = TypeEntry("x9.large", 2, "Up to 12.5 Gigabit", "required", True, 2, 0,
                  (NetworkCard(0, 0.781, 12.5, 2), NetworkCard(1, 0.781, 12.5, None)))
    source, got = decode_catalogue(encode_catalogue({"x9.large": e}, "test"))
    assert (source, got) == ("test", {"x9.large": e})
    with pytest.raises(ValueError):
        decode_catalogue('{"format": "something-else"}')
    with pytest.raises(ValueError):
        encode_catalogue({"x": TypeEntry("x", 1, None, None, None, 1, 0, (NetworkCard(1, 1.0, 1.0),))}, "t")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError):
        load_catalogue(str(bad))


def test_one_type_read_from_its_line_is_the_table_entry(tmp_path: Path) -> None:
    """What the daemon reads (one row) is what the whole table says, for every type; a type the file
    lacks is None; a file that is not the one-type-per-line catalogue raises ValueError like the table."""
    table = load_catalogue()
    assert len(table) >= 800, len(table)                  # the bundled catalogue (moto's), every type of it
    assert all(catalogue_entry(name) == entry for name, entry in table.items())
    assert catalogue_entry("x9.nonexistent") is None
    assert catalogue_entry("r4") is None                      # a prefix of real names is not a match
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads(DEFAULT_PATH.read_text()), indent=2))
    with pytest.raises(ValueError):
        catalogue_entry("r4.large", str(pretty))
    other = tmp_path / "other.json"
    other.write_text(DEFAULT_PATH.read_text().replace('"format":"burstwatch-catalogue/1"', '"format":"x/9"', 1))
    with pytest.raises(ValueError):
        catalogue_entry("r4.large", str(other))


def test_reading_one_type_keeps_the_table_out_of_the_process() -> None:
    """Parsing all rows would leave ~0.8 MiB in the daemon (docs/architecture.md)."""
    code = ("import sys; from agent.models.catalogue import catalogue_entry, catalogue_source; "
            "e = catalogue_entry('r4.large'); catalogue_source(); "
            "from agent.models import catalogue as c; print(e.cards[0].peak_gbps, c._load.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["10.0", "0"], out.stdout + out.stderr


def test_loaded_once_and_small() -> None:
    assert load_catalogue() is load_catalogue()
    assert catalogue_source().startswith("moto ")
    size = DEFAULT_PATH.stat().st_size
    # 1,395 types at ~77 bytes a line (moto 5.2.5: 108 KB); the daemon reads one line, so size is disk only
    assert size < 150_000, f"catalogue.json grew to {size} bytes; it ships in every package"


def test_generator_reproduces_the_shipped_file() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_catalogue.py"), "--check"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr


def test_generator_reads_describe_pages(tmp_path: Path) -> None:
    page = tmp_path / "page.json"
    page.write_text(json.dumps({"InstanceTypes": [{
        "InstanceType": "m5.large", "VCpuInfo": {"DefaultVCpus": 2},
        "NetworkInfo": {"NetworkPerformance": "Up to 10 Gigabit", "EnaSupport": "required",
                        "EnaSrdSupported": False, "MaximumNetworkCards": 1,
                        "NetworkCards": [{"NetworkCardIndex": 0, "BaselineBandwidthInGbps": 0.75,
                                          "PeakBandwidthInGbps": 10.0,
                                          "DefaultEnaQueueCountPerInterface": 2}]},
    }]}))
    out = tmp_path / "cat.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_catalogue.py"), "--describe", str(page),
                    "--out", str(out)], check=True, capture_output=True, timeout=60)
    e = load_catalogue(str(out))["m5.large"]
    assert (e.baseline_gbps, e.peak_gbps, e.default_ena_queues) == (0.75, 10.0, 2)


def test_no_burstable_type_has_several_network_cards() -> None:
    """The credit model keeps one bucket per direction against network card 0. That is exact while every
    size with a burst bucket has a single card; a regenerated catalogue that breaks this must fail here."""
    from agent.models.catalogue import load_catalogue

    burstable_multi = [t for t, e in load_catalogue().items() if len(e.cards) > 1 and any(
        c.baseline_gbps is not None and c.peak_gbps is not None and c.peak_gbps > c.baseline_gbps for c in e.cards)]
    assert burstable_multi == []
