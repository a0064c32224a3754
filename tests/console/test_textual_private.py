"""Textual's private members the console uses: each still exists in the pinned
Textual, with the parameters console/textual_private.py passes; and no other
console module reaches into a Textual object's private members."""

from __future__ import annotations

import inspect
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import Input

from llmgw.console.textual_private import (
    PRIVATE_GLOBALS,
    PRIVATE_MEMBERS,
    OrderedPasteParser,
    keep_pastes_in_order,
)

CONSOLE = Path(__file__).resolve().parents[2] / "console"
PYPROJECT = CONSOLE.parent / "pyproject.toml"


def test_the_pinned_textual_is_the_one_installed() -> None:
    pinned = re.search(r'"textual==([^"]+)"', PYPROJECT.read_text())
    assert pinned is not None, "pyproject.toml must pin Textual exactly"
    assert version("textual") == pinned.group(1)


@pytest.mark.parametrize(
    ("owner", "name", "params"), PRIVATE_MEMBERS, ids=[m[1] for m in PRIVATE_MEMBERS]
)
async def test_each_private_member_still_exists(
    owner: type, name: str, params: tuple[str, ...] | None
) -> None:
    if params is None:  # an attribute set in __init__: look on a live instance
        app: App[None] = App()
        async with app.run_test():
            box = Input()
            await app.mount(box)
            instance = app if isinstance(app, owner) else box
            assert isinstance(instance, owner)
            assert hasattr(instance, name), f"{owner.__name__}.{name} is gone"
        return
    member = inspect.getattr_static(owner, name, None)
    assert member is not None, f"{owner.__name__}.{name} is gone"
    signature = inspect.signature(getattr(owner, name))
    assert tuple(signature.parameters)[1:] == params, f"{owner.__name__}.{name}{signature}"


@pytest.mark.parametrize(
    ("module", "name"), PRIVATE_GLOBALS, ids=[m.__name__ for m, _ in PRIVATE_GLOBALS]
)
def test_each_replaced_global_still_exists(module: object, name: str) -> None:
    """The drivers build their parser from this global (keep_pastes_in_order)."""
    assert isinstance(getattr(module, name, None), type), f"{module}.{name} is gone"
    keep_pastes_in_order()
    assert getattr(module, name) is OrderedPasteParser
    source = inspect.getsource(module)  # and they still call it to parse input
    assert f"parser = {name}(" in source


PRIVATE_NAMES = sorted({name for _, name, _ in PRIVATE_MEMBERS} | {n for _, n in PRIVATE_GLOBALS})


def test_no_other_console_module_uses_them() -> None:
    pattern = re.compile(r"\.(" + "|".join(PRIVATE_NAMES) + r")\b")
    offenders = [
        f"{path.relative_to(CONSOLE)}:{n}: {line.strip()}"
        for path in sorted(CONSOLE.rglob("*.py"))
        if path.name != "textual_private.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
