"""ctl's command line: argparse, with connection and output options accepted
before or after the command, and usage errors as one plain line (exit 2)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn

from llmgw.common import DEFAULT_CONTROLLER, examples
from llmgw.durations import duration_arg
from llmgw.errors import EXIT_USAGE

NODE_STATES = ("ready", "cordoned", "draining", "unreachable")
OUTPUTS = ("table", "json", "yaml", "wide", "name", "csv")
# Options before the command that take a value (the word after them is not the command).
_VALUED = frozenset(
    {
        "--controller",
        "--token",
        "--token-file",
        "--ca-file",
        "--context",
        "-o",
        "--output",
        "--sort-by",
        "--interval",
    }
)
# The commands that print a table (--sort-by, --no-headers) and those that keep watching (-w).
SORTS = (
    "nodes",
    "models",
    "replicas",
    "events",
    "credentials",
    "keys",
    "limits",
    "usage",
    "rollout",
)
WATCHES = ("status", "nodes", "models", "replicas", "events")
WAITS = ("drain", "rollout")  # --wait polls too: --interval is the time between polls
WATCH_INTERVAL_S, WAIT_INTERVAL_S = 2.0, 1.0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option; examples (the epilog) kept as written."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24) -> None:
        # argparse builds a formatter per add_argument, each asking shutil for
        # the terminal size: one ask, and no shutil import, for a one-shot.
        if not _HELP_WIDTH:
            _HELP_WIDTH.append(max(terminal_columns() - 2, 11))  # as argparse's default
        super().__init__(prog, indent_increment, max_help_position, width=_HELP_WIDTH[0])

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # No "(default: None)" / "(default: False)" noise, and no default for
        # options that do not have one.
        if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


_HELP_WIDTH: list[int] = []  # one ask per process


def terminal_columns() -> int:
    """shutil.get_terminal_size's columns (COLUMNS, else the terminal, else 80),
    without importing shutil (and with it bz2, lzma and zlib)."""
    try:
        columns = int(os.environ.get("COLUMNS", 0))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, OSError, ValueError):
            columns = 0
    return columns or 80


def terminal_lines() -> int:
    """The terminal's height as shutil would say it (LINES, else the terminal, else 24)."""
    try:
        lines = int(os.environ.get("LINES", 0))
    except ValueError:
        lines = 0
    if lines <= 0:
        try:
            lines = os.get_terminal_size(sys.__stdout__.fileno()).lines  # type: ignore[union-attr]
        except (AttributeError, OSError, ValueError):
            lines = 0
    return lines or 24


class Parser(argparse.ArgumentParser):
    """Usage errors as one plain line, exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see {self.prog} --help)\n")
        sys.exit(EXIT_USAGE)


def _common_options(
    p: argparse.ArgumentParser,
    *,
    top: bool,
    table: bool = False,
    watch: bool = False,
    wait: bool = False,
) -> None:
    """Connection and output options: accepted before or after the subcommand.

    The subcommand's copy uses SUPPRESS as its default so that a value given
    before the subcommand is not overwritten by the subcommand's default.
    Before the command every option is accepted (checks.py refuses one the
    command has no use for); after it, a command lists only those it uses.
    """
    d: Any = None if top else argparse.SUPPRESS
    g = p.add_argument_group("connection and output (before or after the command)")
    g.add_argument(
        "--controller",
        metavar="URL[,URL]",
        default=d,
        help=f"controller URL(s); no scheme means http:// (env LLMGW_CONTROLLER, "
        f"else the context, else {DEFAULT_CONTROLLER})",
    )
    g.add_argument("--token", default=d, help="bearer token (env LLMGW_TOKEN)")
    g.add_argument(
        "--token-file",
        default=d,
        metavar="FILE",
        help="file holding the token (env LLMGW_TOKEN_FILE)",
    )
    g.add_argument(
        "--ca-file", default=d, metavar="FILE", help="CA bundle for https (env LLMGW_CA_FILE)"
    )
    g.add_argument("--context", default=d, help="context from the config file (env LLMGW_CONTEXT)")
    g.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default=d,
        help="output format of reads: table (the default), json, yaml, wide, name; csv for usage",
    )
    g.add_argument(
        "--json",
        dest="output",
        action="store_const",
        const="json",
        default=d,
        help="the same as -o json",
    )
    g.add_argument(
        "--no-headers", action="store_true", default=d, help="tables without the header line"
    )
    if top or table:
        g.add_argument(
            "--sort-by",
            metavar="COLUMN",
            default=d,
            help="sort a table's rows by this column (e.g. AGE)",
        )
    if top or watch:
        g.add_argument(
            "-w",
            "--watch",
            action="store_true",
            default=d,
            help="keep watching: redraw in place on a terminal (its alternate screen, cut to its height), append "
            "changes when piped; Ctrl-C ends",
        )
    if top or watch or wait:
        g.add_argument(
            "--interval",
            type=duration_arg,
            default=d,
            metavar="DURATION",
            help=f"time between polls with -w (default: {WATCH_INTERVAL_S:g}s) or --wait "
            f"(default: {WAIT_INTERVAL_S:g}s)",
        )


def _sub(
    sub: Any, name: str, help: str, example: str, description: str | None = None
) -> argparse.ArgumentParser:
    s: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=description or help[0].upper() + help[1:] + ".",
        epilog=examples(*example.splitlines()),
        formatter_class=HelpFormatter,
    )
    _common_options(s, top=False, table=name in SORTS, watch=name in WATCHES, wait=name in WAITS)
    return s


DESCRIPTION = "One-shot commands for an llmgw fleet."
EPILOG = (
    "exit codes: 0 done; 1 the controller refused or could not be reached, or "
    "drain --dry-run found a model falling below its minimum; 2 usage error\n\n"
    "example:\n  llmgw ctl --controller http://ctl-1:7460 status"
)


def command_of(argv: Sequence[str]) -> str | None:
    """The command `argv` names (the first word that is not an option or its value);
    None when there is none or it is not one of ctl's (argparse then says so)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--":
            return None
        elif word.startswith("-"):
            skip = word in _VALUED
        else:
            return word if word in COMMANDS else None
    return None


