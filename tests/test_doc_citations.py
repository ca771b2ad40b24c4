"""Every `docs/X.md, "Section"` citation in agent/ names a document and a section that exist.

The shapes in use: `docs/X.md, "Section"`, `docs/X.md "Section"`, `docs/X.md ("Section"`, `docs/X.md#anchor`;
a comment may break the section's name over lines. A section is a Markdown heading or, as the docs also use,
a bold run-in label that opens a paragraph or a list item (`**Tuning.** ...`, `- **The fleet** ...`). A
citation may shorten a heading to the part before its first `:` or ` (` (`"Allowances"` for
"Allowances: PPS and connection tracking").
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]

_CITATION = re.compile(
    r'docs/([\w./-]+\.md)(?:,\s*section\s*|,\s*|\s*\(\s*|\s+)"([^"]+)"'
    r'|docs/([\w./-]+\.md)#([\w-]+)')
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_RUN_IN = re.compile(r"^\s*(?:[-*]\s+)?\*\*(.+?)\*\*")


def _titles(doc: Path) -> Set[str]:
    titles: Set[str] = set()
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for pattern in (_HEADING, _RUN_IN):
            m = pattern.match(line)
            if m:
                title = m.group(1).replace("`", "").strip().rstrip(".:")
                titles.add(title)
                titles.add(re.split(r":| \(", title)[0].strip())
    return titles


def _anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _citations() -> List[Tuple[str, str, str]]:
    found = []
    for path in sorted((ROOT / "agent").rglob("*.py")):
        # Join a comment's or docstring's continuation lines, so a section name broken over lines reads whole.
        flat = re.sub(r"\n\s*(?:#\s*)?", " ", path.read_text(encoding="utf-8"))
        for m in _CITATION.finditer(flat):
            if m.group(1):
                found.append((str(path.relative_to(ROOT)), m.group(1), m.group(2)))
            else:
                found.append((str(path.relative_to(ROOT)), m.group(3), "#" + m.group(4)))
    return found


def test_every_cited_section_exists() -> None:
    citations = _citations()
    # agent/ cites docs this way well over a hundred times; a regex gone blind would find none.
    assert len(citations) >= 100, len(citations)
    cache: Dict[str, Set[str]] = {}
    broken = []
    for source, doc, section in citations:
        path = ROOT / "docs" / doc
        if not path.is_file():
            broken.append(f"{source}: docs/{doc} does not exist")
            continue
        titles = cache.setdefault(doc, _titles(path))
        if section.startswith("#"):
            ok = section[1:] in {_anchor(t) for t in titles}
        else:
            ok = section.replace("`", "").strip().rstrip(".:") in titles
        if not ok:
            broken.append(f'{source}: docs/{doc} has no section "{section}"')
    assert not broken, "\n".join(broken)


def test_a_missing_section_is_caught(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# Title\n\n## Real heading: detail\n\n**Run-in.** text\n- **Item** text\n"
                   "```\n## not a heading\n```\n")
    titles = _titles(doc)
    assert {"Real heading", "Real heading: detail", "Run-in", "Item"} <= titles
    assert "not a heading" not in titles
