#!/usr/bin/env python3
"""Generate agent/data/catalogue.json from DescribeInstanceTypes output (moto's bundled data or live pages).

Regenerate from moto's bundled data (what the repo ships; the Makefile's CATALOGUE_MOTO names the release):
    make catalogue          # unpacks that release into .tools/moto-VERSION, then runs this script with --moto
From the live API (any recent AWS CLI, which knows BaselineBandwidthInGbps and the queue counts):
    aws ec2 describe-instance-types --region us-east-1 --output json > /tmp/types.json
    .venv/bin/python scripts/gen_catalogue.py --describe /tmp/types.json
Check that the shipped file is what the source gives (exit 1 if not): add --check. Without --moto/--describe,
the source is the moto release the shipped file's header names, under .tools/moto-VERSION (`make test-deps`).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.models.catalogue import (  # noqa: E402
    DEFAULT_PATH,
    TypeEntry,
    catalogue_source,
    encode_catalogue,
    entry_from_describe,
)


def find_moto_data(out: Path) -> Path:
    """The data of the moto release that `out`'s header names ("moto 5.2.5 ..."), unpacked by the Makefile
    into .tools/moto-VERSION: --check compares with the very source the file was made from."""
    words = catalogue_source(str(out)).split() if out.exists() else []
    version = words[1] if len(words) > 1 and words[0] == "moto" else "*"
    hits = sorted(glob.glob(str(ROOT / ".tools" / f"moto-{version}" / "moto/ec2/resources/instance_types.json*")))
    if not hits:
        raise SystemExit(f"moto {version}'s instance_types.json not found under .tools/: run `make test-deps` "
                         "(or `make catalogue`), or pass --moto PATH / --describe FILE")
    return Path(hits[-1])


def moto_version(path: Path) -> str:
    site = path.parents[3]  # site-packages (or pip's --target)/moto/ec2/resources/<file>
    dists = sorted(site.glob("moto-*.dist-info"))
    return dists[0].name[len("moto-"):-len(".dist-info")] if dists else "unknown"


def read_json(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        return json.load(f)


def infos_from(doc: Any) -> list[dict[str, Any]]:
    """InstanceTypeInfo dicts from a DescribeInstanceTypes page ({"InstanceTypes": [...]}), a list of
    them, or moto's {type: info} mapping."""
    if isinstance(doc, dict) and "InstanceTypes" in doc:
        return list(doc["InstanceTypes"])
    if isinstance(doc, list):
        return list(doc)
    if isinstance(doc, dict):
        return list(doc.values())
    raise SystemExit("unrecognised input: expected DescribeInstanceTypes JSON")


def build(infos: list[dict[str, Any]]) -> dict[str, TypeEntry]:
    entries: dict[str, TypeEntry] = {}
    for info in infos:
        e = entry_from_describe(info)
        entries[e.instance_type] = e
    return entries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--moto", type=Path,
                     help="moto's instance_types.json(.gz) (default: the one in .venv-moto)")
    src.add_argument("--describe", type=Path, nargs="+", help="DescribeInstanceTypes JSON page(s)")
    p.add_argument("--out", type=Path, default=DEFAULT_PATH, help=f"output (default {DEFAULT_PATH})")
    p.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = p.parse_args(argv)

    if args.describe:
        infos = [i for f in args.describe for i in infos_from(read_json(f))]
        source = f"DescribeInstanceTypes JSON ({len(args.describe)} page file(s))"
    else:
        path = args.moto or find_moto_data(args.out)
        infos = infos_from(read_json(path))
        source = f"moto {moto_version(path)} moto/ec2/resources/{path.name}"
    entries = build(infos)
    text = encode_catalogue(entries, source)
    missing = sorted(n for n, e in entries.items() if e.baseline_gbps is None or e.peak_gbps is None)
    if missing:
        print(f"warning: {len(missing)} type(s) without baseline/peak: {', '.join(missing[:10])}",
              file=sys.stderr)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: regenerate with scripts/gen_catalogue.py", file=sys.stderr)
            return 1
        print(f"{args.out}: up to date ({len(entries)} types)")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {len(entries)} types, {len(text.encode())} bytes, from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
