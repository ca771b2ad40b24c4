"""Rewrite one generated region of a doc between two marker lines; `--check` only compares (the tests run
the generators that way, so a doc that disagrees with the code fails the build)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


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


def write_files(files: dict[Path, str], check: bool, script: str, shown: Callable[[Path], str] = str) -> int:
    """Write each generated file whose text differs; with `check`, write nothing and exit 1 naming the
    stale ones instead. `script` is named in the message, `shown` prints a path."""
    stale = []
    for path, text in files.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if check:
            stale.append(shown(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {shown(path)}")
    if stale:
        print(f"stale (run {script}): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0
