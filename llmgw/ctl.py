"""`llmgw ctl`: one-shot commands against the controller's admin API.

Exit codes: 0 success, 1 the controller refused or could not be reached,
2 a usage error (argparse's own convention).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
import time
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Console

from llmgw import render
from llmgw.client import AdminClient, ControllerError, ControllerUnreachable, controller_url
from llmgw.wire import DrainPlan, ModelSpec, ModelSpecList

EXIT_OK, EXIT_CONTROLLER, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw ctl", description="One-shot commands for an llmgw fleet."
    )
    p.add_argument(
        "--controller", help="controller URL (env LLMGW_CONTROLLER, default http://127.0.0.1:7460)"
    )
    p.add_argument("--token", help="bearer token (env LLMGW_TOKEN)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("status", help="the fleet summary")
    s.add_argument("--json", action="store_true", help="print the summary JSON as served")

    s = sub.add_parser("nodes", help="every node with its state and reason")
    s.add_argument("--json", action="store_true")
    s.add_argument(
        "--state", help="only nodes in this state (ready, cordoned, draining, unreachable)"
    )

    s = sub.add_parser("node", help="one node in detail (JSON)")
    s.add_argument("name")

    s = sub.add_parser("cordon", help="place no new replicas on these nodes")
    s.add_argument("nodes", nargs="+", metavar="NODE")
    s.add_argument("--reason", required=True, help="why (recorded with who and when)")

    s = sub.add_parser("uncordon", help="let these nodes take new replicas again")
    s.add_argument("nodes", nargs="+", metavar="NODE")

    s = sub.add_parser("drain", help="move replicas off these nodes, then leave them cordoned")
    s.add_argument("nodes", nargs="+", metavar="NODE")
    s.add_argument("--reason", help="why (required unless --dry-run)")
    s.add_argument(
        "--dry-run", action="store_true", help="only say what draining would do to each model"
    )
    s.add_argument(
        "--force", action="store_true", help="stop replicas without waiting for replacements"
    )
    s.add_argument(
        "--force-after",
        type=float,
        metavar="SECONDS",
        help="force the drain if it is not done after SECONDS (kept and enforced by the"
        " controller, whoever is connected; at most 7 days)",
    )
    s.add_argument("--wait", action="store_true", help="show progress until the drain is done")
    s.add_argument(
        "--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)"
    )

    s = sub.add_parser("apply", help="declare models from a YAML or TOML file")
    s.add_argument("-f", "--file", required=True, type=Path)

    s = sub.add_parser("models", help="declared models with ready/minimum")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("replicas", help="every replica with its state and idleness")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("delete", help="delete a declared object")
    s.add_argument("kind", choices=["model"])
    s.add_argument("name")
    return p


def load_specs(path: Path) -> list[ModelSpec]:
    """Models from YAML or TOML: a list, or a mapping with a `models` list."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise UsageError(
            f"{path} is not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {exc}"
        ) from exc
    if isinstance(data, list):
        data = {"models": data}
    if not isinstance(data, dict) or "models" not in data:
        raise UsageError(f"{path} should hold a list of models (or a `models:` list)")
    try:
        return list(ModelSpecList.model_validate({"models": data["models"]}).models)
    except ValidationError as exc:
        lines = [f"{path} has invalid model specs:"]
        for e in exc.errors(include_url=False, include_input=False):
            loc = list(e["loc"])
            if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
                model = data["models"][loc[1]]
                name = model.get("name") if isinstance(model, dict) else None
                where = f"model {name or '#' + str(loc[1] + 1)}"
                loc = loc[2:]
            else:
                where = "file"
            lines.append(f"  {where}: {'.'.join(map(str, loc)) or '(entry)'}: {e['msg']}")
        raise UsageError("\n".join(lines)) from exc


