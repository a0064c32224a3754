"""One error tree (llmgw.errors): every refusal the controller gives is a
`ServerError` carrying its status, the tree in the module's docstring is the tree
in the code, and nothing in the controller answers an error by hand."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import llmgw.controller
from llmgw import errors
from llmgw.errors import Fenced, LlmgwError, NotTheLeader, ServerError, TooMany

ROOT = Path(__file__).resolve().parents[2]

# Exceptions that never reach an answer, each caught beside the code that raises it.
INTERNAL_SIGNALS = {
    "llmgw.controller.core.changes.HistoryLost",  # a view resyncs
    "llmgw.controller.store.errors.StateError",  # the controller does not start
    "llmgw.controller.store.sql._Spent",  # rolls a transaction back
}

# `├── Name   NNN  what it means`: the name, then a status where the line gives one.
_LINE = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)\s*(?P<status>\d{3}|\dxx|\d)?")


def _drawn_tree() -> dict[str, tuple[str, str | None]]:
    """Each class the docstring draws: (its parent, the status drawn beside it)."""
    assert errors.__doc__ is not None
    drawn: dict[str, tuple[str, str | None]] = {}
    parents = ["LlmgwError"]
    for line in errors.__doc__.splitlines():
        m = _LINE.match(line.removeprefix("    "))
        if m is None:
            continue
        depth = len(m["indent"]) // 4
        del parents[depth + 1 :]
        assert m["name"] not in drawn, f"{m['name']} drawn twice"
        drawn[m["name"]] = (parents[depth], m["status"])
        parents.append(m["name"])
    return drawn


def _tree_classes() -> dict[str, type[LlmgwError]]:
    return {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, LlmgwError) and cls is not LlmgwError
    }


def test_the_docstring_draws_every_class_of_the_tree_under_its_parent() -> None:
    drawn = _drawn_tree()
    classes = _tree_classes()
    assert set(drawn) == set(classes)
    for name, (parent, status) in drawn.items():
        cls = classes[name]
        assert cls.__bases__[0].__name__ == parent, name
        if issubclass(cls, ServerError) and cls is not ServerError:
            assert status == str(cls.status), f"{name} is drawn as {status}, is {cls.status}"


def test_every_exception_the_controller_defines_is_in_the_tree() -> None:
    outside = []
    for info in pkgutil.walk_packages(llmgw.controller.__path__, "llmgw.controller."):
        module = importlib.import_module(info.name)
        for name, cls in vars(module).items():
            if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
                continue
            if cls.__module__ != module.__name__ or issubclass(cls, LlmgwError):
                continue
            if f"{module.__name__}.{name}" not in INTERNAL_SIGNALS:
                outside.append(f"{module.__name__}.{name}")
    assert outside == []


def _hand_made_answers(path: Path) -> list[str]:
    """Calls that build an error answer, or raise aiohttp's, outside the one middleware."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "error":  # web_io's, once
                found.append(f"{path.name}:{node.lineno} error(...)")
            for kw in node.keywords:
                status = kw.value.value if isinstance(kw.value, ast.Constant) else None
                if kw.arg == "status" and isinstance(status, int) and status >= 400:
                    found.append(f"{path.name}:{node.lineno} status={status}")
        if isinstance(node, ast.Raise) and node.exc is not None:
            text = ast.unparse(node.exc)
            if text.startswith("web.HTTP"):
                found.append(f"{path.name}:{node.lineno} raise {text}")
    return found


def test_nothing_in_the_controller_answers_an_error_by_hand() -> None:
    found = [
        hit
        for path in sorted((ROOT / "llmgw" / "controller").rglob("*.py"))
        for hit in _hand_made_answers(path)
    ]
    assert found == []


def test_a_refusal_carries_its_headers() -> None:
    follower = NotTheLeader("http://ctl-b:7460")
    assert follower.body() == {"error": "not the leader", "leader": "http://ctl-b:7460"}
    assert follower.headers() == {"X-LLMGW-Leader": "http://ctl-b:7460"}
    assert NotTheLeader(None).headers() is None
    fenced = Fenced("state not stored: the lease is held by another controller", "http://b")
    assert fenced.status == 503 and isinstance(fenced, NotTheLeader)
    assert fenced.body() == {
        "error": "not the leader",
        "leader": "http://b",
        "why": "state not stored: the lease is held by another controller",
    }
    assert TooMany("slow down", 0.2).headers() == {"Retry-After": "1"}
    assert TooMany("slow down", 2.01).headers() == {"Retry-After": "3"}
    assert TooMany("slow down").headers() is None
