"""`llmgw ctl`: one-shot commands against the controller's admin API.

Exit codes: 0 success; 1 the controller refused, could not be reached, or (for
`drain --dry-run`) a model would fall below its minimum; 2 a usage error.

Built to start fast (a one-shot is run in loops and scripts): the blocking
stdlib client, no asyncio, no httpx, no rich; pydantic models are built on
first use. Output follows kubectl: `-o json|yaml|wide|name`, `--no-headers`,
`--sort-by`, `-w`; piped output has no colour, no padding, one line per row.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from llmgw import api, render
from llmgw.common import DEFAULT_CONTROLLER, examples
from llmgw.config import Resolved, resolve
from llmgw.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ClientError,
    ControllerError,
    NotAController,
    UsageError,
    advice,
    explain,
)

if TYPE_CHECKING:
    from llmgw.sync_client import SyncAdminClient
    from llmgw.wire import ModelSpec, NodeRow

EXIT_CONTROLLER = EXIT_FAILED
NODE_STATES = ("ready", "cordoned", "draining", "unreachable")
OUTPUTS = ("table", "json", "yaml", "wide", "name")
WATCHED = ("status", "nodes", "models", "replicas")


# -- the parser ----------------------------------------------------------------------


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


class Parser(argparse.ArgumentParser):
    """Usage errors as one plain line, exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see {self.prog} --help)\n")
        sys.exit(EXIT_USAGE)


