"""Shell completion for `llmgw` (bash and zsh), by argcomplete.

argcomplete rather than shtab: node and model names come from the controller
at the moment Tab is pressed, and argcomplete asks the program itself (the
`_ARGCOMPLETE` environment protocol), so completion reads the same parser,
flags and contexts as the command does; shtab writes a static script and
would need hand-written shell functions for anything dynamic.

    eval "$(llmgw completion bash)"      # in ~/.bashrc
    eval "$(llmgw completion zsh)"       # in ~/.zshrc (after compinit)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from llmgw.common import examples

SHELLS = ("bash", "zsh")


def _client(parsed: argparse.Namespace) -> Any:
    from llmgw.config import resolve
    from llmgw.sync_client import SyncAdminClient

    where = resolve(
        controller=getattr(parsed, "controller", None),
        token=getattr(parsed, "token", None),
        token_file=getattr(parsed, "token_file", None),
        ca_file=getattr(parsed, "ca_file", None),
        context=getattr(parsed, "context", None),
    )
    return SyncAdminClient(where.controllers, where.token, ca_file=where.ca_file, read_timeout_s=2)


def _names(kind: str) -> Callable[..., list[str]]:
    def complete(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
        from llmgw import api

        try:
            with _client(parsed_args) as client:
                if kind == "node":
                    names = [r["name"] for r in client.json(api.nodes())]
                else:
                    names = [m["spec"]["name"] for m in client.json(api.models())]
        except Exception:  # no controller, no token: no names, never a traceback
            return []
        return [n for n in names if n.startswith(prefix)]

    return complete


def completion_parser() -> argparse.ArgumentParser:
    """`llmgw` as one parser: ctl in full, the other programs by name."""
    from llmgw import ctl
    from llmgw.programs import PROGRAMS

    top = argparse.ArgumentParser(prog="llmgw")
    sub = top.add_subparsers(dest="program")
    for name, (_, text) in PROGRAMS.items():
        p = sub.add_parser(name, help=text)
        if name == "ctl":
            ctl.populate(p)
            _attach(p)
        elif name == "completion":
            p.add_argument("shell", choices=SHELLS)
    return top


def _columns(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """`--sort-by`: the columns of the command's table (-o wide's included)."""
    from llmgw.render import SORT_COLUMNS

    columns = SORT_COLUMNS.get(getattr(parsed_args, "command", None) or "", ())
    lower = prefix != prefix.upper()  # --sort-by takes either case: answer in the one typed
    return [c.lower() if lower else c for c in columns if c.startswith(prefix.upper())]


def _kinds(prefix: str, **_: Any) -> list[str]:
    """`delete KIND`: the kinds that can be deleted (model)."""
    return [k for k in ("model",) if k.startswith(prefix)]


def _attach(p: argparse.ArgumentParser) -> None:
    """Node and model names as completions of the positional arguments that take
    them; a table's column names for --sort-by (never file names)."""
    for action in p._actions:
        if action.dest == "sort_by":
            action.completer = _columns  # type: ignore[attr-defined]
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                for arg in sub._actions:
                    if arg.metavar == "NODE":
                        arg.completer = _names("node")
                    elif (command, arg.dest) in (("delete", "name"), ("rollout", "model")):
                        arg.completer = _names("model")
                    elif (command, arg.dest) == ("delete", "kind"):
                        arg.completer = _kinds
                _attach(sub)


def autocomplete() -> None:
    """Answer a shell's completion request (argcomplete's protocol) and exit."""
    import argcomplete

    argcomplete.autocomplete(completion_parser())


HELP = f"""usage: llmgw completion {{bash,zsh}}

Print the shell code that completes llmgw's commands, flags, and node and
model names (asked of the controller when Tab is pressed).

{
    examples(
        'eval "$(llmgw completion bash)"    # in ~/.bashrc',
        'eval "$(llmgw completion zsh)"     # in ~/.zshrc, after compinit',
    )
}"""


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in SHELLS:
        if argv and argv[0] in ("-h", "--help"):
            print(HELP)
            return 0
        said = f"no completion for {argv[0]!r}" if argv else "which shell?"
        sys.stderr.write(
            f"llmgw completion: {said}: bash and zsh are supported "
            '(eval "$(llmgw completion bash)")\n'
        )
        return 2
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["llmgw"], shell=argv[0]))
    return 0