class Ctl:
    def __init__(self, client: AdminClient, out: Console) -> None:
        self.client = client
        self.out = out

    def print_json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")

    async def status(self, args: argparse.Namespace) -> int:
        if args.json:
            self.print_json(await self.client.summary_json())
            return EXIT_OK
        summary = await self.client.summary()
        self.out.print(render.status(summary, self.client.base_url))
        gateways = await self.client.gateways()
        if gateways:
            self.out.print(render.gateways_table(gateways))
        return EXIT_OK

    async def nodes(self, args: argparse.Namespace) -> int:
        rows = await self.client.nodes()
        if args.state:
            rows = [r for r in rows if r.state.value == args.state]
        if args.json:
            self.print_json([r.model_dump(mode="json") for r in rows])
        else:
            self.out.print(render.nodes_table(rows))
        return EXIT_OK

    async def node(self, args: argparse.Namespace) -> int:
        self.print_json((await self.client.node(args.name)).model_dump(mode="json"))
        return EXIT_OK

    async def cordon(self, args: argparse.Namespace) -> int:
        return await self._each(
            args.nodes, lambda n: self.client.cordon(n, args.reason), "cordoned"
        )

    async def uncordon(self, args: argparse.Namespace) -> int:
        return await self._each(args.nodes, self.client.uncordon, "uncordoned")

    async def drain(self, args: argparse.Namespace) -> int:
        if args.dry_run:
            plan = DrainPlan.model_validate(await self.client.drain_plan(args.nodes))
            self.print_plan(plan)
            return EXIT_OK
        if not args.reason or not args.reason.strip():
            raise UsageError("drain needs --reason TEXT (it is recorded with who and when)")
        after = args.force_after
        if after is not None and not 0 < after <= 7 * 86_400:
            raise UsageError("--force-after wants SECONDS between 0 and 604800 (7 days)")
        code = await self._each(
            args.nodes,
            lambda n: self.client.drain(n, args.reason, force=args.force, force_after_s=after),
            "draining",
        )
        if code == EXIT_OK and args.wait:
            return await self.wait_drained(args.nodes, limit_s=args.timeout)
        return code

    def print_plan(self, plan: DrainPlan) -> None:
        self.out.print(
            f"Draining {render.hostlist(plan.nodes)} moves {plan.replicas_to_move} replica(s)."
        )
        for impact in plan.impacts:
            style = {"ok": "green", "below_minimum": "yellow"}.get(impact.verdict, "red")
            line = (
                f"  [{style}]{impact.verdict:<14}[/] {impact.model}: {impact.replicas_on_nodes} to move, "
                f"{impact.replaceable} can be placed elsewhere, ready {impact.ready_now}/{impact.min_replicas}"
            )
            if impact.reason:
                line += f" ({impact.reason})"
            self.out.print(line)

    async def wait_drained(self, nodes: list[str], *, limit_s: float) -> int:
        deadline = time.monotonic() + limit_s
        last = ""
        while True:
            rows = {r.name: r for r in await self.client.nodes() if r.name in nodes}
            pending = [r for r in rows.values() if not r.admin.drained]
            line = ", ".join(
                f"{r.name}: {r.replicas} replica(s) left"
                + (f" ({r.drain_blocked})" if r.drain_blocked else "")
                for r in pending
            )
            if not pending:
                self.out.print(f"drained: {render.hostlist(nodes)}")
                return EXIT_OK
            if line != last:
                self.out.print(line)
                last = line
            if time.monotonic() >= deadline:
                self.out.print(
                    f"[red]timed out after {limit_s:.0f}s[/]; the drain goes on in the controller"
                )
                return EXIT_CONTROLLER
            await asyncio.sleep(1.0)

    async def apply(self, args: argparse.Namespace) -> int:
        specs = load_specs(args.file)
        views = await self.client.apply_models(specs)
        for v in views:
            self.out.print(f"model {v.spec.name} applied (ready {v.ready}/{v.spec.min_replicas})")
        return EXIT_OK

    async def models(self, args: argparse.Namespace) -> int:
        models = await self.client.models()
        if args.json:
            self.print_json([m.model_dump(mode="json") for m in models])
        else:
            self.out.print(render.models_table(models))
        return EXIT_OK

    async def replicas(self, args: argparse.Namespace) -> int:
        replicas = await self.client.replicas()
        if args.json:
            self.print_json([r.model_dump(mode="json") for r in replicas])
        else:
            self.out.print(render.replicas_table(replicas))
        return EXIT_OK

    async def delete(self, args: argparse.Namespace) -> int:
        await self.client.delete_model(args.name)
        self.out.print(f"model {args.name} deleted; its replicas are being stopped")
        return EXIT_OK

    async def _each(
        self, nodes: list[str], action: Callable[[str], Awaitable[Any]], done: str
    ) -> int:
        """Apply to every node; report each failure and go on with the others."""
        code = EXIT_OK
        for node in nodes:
            try:
                await action(node)
            except ControllerError as exc:
                print(f"llmgw ctl: {node}: {exc.message}", file=sys.stderr)
                code = EXIT_CONTROLLER
            else:
                self.out.print(f"{node} {done}")
        return code


async def run(args: argparse.Namespace) -> int:
    # Piped output (grep, less) gets full-width tables rather than 80 columns.
    out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    async with AdminClient(args.controller, args.token, user=_login()) as client:
        handler: Callable[[argparse.Namespace], Awaitable[int]] = getattr(
            Ctl(client, out), args.command
        )
        return await handler(args)


def _login() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return "unknown"


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        return asyncio.run(run(args))
    except UsageError as exc:
        print(f"llmgw ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ControllerUnreachable as exc:
        print(
            f"llmgw ctl: cannot reach the controller at {controller_url(args.controller)}: {_cause(exc)}",
            file=sys.stderr,
        )
        return EXIT_CONTROLLER
    except ControllerError as exc:
        print(f"llmgw ctl: {exc.message}", file=sys.stderr)
        return EXIT_CONTROLLER


def _cause(exc: ControllerUnreachable) -> str:
    text = str(exc.cause) or type(exc.cause).__name__
    return text.splitlines()[0]
