"""How the project is put together (issues 20 and 31): no import cycle anywhere,
the controller's imports going only down its layers, no module that writes
another's private state or imports another's private names.

Each check reads the source with `ast`; nothing is imported or run. The
packages checked are the ones the project installs (pyproject.toml): llmgw, and
the folders agent/ and console/ as llmgw.agent and llmgw.console (issue 35 item 16).
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each folder of the project's code and the package it is installed as. agent/ and
# console/ live beside llmgw/ and are reached through the links llmgw/agent and
# llmgw/console, so that the only top-level name the project installs is `llmgw`.
PACKAGES = {"llmgw": "llmgw", "agent": "llmgw.agent", "console": "llmgw.console"}
FOLDERS_IN_LLMGW = ("agent", "console")


# The modules that may import private names, each the one choke point for it:
# Textual's private members, and CPython's `_socket` under ctl's own HTTP/1
# transport (`socket`'s import would cost every one-shot ctl 2 ms; llmgw/http1.py).
PRIVATE_IMPORTS_ALLOWED = {"console/textual_private.py", "llmgw/http1.py"}

# Calls that change the object they are called on.
MUTATORS = {
    "append",
    "pop",
    "clear",
    "update",
    "add",
    "remove",
    "discard",
    "setdefault",
    "extend",
    "insert",
    "popitem",
}


def _sources() -> list[Path]:
    """Every module once, under its folder (never again through a link)."""
    return sorted(
        p
        for folder in PACKAGES
        for p in (ROOT / folder).rglob("*.py")
        if not any((ROOT / "llmgw" / f) in p.parents for f in FOLDERS_IN_LLMGW)
    )


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module(path: Path) -> str:
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGES[folder], *parts])


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# -- imports -------------------------------------------------------------------------


def _imported(path: Path, known: set[str]) -> dict[str, int]:
    """The project modules `path` imports, each with the first line that does.

    Every import counts: at module level, inside `if TYPE_CHECKING:` and inside
    functions (lazy imports). `from a.b import c` imports a.b, and a.b.c too when
    that is a module; importing a package imports its __init__. The packages
    above an imported module (run first by Python) are not counted: a module
    importing its own package's sibling is no cycle."""
    this = _module(path)
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        while name and name not in known:  # `import a.b.c` of a name inside a module
            name = name.rpartition(".")[0]
        if name and name != this:
            found.setdefault(name, line)

    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package this module is in
                base = this.split(".") if path.name == "__init__.py" else this.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            add(module, node.lineno)
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    add(f"{module}.{alias.name}", node.lineno)
    return found


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each
    given as one cycle through all of it, in import order from its least name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # recursion: the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_a_cycle(graph, c) for c in components]


def _a_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest way from the component's least module back to itself."""
    start = min(component)
    came_from: dict[str, str] = {}
    todo = [start]
    while todo:
        nxt = []
        for v in todo:
            for w in sorted(graph[v]):
                if w in component and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        if start in came_from:
            break
        todo = nxt
    path = [start]
    while (v := came_from[path[-1]]) != start:
        path.append(v)
    return [start, *reversed(path[1:]), start]


def test_no_import_cycle_anywhere() -> None:
    paths = {_module(p): p for p in _sources()}
    known = set(paths)
    graph = {m: _imported(p, known) for m, p in paths.items()}
    cycles = [
        " -> ".join(f"{a} ({_rel(paths[a])}:{graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
        for cycle in _cycles(graph)
    ]
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_and_names_a_cycle() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2, "d": 3}, "c": {"a": 4}, "d": {}, "e": {"e2": 1}}
    graph["e2"] = {"e": 1}
    assert _cycles(graph) == [["a", "b", "c", "a"], ["e", "e2", "e"]]


# -- layers --------------------------------------------------------------------------

# The controller's layers, lowest first (llmgw/controller/__init__.py draws them):
# a module imports from its own layer or those below, never above. A layer is a
# package, or one module at the controller's top.
CONTROLLER_LAYERS = (
    ("core",),
    ("store",),
    ("state",),
    ("views",),
    ("term",),
    ("loop",),
    ("leadership", "metrics"),
    ("http",),
    ("main", "migrate"),
)


