"""The `llmgw` command: dispatches to each program lazily.

`llmgw` itself never imports `agent` or `console` at module level, so the
controller host does not need the console's dependencies loaded, and imports
keep pointing one way.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

from llmgw import __version__
from llmgw.programs import PROGRAMS

USAGE = "usage: llmgw {" + ",".join(PROGRAMS) + "} [options]\n"


def _help() -> str:
    lines = [USAGE, f"llmgw {__version__}: fleet console and node agent for LLM GPU clusters.", ""]
    lines += [f"  {name:<11} {text}" for name, (_, text) in PROGRAMS.items()]
    lines += ["", "Run `llmgw COMMAND --help` for the options of each."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and "_ARGCOMPLETE" in os.environ:  # the shell asks for completions
        from llmgw.completion import autocomplete

        autocomplete()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_help())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"llmgw {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in PROGRAMS:
        sys.stderr.write(USAGE + f"llmgw: unknown command {name!r}\n")
        return 2
    module_name = PROGRAMS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            sys.stderr.write(f"llmgw {name}: not built yet in this version\n")
            return 2
        raise
    entry: Callable[[list[str]], int] = module.main
    return entry(rest)
