"""Every relative link in README.md and docs/ points to a file that is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_no_link_to_a_missing_file() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 5
    missing = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in pages
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:"))
        and not (page.parent / target).exists()
    ]
    assert missing == []
