"""Every relative link in README.md and docs/ points to a file that is in the repository, and
every anchor (``page.md#section`` or ``#section``) to a heading that page has, spelled as
GitHub renders heading ids. Links inside fenced code blocks and inline code are not links."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's heading id: the rendered text (markup dropped, link text kept), lower-cased,
    every character that is not a letter, digit, ``-``, ``_`` or space removed, and spaces
    turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links (and images): text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    out = []
    for ch in text.lower():
        if ch in "-_ " or unicodedata.category(ch)[0] in "LN":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(page: Path) -> set[str]:
    """Every heading id of a page (a repeated heading gets ``-1``, ``-2``... as on GitHub)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if m is None:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = "\n".join(prose_lines(page.read_text(encoding="utf-8")))
    return LINK.findall(INLINE_CODE.sub("", text))


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page):
        if not target or target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = page if not path else (page.parent / path)
        if not dest.exists():
            out.append(f"{page.relative_to(ROOT)} -> {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{page.relative_to(ROOT)} -> {target}: no heading #{anchor}")
    return out


def test_pages_are_found() -> None:
    assert len(PAGES) > 5
    assert sum(len(links(p)) for p in PAGES) > 30


def test_slugs_follow_github() -> None:
    assert slug("A store outage (Postgres, Valkey or the broker down)") == (
        "a-store-outage-postgres-valkey-or-the-broker-down"
    )
    assert slug("Consumer lag: `memstream lag [--watch] [--json]`") == (
        "consumer-lag-memstream-lag---watch---json"
    )
    assert slug("HTTP routes: how a route declares its contract (`/openapi.json`, `/docs`)") == (
        "http-routes-how-a-route-declares-its-contract-openapijson-docs"
    )
    assert slug("Sealed records (crypto-shredding)") == "sealed-records-crypto-shredding"


def test_no_link_to_a_missing_file_or_heading() -> None:
    assert [b for page in PAGES for b in broken(page)] == []