def _controller_layer(module: str) -> int | None:
    """The layer of `llmgw.controller.X...`, by X; None for the package itself."""
    parts = module.split(".")
    if parts[:2] != ["llmgw", "controller"] or len(parts) < 3:
        return None
    for i, names in enumerate(CONTROLLER_LAYERS):
        if parts[2] in names:
            return i
    raise AssertionError(f"{module} is in no layer: add it to CONTROLLER_LAYERS")


def _upward_imports() -> list[str]:
    paths = {_module(p): p for p in _sources()}
    known = set(paths)
    found = []
    for module, path in sorted(paths.items()):
        here = _controller_layer(module)
        if here is None:
            continue
        for imported, line in sorted(_imported(path, known).items()):
            there = _controller_layer(imported)
            if there is not None and there > here:
                found.append(f"{_rel(path)}:{line}: {module} imports {imported}, a layer above")
    return found


def test_the_controller_imports_only_down_its_layers() -> None:
    found = _upward_imports()
    assert found == [], "imports against the controller's layers:\n" + "\n".join(found)


def test_every_controller_module_is_in_a_layer() -> None:
    controller = ROOT / "llmgw" / "controller"
    for path in sorted(controller.rglob("*.py")):
        _controller_layer(_module(path))  # raises for a module in no layer


def test_a_modules_layer_is_its_package_or_its_name() -> None:
    assert _controller_layer("llmgw.controller.core.records") == 0
    assert _controller_layer("llmgw.controller.loop.apply") == 5
    assert _controller_layer("llmgw.controller.main") == 8
    assert _controller_layer("llmgw.controller") is None
    assert _controller_layer("llmgw.wire") is None


# The engine supervisor (agent/engines.py) and its parts, lowest first: a part
# imports only parts below it, so the probes and the lifecycle never import each other.
SUPERVISOR_LAYERS = (
    ("engine_settings", "engine_shard"),
    ("engine_http",),
    ("engine_lifecycle", "engine_probes"),
    ("engine_sleep",),
    ("engines",),
)