def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """ctl's parser; given `argv`, built for the command it names only."""
    p = Parser(
        prog="llmgw ctl", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter
    )
    return populate(p, command_of(argv) if argv is not None else None)


def populate(p: argparse.ArgumentParser, only: str | None = None) -> argparse.ArgumentParser:
    """ctl's options and commands on `p` (its own parser, or `llmgw completion`'s).

    With `only`, that command alone: a one-shot builds one subparser, not fifteen
    (argparse asks gettext for its words once per parser, each a search of the disk).
    """
    _common_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for command in TABLE:
        if only is None or command.name == only:
            s = _sub(sub, command.name, command.help, command.example)
            if command.arguments is not None:
                command.arguments(s)
    return p


# -- the commands: one row each, in the order `--help` lists them ---------------------


class Command(NamedTuple):
    name: str
    help: str  # one line, lower case: `--help`'s list and the command's description
    example: str  # lines of examples
    arguments: Callable[[argparse.ArgumentParser], None] | None  # its own arguments


def _nodes_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("names", nargs="*", metavar="NODE", help="only these nodes (NAME or node/NAME)")
    s.add_argument("--state", choices=NODE_STATES, help="only nodes in this state")


def _node_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("name", metavar="NODE", help="the node, or `forget`")
    s.add_argument("target", nargs="?", metavar="NAME", help="with `forget`: the node to forget")


def _credentials_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=["list", "revoke", "approve", "allow", "token"])
    s.add_argument(
        "nodes",
        nargs="*",
        metavar="NODE",
        help="the nodes; after `token`: create, list, or delete ID...",
    )
    s.add_argument(
        "--allow-enroll",
        action="store_true",
        help="with revoke: let the node enroll again (it reported before, so it needs this)",
    )
    s.add_argument(
        "--ttl",
        type=duration_arg,
        metavar="DURATION",
        default=None,
        help="with token create: how long it enrolls nodes (30m, 1h, 7d; 0: never "
        "expires); default 24h",
    )
    s.add_argument(
        "--uses", type=int, default=None, help="with token create: at most this many nodes"
    )
    s.add_argument("--description", help="with token create: what it is for (listed)")


def _limits_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=["set", "list", "delete"])
    s.add_argument("tenant", nargs="?", help="with set and delete: whose limits")
    s.add_argument("--model", help="with set and delete: on this model only (default: all)")
    s.add_argument("--rpm", type=int, help="with set: requests per minute")
    s.add_argument("--tpm", type=int, help="with set: tokens (prompt and completion) per minute")
    s.add_argument("--budget", type=int, metavar="TOKENS", help="with set: tokens per --per")
    s.add_argument("--per", choices=["day", "month"], help="with --budget: its period (UTC)")


