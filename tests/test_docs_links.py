"""Every relative link in README.md and docs/*.md leads somewhere in the repository:
the file exists, and an anchor (`page.md#section`, `#section`) names a heading of
that page, as GitHub makes anchors from headings. The README once pointed outside
the repository (issue 35 item 14)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _tokens(path: Path) -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(path.read_text())


def links(path: Path) -> list[str]:
    """Every link and image target of a page (code spans and blocks are not links)."""
    out = []
    for block in _tokens(path):
        for t in block.children or []:
            if t.type == "link_open":
                out.append(str(t.attrGet("href")))
            elif t.type == "image":
                out.append(str(t.attrGet("src")))
    return out


def slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    tokens, seen, out = _tokens(path), Counter[str](), set()
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            inline = tokens[i + 1]
            text = "".join(
                c.content for c in inline.children or [] if c.type in ("text", "code_inline")
            )
            base = slug(text)
            out.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return out


def problems(page: Path, root: Path = ROOT) -> list[str]:
    found = []
    for target in links(page):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:  # http(s), mailto: not ours to check
            continue
        dest = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        if not dest.is_relative_to(root):
            found.append(f"{target}: outside the repository")
        elif not dest.exists():
            found.append(f"{target}: no such file")
        elif parts.fragment and (dest.suffix != ".md" or parts.fragment not in anchors(dest)):
            found.append(f"{target}: no heading #{parts.fragment} in {dest.relative_to(root)}")
    return found


def test_the_readme_is_short_and_its_quick_start_two_commands() -> None:
    text = PAGES[0].read_text()
    assert len(text.splitlines()) <= 80
    quick = text.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)```", quick, re.S)
    assert len(commands) == 2 and all(c.count("\n") == 1 for c in commands), commands
    assert "llmgw demo" in commands[0] and "pytest" in commands[1]
    assert all(c.startswith("python3 -m venv .venv && ") for c in commands)  # installs


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert problems(page) == []


def test_the_check_finds_what_is_wrong(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("# llmgw\n\n## Quick start\n")
    page = root / "docs" / "page.md"
    page.write_text(
        "# A page\n\n## Where `it` goes, now!\n\n"
        "[ok](#where-it-goes-now) [up](../README.md#quick-start) [x](missing.md) "
        "[y](#nowhere) [z](../README.md#nowhere) [out](../../DESIGN.md) "
        "[web](https://example.com/x.md) `[code](nothing.md)`\n"
    )
    assert problems(page, root) == [
        "missing.md: no such file",
        "#nowhere: no heading #nowhere in docs/page.md",
        "../README.md#nowhere: no heading #nowhere in README.md",
        "../../DESIGN.md: outside the repository",
    ]