def _agent_modules_imported(path: Path) -> dict[str, int]:
    """The agent modules `path` imports, by their name in the agent package (the same
    whether the package is imported as `agent` or under another name)."""
    found: dict[str, int] = {}
    for node in ast.walk(_tree(path)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            package, _, leaf = name.rpartition(".")
            if package.rpartition(".")[2] == "agent":
                found.setdefault(leaf, node.lineno)
    return found


def test_the_engine_supervisors_parts_import_only_down() -> None:
    layer = {name: i for i, names in enumerate(SUPERVISOR_LAYERS) for name in names}
    agent = ROOT / "agent"
    missing = sorted(n for n in layer if not (agent / f"{n}.py").exists())
    assert missing == [], f"SUPERVISOR_LAYERS names modules that do not exist: {missing}"
    found = []
    for name, here in sorted(layer.items()):
        path = agent / f"{name}.py"
        for imported, line in sorted(_agent_modules_imported(path).items()):
            there = layer.get(imported)
            if there is not None and there >= here and imported != name:
                found.append(f"{_rel(path)}:{line}: {name} imports {imported}, not below it")
    assert found == [], "imports against the supervisor's layers:\n" + "\n".join(found)


def _engine_state_writes(path: Path) -> list[int]:
    """Lines of `path` that assign an engine's `state` (`X.state = ...`)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and target.attr == "state"
    ]


def test_only_the_lifecycle_writes_an_engines_state() -> None:
    """One owner per piece of state (issue 31): sleep, wake, probes and adapters ask
    `EngineLifecycle` (mark_ready, mark_sleeping, mark_waking, begin_stop, kill_failed)."""
    agent = ROOT / "agent"
    found = [
        f"{_rel(path)}:{line}"
        for path in sorted(agent.glob("engine*.py"))
        if path.name != "engine_lifecycle.py"
        for line in _engine_state_writes(path)
    ]
    assert found == [], "an engine's state written outside engine_lifecycle.py:\n" + "\n".join(
        found
    )
    assert _engine_state_writes(agent / "engine_lifecycle.py"), "the finder finds its writes"


# -- private state -------------------------------------------------------------------


def _through_another(expr: ast.expr) -> bool:
    """Whether `expr` (a target, or what a method is called on) reaches a private
    attribute of an object other than `self` or `cls`: `other._x`, `x._y[k]`,
    `self.fleet._z`, `x._y.z`."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if isinstance(expr, ast.Attribute) and _private(expr.attr):
            owner = expr.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                return True
        expr = expr.value
    return False


def _targets(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _targets(element)
    elif isinstance(target, ast.Starred):
        yield from _targets(target.value)
    else:
        yield target


def _private_writes(path: Path) -> Iterator[ast.stmt | ast.expr]:
    """Each statement or call in `path` that writes another object's private state:
    an assignment (plain, augmented, annotated, a for or with target), a `del`, a
    mutating call (`MUTATORS`) or `setattr`/`delattr` of a `_name`. (A `with`'s or
    a comprehension's target is given by itself.)"""
    for node in ast.walk(_tree(path)):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(
            node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.comprehension)
        ):
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in MUTATORS and _through_another(f.value):
                yield node
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in ("setattr", "delattr", "__setattr__", "__delattr__") and len(node.args) > 1:
                attr = node.args[1]
                if isinstance(attr, ast.Constant) and _private(str(attr.value)):
                    yield node
        for t in (t for target in targets for t in _targets(target) if _through_another(t)):
            yield node if isinstance(node, ast.stmt) else t


def _private_write_lines() -> set[str]:
    return {
        f"{_rel(p)}:{node.lineno}: {ast.unparse(node).splitlines()[0]}"
        for p in _sources()
        for node in _private_writes(p)
    }


def test_no_module_writes_another_modules_private_state() -> None:
    """A `_name` is written only by its owner, through `self` (or `cls` in a
    classmethod); anyone else asks the owner through a method."""
    found = sorted(_private_write_lines())
    assert found == [], "private state written from outside:\n" + "\n".join(found)


def test_the_private_write_finder_finds_each_kind(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "class A:\n"
        "    def f(self, other, fleet, x, k, v):\n"
        "        other._x = 1\n"  # 3
        "        fleet._stopping.pop(k)\n"  # 4
        "        x._y[k] = v\n"  # 5
        "        self.fleet._z += 1\n"  # 6
        "        del other._q\n"  # 7
        "        setattr(other, '_n', 3)\n"  # 8
        "        a, other._t = 1, 2\n"  # 9
        "        self.a._b.c = 3\n"  # 10
        "        self._own = 1\n"
        "        self._own.append(other._read)\n"
        "        other.__dict__ = {}\n"
        "        other.public = other._read\n"
        "        setattr(other, 'public', 1)\n"
        "    @classmethod\n"
        "    def g(cls):\n"
        "        cls._registry = {}\n"
        "    def h(self, x):\n"
        "        with open(x) as x._f, open(x) as self._g:\n"  # 20
        "            return [0 for x._i in x]\n"  # 21
    )
    assert sorted(node.lineno for node in _private_writes(source)) == [*range(3, 11), 20, 21]


# -- private imports -----------------------------------------------------------------


def test_no_module_imports_private_names() -> None:
    """No `from x import _y`, nor a module whose path has a `_part`, in the project;
    console/textual_private.py alone reaches Textual's private members."""
    found = []
    for p in _sources():
        for node in ast.walk(_tree(p)):
            if isinstance(node, ast.ImportFrom):
                names = (node.module or "").split(".") + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [part for a in node.names for part in a.name.split(".")]
            else:
                continue
            if any(_private(n) for n in names):
                found.append(f"{_rel(p)}:{node.lineno}: {ast.unparse(node)}")
    allowed = [f for f in found if f.split(":", 1)[0] in PRIVATE_IMPORTS_ALLOWED]
    unused = PRIVATE_IMPORTS_ALLOWED - {f.split(":", 1)[0] for f in allowed}
    assert not unused, f"{sorted(unused)} import nothing private: drop them here"
    others = [f for f in found if f not in allowed]
    assert others == [], "private names imported:\n" + "\n".join(others)


# -- one name per module ---------------------------------------------------------------


def _python_files() -> list[Path]:
    """Every Python file of the checkout (links not followed; virtual environments,
    build output and hidden folders skipped)."""
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith((".", "__pycache__", "build", "dist"))
            and not d.endswith(".egg-info")
        ]
        found += [Path(top) / f for f in files if f.endswith(".py")]
    return sorted(found)