def _usage_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--since",
        default="24h",
        metavar="DURATION",
        help="how far back (from the start of the hour it falls in); default 24h",
    )
    s.add_argument(
        "--by", default="tenant,model", help="sum by tenant, model or tenant,model (the default)"
    )


def _keys_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=["create", "list", "revoke"])
    s.add_argument("ids", nargs="*", metavar="ID", help="with revoke: the keys")
    s.add_argument("--tenant", help="with create: whose key it is (letters, digits, ._-)")
    s.add_argument(
        "--models",
        nargs="+",
        metavar="PATTERN",
        default=[],
        help="with create: the models it may use, shell-style (llama-*); default: every model",
    )
    s.add_argument(
        "--expires",
        type=duration_arg,
        metavar="DURATION",
        default=None,
        help="with create: how long it works (90d, 12h); default: until revoked",
    )


def _cordon_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("nodes", nargs="+", metavar="NODE")
    s.add_argument("--reason", required=True, help="why (recorded with who and when)")


def _uncordon_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("nodes", nargs="+", metavar="NODE")
    s.add_argument(
        "--force",
        action="store_true",
        help="uncordon even a node llmgw cordoned for a card that is still unhealthy",
    )


def _drain_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("nodes", nargs="+", metavar="NODE")
    s.add_argument("--reason", help="why (required unless --dry-run)")
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="only say what draining would do to each model; exit 1 if one falls below its minimum",
    )
    s.add_argument(
        "--force", action="store_true", help="stop replicas without waiting for replacements"
    )
    s.add_argument(
        "--force-after",
        type=duration_arg,
        metavar="DURATION",
        help="the controller forces the drain this long from now (30s, 90m, 1h; "
        "a bare number is seconds)",
    )
    s.add_argument(
        "--yes",
        action="store_true",
        help="with --force or --force-after: go ahead even if a model falls below its minimum",
    )
    s.add_argument("--wait", action="store_true", help="show progress until the drain is done")
    s.add_argument(
        "--timeout",
        type=duration_arg,
        metavar="DURATION",
        help="how long --wait waits (30s, 10m, 1h; default 10m)",
    )


def _apply_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "-f",
        "--file",
        required=True,
        metavar="FILE",
        help="the file; - reads standard input (YAML)",
    )
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="the controller validates the models and ctl shows what would change; "
        "nothing is written",
    )


def _rollout_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=["status", "history", "undo"])
    s.add_argument("model", metavar="MODEL")
    s.add_argument(
        "--wait",
        action="store_true",
        help="status: follow the rollout until it is done (exit 0) or stalls (exit 1)",
    )
    s.add_argument(
        "--timeout",
        type=duration_arg,
        metavar="DURATION",
        help="status --wait: give up after this long (30s, 10m, 1h; default 10m)",
    )
    s.add_argument(
        "--to-revision",
        type=int,
        metavar="N",
        help="undo: back to what revision N ran (default: the one before)",
    )


def _events_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--for",
        dest="object",
        metavar="KIND/NAME",
        help="only the events of node/NAME or model/NAME",
    )


def _delete_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("kind", metavar="KIND", help="model (or model/NAME, as -o name prints it)")
    s.add_argument("name", nargs="?", metavar="NAME")


def _config_arguments(s: argparse.ArgumentParser) -> None:
    cs = s.add_subparsers(
        dest="config_command", required=True, metavar="ACTION", parser_class=Parser
    )
    for action, text, example in (
        (
            "get-contexts",
            "list the contexts; * marks the current one",
            "llmgw ctl config get-contexts",
        ),
        ("use-context", "make NAME the current context", "llmgw ctl config use-context prod"),
        (
            "current-context",
            "print the current context's name",
            "llmgw ctl config current-context",
        ),
        (
            "view",
            "each setting in effect and where it came from",
            "LLMGW_CONTEXT=demo llmgw ctl config view",
        ),
    ):
        c = cs.add_parser(
            action,
            help=text,
            description=text[0].upper() + text[1:] + ".",
            epilog=f"example:\n  {example}",
            formatter_class=HelpFormatter,
        )
        _common_options(c, top=False)
        if action == "use-context":
            c.add_argument("name", metavar="NAME")