def _common_options(p: argparse.ArgumentParser, *, top: bool) -> None:
    """Connection and output options: accepted before or after the subcommand.

    The subcommand's copy uses SUPPRESS as its default so that a value given
    before the subcommand is not overwritten by the subcommand's default.
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
        help="output format of reads: table (the default), json, yaml, wide, name",
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
    _common_options(s, top=False)
    return s


def _table_options(s: argparse.ArgumentParser, *, watch: bool = True) -> None:
    s.add_argument("--sort-by", metavar="COLUMN", help="sort rows by this column (e.g. AGE)")
    if watch:
        _watch_options(s)


def _watch_options(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="keep watching: redraw in place on a terminal, append changes when piped; Ctrl-C ends",
    )
    s.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between polls with -w"
    )


DESCRIPTION = "One-shot commands for an llmgw fleet."
EPILOG = (
    "exit codes: 0 done; 1 the controller refused or could not be reached, or "
    "drain --dry-run found a model falling below its minimum; 2 usage error\n\n"
    "example:\n  llmgw ctl --controller http://ctl-1:7460 status"
)


def _remember_translations() -> None:
    """argparse translates its own words ("usage: ", "show this help message and
    exit") for each of ctl's subcommands, and gettext searches the disk for
    catalogues every time (a tenth of a one-shot): look each word up once."""
    translate = argparse._  # type: ignore[attr-defined]
    if not hasattr(translate, "cache_info"):
        argparse._ = functools.cache(translate)  # type: ignore[attr-defined]


def parser() -> argparse.ArgumentParser:
    _remember_translations()
    p = Parser(
        prog="llmgw ctl", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter
    )
    return populate(p)


def populate(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """ctl's options and commands on `p` (its own parser, or `llmgw completion`'s)."""
    _common_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    s = _sub(sub, "status", "the fleet summary", "llmgw ctl status -w")
    _watch_options(s)

    s = _sub(
        sub,
        "nodes",
        "every node with its state and reason",
        "llmgw ctl nodes --state cordoned -o wide --sort-by AGE",
    )
    s.add_argument("--state", choices=NODE_STATES, help="only nodes in this state")
    _table_options(s)

    s = _sub(
        sub,
        "node",
        "one node in detail: GPUs, storage, replicas, history; `node forget NAME` forgets it",
        "llmgw ctl node gpu-a01 -o json\nllmgw ctl node forget gpu-a01",
    )
    s.add_argument("name", metavar="NODE", help="the node, or `forget`")
    s.add_argument("target", nargs="?", metavar="NAME", help="with `forget`: the node to forget")

    s = _sub(
        sub,
        "credentials",
        "node credentials: list them, or revoke NODE's",
        "llmgw ctl credentials list\nllmgw ctl credentials revoke gpu-a01",
    )
    s.add_argument("action", choices=["list", "revoke"])
    s.add_argument("nodes", nargs="*", metavar="NODE")

    s = _sub(
        sub,
        "cordon",
        "place no new replicas on these nodes",
        'llmgw ctl cordon gpu-a03 gpu-a07 --reason "xid 79"',
    )
    s.add_argument("nodes", nargs="+", metavar="NODE")
    s.add_argument("--reason", required=True, help="why (recorded with who and when)")

    s = _sub(
        sub, "uncordon", "let these nodes take new replicas again", "llmgw ctl uncordon gpu-a03"
    )
    s.add_argument("nodes", nargs="+", metavar="NODE")

    s = _sub(
        sub,
        "drain",
        "move replicas off these nodes, then leave them cordoned",
        'llmgw ctl drain --dry-run gpu-b01 gpu-b02\nllmgw ctl drain gpu-b01 gpu-b02 --reason "PSU swap" --wait --timeout 900',
    )
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
        type=float,
        metavar="S",
        help="the controller forces the drain this many seconds from now",
    )
    s.add_argument(
        "--yes",
        action="store_true",
        help="with --force: go ahead even if a model falls below its minimum",
    )
    s.add_argument("--wait", action="store_true", help="show progress until the drain is done")
    s.add_argument("--timeout", type=float, metavar="S", help="seconds --wait waits (default 600)")

    s = _sub(
        sub,
        "apply",
        "declare models from a YAML or TOML file",
        "llmgw ctl apply -f models.yaml\ncat models.yaml | llmgw ctl apply -f -",
    )
    s.add_argument(
        "-f",
        "--file",
        required=True,
        metavar="FILE",
        help="the file; - reads standard input (YAML)",
    )

    s = _sub(sub, "models", "declared models with ready/minimum", "llmgw ctl models -o wide")
    _table_options(s)

    s = _sub(
        sub,
        "replicas",
        "every replica with its state and idleness",
        "llmgw ctl replicas --sort-by IDLE",
    )
    _table_options(s)

    s = _sub(
        sub,
        "delete",
        "delete a declared object",
        "llmgw ctl delete model meta-llama/Llama-3.1-8B-Instruct",
    )
    s.add_argument("kind", choices=["model"], help="what to delete")
    s.add_argument("name", metavar="NAME")

    s = _sub(
        sub,
        "config",
        "contexts in the config file ($XDG_CONFIG_HOME/llmgw/config.toml)",
        "llmgw ctl config get-contexts\nllmgw ctl config use-context prod\nllmgw ctl config view",
    )
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
    return p


def check_args(args: argparse.Namespace) -> None:
    """What argparse cannot say: combinations and ranges (a UsageError each)."""
    for name in ("controller", "token", "token_file", "ca_file", "context", "no_headers"):
        if not hasattr(args, name):
            setattr(args, name, None)
    if getattr(args, "output", None) is None:
        args.output = "table"
    if getattr(args, "interval", 2.0) <= 0:
        raise UsageError("--interval must be a positive number of seconds")
    if args.command == "drain":
        if args.timeout is not None and not args.wait:
            raise UsageError("--timeout applies to --wait; add --wait or drop --timeout")
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError("--timeout must be a positive number of seconds")
        if args.force_after is not None and not 0 < args.force_after <= 7 * 86400:
            raise UsageError("--force-after must be between 0 and 604800 seconds (7 days)")
        if args.yes and not args.force:
            raise UsageError("--yes confirms --force; without --force there is nothing to confirm")
        if args.dry_run and (args.wait or args.force or args.force_after is not None):
            raise UsageError("--dry-run only reports; it cannot be combined with --wait or --force")
        if not args.dry_run and (args.reason is None or not args.reason.strip()):
            raise UsageError("drain needs --reason TEXT (it is recorded with who and when)")
    if args.command == "cordon" and not args.reason.strip():
        raise UsageError("--reason must not be empty (it is recorded with who and when)")
    if args.command in ("cordon", "uncordon", "drain") and len(set(args.nodes)) != len(args.nodes):
        raise UsageError("a node is named twice")
    writes = ("cordon", "uncordon", "apply", "delete")
    if args.command in writes and args.output != "table":
        raise UsageError(f"-o/--json applies to reads; {args.command} prints one line per change")


# -- model files ---------------------------------------------------------------------


def load_specs(path: str) -> list[ModelSpec]:
    """Models from YAML or TOML (a list, or a mapping with a `models` list); - is stdin."""
    import tomllib

    import yaml
    from pydantic import ValidationError

    from llmgw.wire import ModelSpecList

    where = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    toml = path.endswith(".toml")
    try:
        data: Any = tomllib.loads(text) if toml else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{where} is not valid {'TOML' if toml else 'YAML'}: {exc}") from exc
    if isinstance(data, list):
        data = {"models": data}
    if not isinstance(data, dict) or "models" not in data:
        raise UsageError(f"{where} should hold a list of models (or a `models:` list)")
    try:
        specs = list(ModelSpecList.model_validate({"models": data["models"]}).models)
    except ValidationError as exc:
        lines = [f"{where} has invalid model specs:"]
        for e in exc.errors(include_url=False, include_input=False):
            loc = list(e["loc"])
            if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
                model = data["models"][loc[1]]
                name = model.get("name") if isinstance(model, dict) else None
                at = f"model {name or '#' + str(loc[1] + 1)}"
                loc = loc[2:]
            else:
                at = "file"
            lines.append(f"  {at}: {'.'.join(map(str, loc)) or '(entry)'}: {e['msg']}")
        raise UsageError("\n".join(lines)) from exc
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise UsageError(f"{where} declares model {spec.name} twice")
        seen.add(spec.name)
    return specs


def apply_warnings(specs: Sequence[ModelSpec], summary: dict[str, Any]) -> list[str]:
    """What no reporting node offers: applied all the same (a node may join
    later), but said, so a typo is not found an hour later as a short model."""
    classes = sorted({g["class"] for g in summary.get("gpus", []) if g.get("total")})
    engines = summary.get("engines")  # engine -> nodes whose agent has it
    warnings = []
    for spec in specs:
        if spec.gpu_class and spec.gpu_class not in classes:
            warnings.append(
                f"model {spec.name} wants GPU class {spec.gpu_class}, which no reporting node "
                f"has (classes reported: {', '.join(classes) or 'none'}); it stays short "
                "until such a node reports"
            )
        if isinstance(engines, dict) and engines and spec.engine not in engines:
            warnings.append(
                f"model {spec.name} uses engine {spec.engine!r}, which no reporting node's "
                f"agent knows (engines reported: {', '.join(sorted(engines))}); add it to "
                "the agents' --engine-templates, or fix the spec"
            )
    return warnings


# -- the commands ----------------------------------------------------------------------


class Terminal:
    """Where output goes and how it may look."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.color = self.tty and not os.environ.get("NO_COLOR")

    def width(self) -> int | None:
        """The terminal's width (COLUMNS honoured); None when piped: never cut."""
        if not self.tty:
            return None
        return terminal_columns()

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


