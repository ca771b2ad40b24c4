"""Rewrite one generated region of a doc between two marker lines; `--check` only compares (the tests run
the generators that way, so a doc that disagrees with the code fails the build)."""

from __future__ import annotations

import sys
from pathlib import Path


def rewrite(doc: Path, begin: str, end: str, body: str, script: str, argv: list[str]) -> int:
    """Put `body` between the `begin` and `end` lines of `doc`; with --check in `argv`, exit 1 when the doc
    differs instead. `script` is named in the message."""
    text = doc.read_text()
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        print(f"{doc.name} lacks the {begin} ... {end} markers", file=sys.stderr)
        return 1
    new = f"{head}{begin}\n{body}\n{end}{tail}"
    if "--check" in argv:
        if new != text:
            print(f"{doc.name} is out of date: run {script}", file=sys.stderr)
            return 1
        return 0
    doc.write_text(new)
    return 0
