"""Per-instance-type network facts (DescribeInstanceTypes' NetworkInfo) and the bundled catalogue's codec."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

CATALOGUE_FORMAT = "burstwatch-catalogue/1"
DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "catalogue.json"
# Column order of a catalogue row and of a card inside it; docs/instance.md describes them.
ROW_FIELDS = ("vcpus", "network_performance", "ena_support", "ena_srd_supported", "maximum_network_cards",
              "default_network_card_index", "cards")
CARD_FIELDS = ("baseline_gbps", "peak_gbps", "default_ena_queues")
# What an operator does about a type the catalogue lacks (docs/instance.md); the log and `status` say it.
UNKNOWN_TYPE_REMEDY = ("grant the instance role ec2:DescribeInstanceTypes, or set [instance.bandwidth] "
                       "baseline_gbps and peak_gbps")


@dataclass(frozen=True)
class NetworkCard:
    """One network card's entitlement (DescribeInstanceTypes NetworkInfo.NetworkCards[])."""

    index: int
    baseline_gbps: Optional[float]
    peak_gbps: Optional[float]
    default_ena_queues: Optional[int] = None   # DefaultEnaQueueCountPerInterface; unknown when None


@dataclass(frozen=True)
class TypeEntry:
    """What burstwatch needs to know about an instance type's networking."""

    instance_type: str
    vcpus: Optional[int]
    network_performance: Optional[str]         # "Up to 10 Gigabit"
    ena_support: Optional[str]                 # unsupported | supported | required
    ena_srd_supported: Optional[bool]          # ENA Express
    maximum_network_cards: int
    default_network_card_index: int = 0
    cards: tuple[NetworkCard, ...] = ()

    def card(self, index: Optional[int] = None) -> Optional[NetworkCard]:
        """The card with that index (default: the primary card, DefaultNetworkCardIndex)."""
        want = self.default_network_card_index if index is None else index
        for c in self.cards:
            if c.index == want:
                return c
        return None

    @property
    def baseline_gbps(self) -> Optional[float]:
        c = self.card()
        return c.baseline_gbps if c else None

    @property
    def peak_gbps(self) -> Optional[float]:
        c = self.card()
        return c.peak_gbps if c else None

    @property
    def default_ena_queues(self) -> Optional[int]:
        """Default ENA queue count per interface on the primary card; None when the source lacks it."""
        c = self.card()
        return c.default_ena_queues if c else None


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _intval(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def entry_from_describe(info: Mapping[str, Any]) -> TypeEntry:
    """A TypeEntry from one DescribeInstanceTypes InstanceTypeInfo, in the API's own (PascalCase) shape.

    Fields a source lacks stay None (moto's data has no DefaultEnaQueueCountPerInterface; Debian 12's
    botocore 1.29 model drops the bandwidth fields, see readers/ec2api.py)."""
    net = info.get("NetworkInfo") or {}
    cards = []
    for c in net.get("NetworkCards") or []:
        cards.append(NetworkCard(index=_intval(c.get("NetworkCardIndex")) or 0,
                                 baseline_gbps=_num(c.get("BaselineBandwidthInGbps")),
                                 peak_gbps=_num(c.get("PeakBandwidthInGbps")),
                                 default_ena_queues=_intval(c.get("DefaultEnaQueueCountPerInterface"))))
    cards.sort(key=lambda c: c.index)
    srd = net.get("EnaSrdSupported")
    return TypeEntry(
        instance_type=str(info["InstanceType"]),
        vcpus=_intval((info.get("VCpuInfo") or {}).get("DefaultVCpus")),
        network_performance=net.get("NetworkPerformance"),
        ena_support=net.get("EnaSupport"),
        ena_srd_supported=srd if isinstance(srd, bool) else None,
        maximum_network_cards=_intval(net.get("MaximumNetworkCards")) or max(1, len(cards)),
        default_network_card_index=_intval(net.get("DefaultNetworkCardIndex")) or 0,
        cards=tuple(cards),
    )


def entry_to_row(e: TypeEntry) -> list[Any]:
    """The compact catalogue row (ROW_FIELDS order; card index implied by position)."""
    indexes = [c.index for c in e.cards]
    if indexes != list(range(len(e.cards))):
        raise ValueError(f"{e.instance_type}: network card indexes {indexes} are not 0..n-1")
    cards = [[c.baseline_gbps, c.peak_gbps, c.default_ena_queues] for c in e.cards]
    return [e.vcpus, e.network_performance, e.ena_support, e.ena_srd_supported, e.maximum_network_cards,
            e.default_network_card_index, cards]


def entry_from_row(instance_type: str, row: list[Any]) -> TypeEntry:
    if not isinstance(row, list) or len(row) != len(ROW_FIELDS):
        raise ValueError(f"catalogue row for {instance_type!r} is not a list of {len(ROW_FIELDS)} fields")
    vcpus, perf, ena, srd, maxcards, defcard, cards = row
    parsed = tuple(NetworkCard(i, _num(c[0]), _num(c[1]), _intval(c[2])) for i, c in enumerate(cards))
    return TypeEntry(instance_type, _intval(vcpus), perf, ena, srd if isinstance(srd, bool) else None,
                     _intval(maxcards) or max(1, len(cards)), _intval(defcard) or 0, parsed)


def encode_catalogue(entries: Mapping[str, TypeEntry], source: str) -> str:
    """The catalogue file: a small header, then one type per line (compact, and readable in a diff)."""
    lines = [f'{{"format":{json.dumps(CATALOGUE_FORMAT)},"source":{json.dumps(source)},'
             f'"fields":{json.dumps(list(ROW_FIELDS), separators=(",", ":"))},'
             f'"card_fields":{json.dumps(list(CARD_FIELDS), separators=(",", ":"))},"types":{{']
    names = sorted(entries)
    for i, name in enumerate(names):
        row = json.dumps(entry_to_row(entries[name]), separators=(",", ":"))
        lines.append(f"{json.dumps(name)}:{row}{',' if i < len(names) - 1 else ''}")
    lines.append("}}")
    return "\n".join(lines) + "\n"


def decode_catalogue(text: str) -> tuple[str, dict[str, TypeEntry]]:
    """(source, entries) from the catalogue file's text."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != CATALOGUE_FORMAT:
        raise ValueError(f"not a {CATALOGUE_FORMAT} file")
    if tuple(doc.get("fields") or ()) != ROW_FIELDS or tuple(doc.get("card_fields") or ()) != CARD_FIELDS:
        raise ValueError("catalogue columns differ from this version's")
    return str(doc.get("source", "")), {name: entry_from_row(name, row) for name, row in doc["types"].items()}


@functools.lru_cache(maxsize=4)
def _load(path: str) -> tuple[str, dict[str, TypeEntry]]:
    return decode_catalogue(Path(path).read_text(encoding="utf-8"))


def load_catalogue(path: Optional[str] = None) -> dict[str, TypeEntry]:
    """instance type -> TypeEntry from the bundled catalogue (or `path`); parsed once, then cached.

    For the tools and tests that need every type; a process that needs one type asks `catalogue_entry`.
    Raises OSError or ValueError on a missing or corrupt file; callers log it and go on without."""
    return _load(str(path or DEFAULT_PATH))[1]


_TYPES_OPEN = ',"types":{'


def _header(line: str) -> dict[str, Any]:
    """The catalogue's first line (encode_catalogue's header, up to `"types":{`) as a dict, checked."""
    if not line.rstrip().endswith(_TYPES_OPEN):
        raise ValueError(f"not a {CATALOGUE_FORMAT} file (no one-type-per-line layout)")
    doc = json.loads(line.rstrip()[:-len(_TYPES_OPEN)] + "}")
    if not isinstance(doc, dict) or doc.get("format") != CATALOGUE_FORMAT:
        raise ValueError(f"not a {CATALOGUE_FORMAT} file")
    if tuple(doc.get("fields") or ()) != ROW_FIELDS or tuple(doc.get("card_fields") or ()) != CARD_FIELDS:
        raise ValueError("catalogue columns differ from this version's")
    return doc


@functools.lru_cache(maxsize=16)
def _row(path: str, instance_type: str) -> tuple[str, Optional[TypeEntry]]:
    key = json.dumps(instance_type) + ":"
    with open(path, encoding="utf-8") as f:
        source = str(_header(f.readline()).get("source", ""))
        for line in f:
            if line.startswith(key):
                return source, entry_from_row(instance_type, json.loads(line[len(key):].rstrip().rstrip(",")))
    return source, None


def catalogue_entry(instance_type: str, path: Optional[str] = None) -> Optional[TypeEntry]:
    """One type's entry (None when the catalogue has none), read from its line of the file.

    The daemon asks for its own type (and its peers'): parsing all 1,395 rows costs ~0.8 MiB of RSS that
    the allocator keeps after the table is dropped, while one row costs nothing that stays
    (docs/architecture.md, "What stays out of the resident process"). Raises like load_catalogue."""
    return _row(str(path or DEFAULT_PATH), instance_type)[1]


def catalogue_source(path: Optional[str] = None) -> str:
    """Which data the catalogue was generated from (its header's "source")."""
    with open(str(path or DEFAULT_PATH), encoding="utf-8") as f:
        return str(_header(f.readline()).get("source", ""))