class Ctl:
    def __init__(self, client: SyncAdminClient, args: argparse.Namespace, term: Terminal) -> None:
        self.client = client
        self.args = args
        self.term = term

    # -- output helpers

    def emit_data(self, data: Any) -> None:
        if self.args.output == "yaml":
            import yaml

            self.term.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        else:
            self.term.write(json.dumps(data, indent=2) + "\n")

    def table_text(self, table: render.Table) -> str:
        sort_by = getattr(self.args, "sort_by", None)
        if sort_by:
            try:
                table.sort_by(sort_by)
            except ValueError as exc:
                raise UsageError(str(exc)) from exc
        if not table.rows:  # as kubectl: data on stdout, the absence of it on stderr
            if not getattr(self.args, "watch", False):
                print(f"no {self.args.command} found", file=sys.stderr)
            return ""
        if self.args.output == "name":
            return render.names(table)
        return table.format(
            headers=not self.args.no_headers,
            color=self.term.color,
            width=None if self.args.output == "wide" else self.term.width(),
        )

    def _read(
        self, call: api.Call[Any], table: Callable[[Any], render.Table], *, plain: bool = False
    ) -> int:
        """`plain`: the table reads the answer's JSON objects by item, not as api.Views
        (`ctl nodes` at 2,000 rows: a View per object costs more than the reading)."""
        if self.args.output in ("json", "yaml"):
            data = self.client.json(call)
            self.emit_data(self._filter_json(data))
            return EXIT_OK
        fetch = self.client.json if plain else self.client
        if getattr(self.args, "watch", False):
            return self._watch(lambda: self.table_text(table(fetch(call))))
        self.term.write(self.table_text(table(fetch(call))))
        return EXIT_OK

    def _filter_json(self, data: Any) -> Any:
        state = getattr(self.args, "state", None)
        if state and isinstance(data, list):
            return [r for r in data if r.get("state") == state]
        return data

    def _watch(self, draw: Callable[[], str]) -> int:
        """Redraw in place on a terminal; when piped, print again only what changed."""
        last = ""
        try:
            while True:
                text = draw()
                if self.term.tty:
                    self.term.write("\x1b[H\x1b[2J" + text)
                elif text != last:
                    self.term.write(("\n" if last else "") + text)
                last = text
                time.sleep(self.args.interval)
        except KeyboardInterrupt:
            return EXIT_OK

    # -- reads

    def status(self) -> int:
        if self.args.output in ("json", "yaml"):
            self.emit_data(self.client.json(api.summary_json()))
            return EXIT_OK
        if self.args.output != "table":
            raise UsageError("status prints a summary: -o json or -o yaml, or no -o")

        def draw() -> str:
            text = render.status(
                self.client(api.summary()), self.client.base_url, color=self.term.color
            )
            return text + render.gateways(self.client(api.Call("GET", "/v1/gateways", typed=True)))

        if self.args.watch:
            return self._watch(draw)
        self.term.write(draw())
        return EXIT_OK

    def nodes(self) -> int:
        wide = self.args.output == "wide"
        if self.args.watch and self.args.output not in ("json", "yaml"):
            return self._watch_nodes(wide)
        return self._read(
            api.nodes(), lambda rows: render.nodes_table(self._only(rows), wide=wide), plain=True
        )

    def _only(self, rows: list[NodeRow]) -> list[NodeRow]:
        if self.args.state:  # rows are JSON objects: plain, or api.View
            rows = [r for r in rows if r["state"] == self.args.state]  # type: ignore[index]
        return rows

    def _watch_nodes(self, wide: bool) -> int:
        """`nodes -w` over `GET /v1/nodes?since=`: only changed rows cross the wire.

        On a terminal the table is redrawn (ages tick); when piped, the first
        table is printed whole and then each changed row on its own line, as
        `kubectl get -w` does.
        """
        rows: dict[str, Any] = {}  # name -> api.View of a NodeRow
        cursor = ""
        first = True
        try:
            while True:
                delta = self.client(api.nodes_since(cursor))
                cursor = delta.cursor
                if delta.full:
                    rows = {}
                for row in delta.nodes:
                    rows[row.name] = row
                for name in delta.removed:
                    rows.pop(name, None)
                for name, age in delta.report_ages.items():
                    if name in rows:
                        rows[name] = api.View({**rows[name], "report_age_s": age})
                ordered = [rows[n] for n in sorted(rows)]
                if self.term.tty:
                    self.term.write(
                        "\x1b[H\x1b[2J"
                        + self.table_text(render.nodes_table(self._only(ordered), wide=wide))
                    )
                elif first or delta.full:
                    self.term.write(
                        self.table_text(render.nodes_table(self._only(ordered), wide=wide))
                    )
                elif delta.nodes:
                    changed = [rows[r.name] for r in delta.nodes]
                    table = render.nodes_table(self._only(changed), wide=wide)
                    self.args.no_headers = True
                    self.term.write(self.table_text(table))
                first = False
                time.sleep(self.args.interval)
        except KeyboardInterrupt:
            return EXIT_OK

    def node(self) -> int:
        if self.args.name == "forget" and self.args.target:
            reply = self.client.json(
                api.Call("POST", f"/v1/nodes/{api.seg(self.args.target)}/forget", body={})
            )
            revoked = "; its credential is revoked" if reply.get("credential_revoked") else ""
            self.term.write(f"node {self.args.target} forgotten{revoked}\n")
            return EXIT_OK
        if self.args.output in ("json", "yaml"):
            self.emit_data(self.client.json(api.node(self.args.name)))
            return EXIT_OK
        detail = self.client(api.node(self.args.name))
        if self.args.output == "name":
            self.term.write(f"node/{detail.row.name}\n")
            return EXIT_OK
        self.term.write(render.node_detail(detail, color=self.term.color))
        return EXIT_OK

    def credentials(self) -> int:
        if self.args.action == "revoke":
            if not self.args.nodes:
                raise UsageError("credentials revoke needs at least one NODE")
            for node in self.args.nodes:
                self.client.json(api.Call("DELETE", f"/v1/credentials/{api.seg(node)}"))
                self.term.write(f"{node}: revoked\n")
            return EXIT_OK
        creds = self.client.json(api.Call("GET", "/v1/credentials"))
        if self.args.output in ("json", "yaml"):
            self.emit_data(creds)
            return EXIT_OK
        for c in creds:
            when = render.timestamp(c.get("issued_at"))
            self.term.write(f"{c['node']:<32} {c['source']:<9} {when:<20} {c.get('by') or '-'}\n")
        return EXIT_OK

    def models(self) -> int:
        wide = self.args.output == "wide"
        return self._read(api.models(), lambda ms: render.models_table(ms, wide=wide))

    def replicas(self) -> int:
        wide = self.args.output == "wide"
        return self._read(api.replicas(), lambda rs: render.replicas_table(rs, wide=wide))

    # -- writes

    def cordon(self) -> int:
        reason = self.args.reason.strip()
        before = {r.name: r for r in self.client(api.nodes())}
        code = EXIT_OK
        for node in self.args.nodes:
            try:
                self.client(api.cordon(node, reason))
            except ControllerError as exc:
                if isinstance(exc, NotAController):
                    raise
                self._fail(node, exc)
                code = EXIT_CONTROLLER
                continue
            old = before.get(node)
            if old is not None and old.admin.flag != "none" and old.admin.reason != reason:
                was = render.clean(old.admin.reason or "")
                self.term.write(
                    f"{node} cordoned; reason replaced: {was!r} -> {render.clean(reason)!r}\n"
                )
            else:
                self.term.write(f"{node} cordoned\n")
        return code

    def uncordon(self) -> int:
        return self._each(self.args.nodes, api.uncordon, "uncordoned")

    def drain(self) -> int:
        a = self.args
        if a.dry_run:
            if a.output in ("json", "yaml"):
                data = self.client.json(api.drain_plan_json(a.nodes))
                self.emit_data(data)
                short = [i for i in data.get("impacts", []) if i.get("verdict") == "below_minimum"]
            else:
                plan = self.client(api.drain_plan(a.nodes))
                self.term.write(render.drain_plan(plan, color=self.term.color))
                short = [i for i in plan.impacts if i.verdict == "below_minimum"]
            return EXIT_CONTROLLER if short else EXIT_OK
        if a.force and not a.yes:
            plan = self.client(api.drain_plan(a.nodes))
            below = [i for i in plan.impacts if i.verdict == "below_minimum"]
            if below:
                self.term.write(render.drain_plan(plan, color=self.term.color))
                raise UsageError(
                    "--force would drop "
                    + ", ".join(f"{i.model} below its minimum ({i.min_replicas})" for i in below)
                    + "; add --yes to go ahead anyway"
                )
        code = self._each(
            a.nodes,
            lambda n: api.drain(n, a.reason.strip(), force=a.force, force_after_s=a.force_after),
            "draining",
        )
        if code == EXIT_OK and a.wait:
            return self.wait_drained(a.nodes, limit_s=600.0 if a.timeout is None else a.timeout)
        return code

    def wait_drained(self, nodes: list[str], *, limit_s: float) -> int:
        """One progress line (rewritten on a terminal), then one summary."""
        from llmgw.drain_progress import DrainProgress

        progress = DrainProgress(nodes)
        started = time.monotonic()
        cursor = ""
        rows: dict[str, NodeRow] = {}
        last = ""
        while True:
            delta = self.client(api.nodes_since(cursor))
            cursor = delta.cursor
            rows.update({r.name: r for r in delta.nodes if r.name in progress.wanted})
            line = progress.line(rows)
            if self.term.tty:
                self.term.write("\r\x1b[K" + line)
            elif line != last:
                self.term.write(line + "\n")
            last = line
            elapsed = time.monotonic() - started
            if progress.done(rows):
                self.term.write(("\n" if self.term.tty else "") + progress.summary(rows, elapsed))
                return EXIT_OK
            if elapsed >= limit_s:
                self.term.write(("\n" if self.term.tty else "") + progress.timed_out(rows, limit_s))
                return EXIT_CONTROLLER
            time.sleep(min(1.0, max(limit_s - elapsed, 0.05)))

    def apply(self) -> int:
        specs = load_specs(self.args.file)
        for v in self.client(api.apply_models(specs)):
            self.term.write(
                f"model {v.spec.name} applied (ready {v.ready}/{v.spec.min_replicas})\n"
            )
        for warning in apply_warnings(specs, self.client.json(api.summary_json())):
            print(f"llmgw ctl: warning: {warning}", file=sys.stderr)
        return EXIT_OK

    def delete(self) -> int:
        self.client(api.delete_model(self.args.name))
        self.term.write(f"model {self.args.name} deleted; its replicas are being stopped\n")
        return EXIT_OK

    def _each(self, nodes: list[str], call: Callable[[str], api.Call[Any]], done: str) -> int:
        """Apply to every node; report each failure and go on with the others."""
        code = EXIT_OK
        for node in nodes:
            try:
                self.client(call(node))
            except ControllerError as exc:
                if isinstance(exc, NotAController):
                    raise
                self._fail(node, exc)
                code = EXIT_CONTROLLER
            else:
                self.term.write(f"{node} {done}\n")
        return code

    def _fail(self, node: str, exc: ControllerError) -> None:
        print(f"llmgw ctl: {node}: {explain(exc)}", file=sys.stderr)


