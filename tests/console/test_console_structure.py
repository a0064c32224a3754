"""Structure rules that keep the console readable: screens and widgets never
import the app (no import circle), and only the app talks to the controller."""

from __future__ import annotations

import ast
from pathlib import Path

CONSOLE = Path(__file__).resolve().parents[2] / "console"


def imports(path: Path) -> set[str]:
    """Every module a file imports, TYPE_CHECKING blocks included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def parts() -> list[Path]:
    return sorted((CONSOLE / "screens").glob("*.py")) + sorted((CONSOLE / "widgets").glob("*.py"))


def test_screens_and_widgets_never_import_the_app() -> None:
    assert parts(), "no console screens or widgets found"
    offenders = {
        str(p.relative_to(CONSOLE)): sorted(
            m for m in imports(p) if m.startswith("llmgw.console.app")
        )
        for p in parts()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_screens_and_widgets_do_no_network_io() -> None:
    # The admin client's calls and httpx belong to the app; screens post messages.
    network = ("httpx", "aiohttp", "llmgw.client")
    offenders = {
        str(p.relative_to(CONSOLE)): sorted(m for m in imports(p) if m.startswith(network))
        for p in parts()
    }
    assert {k: v for k, v in offenders.items() if v} == {}
