"""Reasons are data (DESIGN.md; issue 31 item 3): code acts on a reason's kind, an
enum kept beside the human message, never on the message's words.

Read with `ast`, nothing imported: no text method that recognises words
(`startswith`, `endswith`, `split`, `removeprefix`, ...) is called on a value
named as a reason is (`why`, `reason`, `scaling`, ...), and the text prefixes the
gateway feed once used to mark a reason's kind are read in one place only: the
reader of an older controller's feed, which goes with that field.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_structure import ROOT, _rel, _sources, _tree

# Names that hold a reason or a state's words in this code base.
REASON_NAMES = {"why", "reason", "reasons", "scaling", "unserved", "cause", "outcome", "leaving"}
# Calls that read words.
TEXT_READERS = {
    "startswith",
    "endswith",
    "split",
    "rsplit",
    "partition",
    "rpartition",
    "removeprefix",
    "removesuffix",
    "find",
    "index",
}
LEGACY_READER = "llmgw/wire/gateway.py"  # Unserved.from_legacy_text (goes with `unserved` in 0.3)


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def reason_text_reads(path: Path) -> list[str]:
    """`file:line: code` for each reason read by its words in `path`."""
    where = _rel(path) if path.is_relative_to(ROOT) else path.name
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call):
            read = (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in TEXT_READERS
                and _name(node.func.value) in REASON_NAMES
            )
        elif isinstance(node, ast.Compare):  # "asleep" in why
            read = (
                isinstance(node.left, ast.Constant)
                and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
                and any(_name(c) in REASON_NAMES for c in node.comparators)
            )
        else:
            continue
        if read:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_reason_is_recognised_by_its_words() -> None:
    found = [line for p in _sources() for line in reason_text_reads(p)]
    assert found == [], "a reason read by its words:\n" + "\n".join(found)


def test_the_finder_finds_each_kind(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "def f(why, m, self):\n"
        "    why.startswith('no answer')\n"  # 2
        "    m.scaling.split(':')\n"  # 3
        "    'asleep' in self.reason\n"  # 4
        "    why.message.upper()\n"
        "    url.startswith('http')\n"
        "    why.kind is Kind.ASLEEP\n"
    )
    assert [line.split(":")[1] for line in reason_text_reads(source)] == ["2", "3", "4"]


def test_the_old_unserved_prefixes_are_read_in_one_place() -> None:
    """`_LEGACY_PREFIXES` (the text form's kind marks) is named only in wire/gateway.py, by
    the two functions that write and read the older field."""
    users = sorted(
        _rel(p)
        for p in _sources()
        for node in ast.walk(_tree(p))
        if isinstance(node, ast.Name) and node.id == "_LEGACY_PREFIXES"
    )
    assert set(users) == {LEGACY_READER}, users
    old_names = [
        f"{_rel(p)}:{node.lineno}"
        for p in _sources()
        for node in ast.walk(_tree(p))
        if isinstance(node, ast.Name | ast.alias)
        and getattr(node, "id", getattr(node, "name", ""))
        in ("ASLEEP_PREFIX", "UNPLACEABLE_PREFIX")
    ]
    assert old_names == [], old_names