# -- config --------------------------------------------------------------------------


def config_command(args: argparse.Namespace, term: Terminal) -> int:
    from llmgw.config import ConfigFile, config_path

    path = config_path()
    file = ConfigFile.load(path)
    if args.config_command == "get-contexts":
        table = render.Table(["CURRENT", "NAME", "CONTROLLER", "TOKEN-FILE", "CA-FILE"])
        current = os.environ.get("LLMGW_CONTEXT") or file.current
        for name, ctx in sorted(file.contexts.items()):
            urls = ctx.get("controllers", ctx.get("controller", "-"))
            table.add(
                f"context/{name}",
                "*" if name == current else "",
                name,
                ",".join(urls) if isinstance(urls, list) else str(urls),
                str(ctx.get("token-file", "-")),
                str(ctx.get("ca-file", "-")),
            )
        if not table.rows:
            term.write(f"no contexts in {path}\n")
            return EXIT_OK
        term.write(table.format(headers=not args.no_headers, color=term.color))
        return EXIT_OK
    if args.config_command == "use-context":
        path.parent.mkdir(parents=True, exist_ok=True)
        file.set_current(args.name)
        term.write(f"current context: {args.name} (in {path})\n")
        return EXIT_OK
    resolved = resolve_args(args)
    if args.output in ("json", "yaml"):
        data = {
            "config-file": str(path),
            **{k: {"value": v.value, "source": v.source} for k, v in resolved.sources.items()},
        }
        text = json.dumps(data, indent=2) + "\n"
        if args.output == "yaml":
            import yaml

            text = yaml.safe_dump(data, sort_keys=False)
        term.write(text)
        return EXIT_OK
    table = render.Table(["SETTING", "VALUE", "FROM"])
    table.add("config-file", "config-file", str(path), "exists" if path.exists() else "absent")
    for key, setting in resolved.sources.items():
        value = setting.value
        shown = (
            ",".join(value) if isinstance(value, list) else ("-" if value is None else str(value))
        )
        table.add(key, key, shown, setting.source)
    term.write(table.format(headers=not args.no_headers, color=term.color))
    return EXIT_OK


