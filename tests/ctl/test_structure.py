"""How the client side is put together: every path in the catalogue, and argparse
left as it is (no import cycle anywhere: tests/test_structure.py)."""

from __future__ import annotations

import argparse
import gettext
import re
from pathlib import Path

import pytest

from llmgw.ctl.parser import command_of, parser

ROOT = Path(__file__).resolve().parents[2]


def test_every_path_is_in_the_catalogue() -> None:
    """Outside llmgw/api.py, no client spells a path of the controller's API
    (servers' own routes aside: the controller's, a fake engine's)."""
    path = re.compile(r"[\"']/v1/")
    owners = {ROOT / "llmgw" / "api.py"}
    offenders = [
        str(p.relative_to(ROOT))
        for d in ("llmgw", "console", "agent")
        for p in (ROOT / d).rglob("*.py")
        if p not in owners
        and "controller" not in p.parts
        and "gateway" not in p.parts  # (its two calls move to the catalogue with its owner)
        and any(path.search(line) and "router.add" not in line for line in p.open())
    ]
    assert offenders == []


def test_the_parser_is_built_for_the_command_asked_and_argparse_is_left_alone() -> None:
    assert command_of(["--controller", "nodes", "status", "-w"]) == "status"
    assert command_of(["-o", "json", "nodes"]) == "nodes"
    assert command_of(["--context=prod", "drain", "x"]) == "drain"
    assert command_of(["frobnicate"]) is None and command_of(["--help"]) is None
    one = parser(["nodes", "--state", "ready"])
    (sub,) = [a for a in one._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == ["nodes"]
    assert one.parse_args(["nodes", "--state", "ready"]).state == "ready"
    assert argparse._ is gettext.gettext  # type: ignore[attr-defined]


@pytest.mark.parametrize("argv", [["--help"], ["frobnicate"]])
def test_help_and_unknown_commands_see_every_command(argv: list[str]) -> None:
    (sub,) = [a for a in parser(argv)._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(sub.choices) == 17


def test_escaping_and_colours_are_written_once() -> None:
    """One escaping function for wire and tables; colours named by meaning in
    llmgw.present, never by colour in render (its ANSI code table aside)."""
    from llmgw import render, wire
    from llmgw.common import printable

    assert render.clean is printable and wire.printable is printable
    after_the_codes = (ROOT / "llmgw" / "render.py").read_text().split("def paint(", 1)[1]
    assert not re.findall(r"\"(?:green|yellow|red|magenta|cyan|dim)\"", after_the_codes)