def _folder_imports(path: Path) -> Iterator[str]:
    """Each import in `path` of agent/ or console/ by its folder's name."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(n.split(".")[0] in FOLDERS_IN_LLMGW for n in names):
            where = _rel(path) if path.is_relative_to(ROOT) else path.name
            yield f"{where}:{node.lineno}: {ast.unparse(node)}"


def _named_by_folder() -> re.Pattern[str]:
    """A dotted name `agent.<a module of agent/>` not inside a longer dotted name,
    word or path: how a string names a module to import (`python -m`, a patch
    target, a logger, the programs' table)."""
    alternatives = []
    for folder in FOLDERS_IN_LLMGW:
        names = {p.stem for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"}
        names |= {p.parent.name for p in (ROOT / folder).glob("*/__init__.py")}
        alternatives.append(rf"{folder}\.(?:{'|'.join(sorted(names))})")
    return re.compile(rf"(?<![\w.\-/])(?:{'|'.join(alternatives)})(?!\w)")


def test_no_module_is_imported_by_its_folders_name() -> None:
    """From the checkout's root the folders agent/ and console/ are importable as
    `agent` and `console` too; a module imported under two names is two modules
    (two registries, two loggers, isinstance failing), and an installed `agent`
    distribution would shadow the name. Code says llmgw.agent and llmgw.console,
    in imports and in strings that name a module."""
    imports = [found for p in _python_files() for found in _folder_imports(p)]
    assert imports == [], "imported by the folder's name:\n" + "\n".join(imports)
    pattern = _named_by_folder()
    strings = [
        f"{_rel(p)}:{node.lineno}: {node.value!r}"
        for p in _python_files()
        for node in ast.walk(_tree(p))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and pattern.search(node.value)
    ]
    assert strings == [], "modules named by the folder's name:\n" + "\n".join(strings)


def test_the_folder_name_finders_find_each_kind(tmp_path: Path) -> None:
    a, c = FOLDERS_IN_LLMGW  # (spelled so that the checks above do not find this test)
    source = tmp_path / "sample.py"
    source.write_text(
        f"import {a}.engines\n"
        f"import os, {c}\n"
        f"from {a} import gpus\n"
        f"from {c}.app import ConsoleApp\n"
        f"from llmgw.{a} import loop\n"
        f"from . import {a}\n"
        f"from llmgw.wire import {a} as wire_agent\n"
    )
    assert [f.split(": ", 1)[1] for f in _folder_imports(source)] == [
        f"import {a}.engines",
        f"import os, {c}",
        f"from {a} import gpus",
        f"from {c}.app import ConsoleApp",
    ]
    pattern = _named_by_folder()
    named = [f"-m {a}.fake_engine", f"{c}.app.ConsoleApp", f"{a}.loop"]
    assert all(pattern.search(s) for s in named)
    fine = [f"llmgw.{a}.fake_engine", f"{a}.tokens", f"llmgw-{a}.service", f"x/{a}.loop", a]
    assert not any(pattern.search(s) for s in fine)


def test_agent_and_console_are_installed_under_llmgw() -> None:
    """The links that make the folders llmgw.agent and llmgw.console: relative, so
    that a checkout anywhere works; and llmgw the only top-level package found."""
    for folder in FOLDERS_IN_LLMGW:
        link = ROOT / "llmgw" / folder
        assert link.is_symlink() and os.readlink(link) == f"../{folder}", link
        assert (link / "__init__.py").samefile(ROOT / folder / "__init__.py")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"]["find"]["include"] == ["llmgw*"]
