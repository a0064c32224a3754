"""`ctl config`: the contexts in the config file, and which setting comes from where."""

from __future__ import annotations

import argparse
import json
import os
import sys

from llmgw import render
from llmgw.config import Resolved, resolve
from llmgw.ctl.output import Terminal
from llmgw.errors import EXIT_FAILED, EXIT_OK


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
    if args.config_command == "current-context":
        current = args.context or os.environ.get("LLMGW_CONTEXT") or file.current
        if current is None:
            print(
                f"llmgw ctl: no current context in {path}; set one with "
                "`llmgw ctl config use-context NAME`",
                file=sys.stderr,
            )
            return EXIT_FAILED
        term.write(f"{current}\n")
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
