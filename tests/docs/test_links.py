"""Docs stay navigable: every page is on the map in docs/index.md, every relative link
resolves to a file, and every ``#anchor`` to a heading of the page it points at."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ *```.*?^ *```[ \t]*$", re.S | re.M)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _pages() -> list[Path]:
    return sorted(
        [
            ROOT / "README.md",
            *DOCS.rglob("*.md"),
            *ROOT.glob("examples/*/README.md"),
            *ROOT.glob("plugins/*/README*.md"),
        ]
    )


def _prose(page: Path) -> str:
    """The page without its fenced code blocks (a link in a code block is not a link)."""
    return FENCE.sub("", page.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of ``page``'s headings (repeated headings get -1, -2… as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(_prose(page)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def test_slug_matches_github() -> None:
    assert slug("8.8 KV transfer for prefill/decode: connectors and amendments") == (
        "88-kv-transfer-for-prefilldecode-connectors-and-amendments"
    )
    assert slug("Proxy overhead: `bench/proxy_overhead.py`") == "proxy-overhead-benchproxy_overheadpy"
    assert slug("Every core: `serve --processes N`") == "every-core-serve---processes-n"


def test_every_docs_page_is_linked_from_the_index() -> None:
    index = DOCS / "index.md"
    linked = {
        (DOCS / m.split("#")[0]).resolve() for m in LINK.findall(_prose(index)) if not m.startswith("#")
    }
    missing = [
        str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if p != index and p.resolve() not in linked
    ]
    assert not missing, f"add links to {missing} in docs/index.md"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)} has broken links: {broken}"