def resolve_args(args: argparse.Namespace) -> Resolved:
    return resolve(
        controller=args.controller,
        token=args.token,
        token_file=args.token_file,
        ca_file=args.ca_file,
        context=args.context,
    )


def main(argv: Sequence[str]) -> int:
    import gc

    # A one-shot frees everything at exit: the collector would only walk the
    # 2,000-row listing's objects again and again as they are made (a tenth of
    # `ctl nodes`). Commands that keep running (--watch, drain --wait) collect.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(argv, collecting)
    finally:
        if collecting:
            gc.enable()


def _run(argv: Sequence[str], collecting: bool) -> int:
    args = parser().parse_args(list(argv))
    if collecting and (getattr(args, "watch", False) or getattr(args, "wait", False)):
        import gc

        gc.enable()
    term = Terminal()
    try:
        check_args(args)
        if args.command == "config":
            return config_command(args, term)
        resolved = resolve_args(args)
        from llmgw.sync_client import SyncAdminClient

        with SyncAdminClient(
            resolved.controllers, resolved.token, user=_login(), ca_file=resolved.ca_file
        ) as client:
            handler: Callable[[], int] = getattr(Ctl(client, args, term), args.command)
            return handler()
    except ClientError as exc:
        print(f"llmgw ctl: {explain(exc)}", file=sys.stderr)
        return advice(exc).exit_code
    except BrokenPipeError:  # `ctl nodes | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


def _login() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return "unknown"