TABLE = (
    Command(
        "status",
        "the fleet summary",
        "llmgw ctl status -w",
        None,
    ),
    Command(
        "nodes",
        "every node with its state and reason",
        "llmgw ctl nodes --state cordoned -o wide --sort-by AGE\n"
        "llmgw ctl nodes -o name --state ready | xargs llmgw ctl cordon --reason maint",
        _nodes_arguments,
    ),
    Command(
        "node",
        "one node in detail: GPUs, storage, replicas, history; `node forget NAME` forgets it",
        "llmgw ctl node gpu-a01 -o json\nllmgw ctl node forget gpu-a01",
        _node_arguments,
    ),
    Command(
        "credentials",
        "node credentials and enrollment: list, revoke, approve or allow nodes; "
        "create, list or delete enrollment tokens",
        "llmgw ctl credentials list\n"
        "llmgw ctl credentials token create --ttl 1h --uses 10 --description 'rack 7'\n"
        "llmgw ctl credentials approve gpu-a01\n"
        "llmgw ctl credentials allow gpu-a02   # reported before: may enroll once\n"
        "llmgw ctl credentials revoke gpu-a01 --allow-enroll",
        _credentials_arguments,
    ),
    Command(
        "keys",
        "tenants' client keys for the gateways: create (shown once), list, revoke",
        "llmgw ctl keys create --tenant acme --models 'llama-*' chat --expires 90d\n"
        "KEY=$(llmgw ctl keys create --tenant acme)   # the key alone on stdout\n"
        "llmgw ctl keys list -o json\n"
        "llmgw ctl keys revoke k3f9a2b1",
        _keys_arguments,
    ),
    Command(
        "limits",
        "tenants' limits at the gateways: requests and tokens per minute, token budgets",
        "llmgw ctl limits set acme --rpm 600 --tpm 200000\n"
        "llmgw ctl limits set acme --model llama-70b --budget 5000000 --per month\n"
        "llmgw ctl limits list -o json\n"
        "llmgw ctl limits delete acme --model llama-70b",
        _limits_arguments,
    ),
    Command(
        "usage",
        "requests and tokens per tenant and model, every gateway's (counted by the hour)",
        "llmgw ctl usage\n"
        "llmgw ctl usage --since 7d --by tenant -o csv\n"
        "llmgw ctl usage --since 30d -o json",
        _usage_arguments,
    ),
    Command(
        "cordon",
        "place no new replicas on these nodes",
        'llmgw ctl cordon gpu-a03 gpu-a07 --reason "xid 79"',
        _cordon_arguments,
    ),
    Command(
        "uncordon",
        "let these nodes take new replicas again",
        "llmgw ctl uncordon gpu-a03\nllmgw ctl uncordon gpu-a03 --force   # its failed card is fine",
        _uncordon_arguments,
    ),
    Command(
        "drain",
        "move replicas off these nodes, then leave them cordoned",
        'llmgw ctl drain --dry-run gpu-b01 gpu-b02\nllmgw ctl drain gpu-b01 gpu-b02 --reason "PSU swap" --wait --timeout 15m',
        _drain_arguments,
    ),
    Command(
        "apply",
        "declare models from a YAML or TOML file",
        "llmgw ctl apply -f models.yaml --dry-run\ncat models.yaml | llmgw ctl apply -f -",
        _apply_arguments,
    ),
    Command(
        "models",
        "declared models with ready/minimum",
        "llmgw ctl models -o wide",
        None,
    ),
    Command(
        "rollout",
        "a model's rollout of a changed spec: its status, its revisions, or go back",
        "llmgw ctl rollout status meta-llama/Llama-3.1-8B-Instruct --wait --timeout 10m\n"
        "llmgw ctl rollout history meta-llama/Llama-3.1-8B-Instruct\n"
        "llmgw ctl rollout undo meta-llama/Llama-3.1-8B-Instruct --to-revision 2",
        _rollout_arguments,
    ),
    Command(
        "replicas",
        "every replica with its state and idleness",
        "llmgw ctl replicas --sort-by IDLE",
        None,
    ),
    Command(
        "events",
        "what the controller decided by itself (placed, stand-in, rollout, fault, ...)",
        "llmgw ctl events --for model/meta-llama/Llama-3.1-8B-Instruct\n"
        "llmgw ctl events --for node/gpu-a03 -w",
        _events_arguments,
    ),
    Command(
        "delete",
        "delete a declared object",
        "llmgw ctl delete model meta-llama/Llama-3.1-8B-Instruct",
        _delete_arguments,
    ),
    Command(
        "config",
        "contexts in the config file ($XDG_CONFIG_HOME/llmgw/config.toml)",
        "llmgw ctl config get-contexts\nllmgw ctl config use-context prod\n"
        "llmgw ctl config current-context\nllmgw ctl config view",
        _config_arguments,
    ),
)
COMMANDS = tuple(command.name for command in TABLE)
