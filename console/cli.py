"""`llmgw console`: options, then run the app."""

from __future__ import annotations

import argparse
import sys

from llmgw.client import AdminClient
from llmgw.common import HelpWithExamples, UsageError, examples
from llmgw.config import resolve
from llmgw.durations import duration_arg
from llmgw.identity import operator_name
from llmgw.tls import TlsConfigError


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw console",
        description="Live fleet console: nodes, GPUs, fabrics, weights; cordon and drain. "
        "Press ? in the console for its keys.",
        epilog=examples(
            "llmgw console --controller https://ctl:7460 --token-file ~/.config/llmgw/admin.token",
            "llmgw console --readonly     # look, don't touch",
        ),
        formatter_class=HelpWithExamples,
    )
    parser.add_argument(
        "--controller",
        metavar="URL[,URL]",
        default=None,
        help="controller admin API, or several (the console follows the one that leads; "
        "default: $LLMGW_CONTROLLER or http://127.0.0.1:7460)",
    )
    parser.add_argument(
        "--token", metavar="T", default=None, help="admin token (default: $LLMGW_TOKEN)"
    )
    parser.add_argument(
        "--ca-file",
        metavar="F",
        default=None,
        help="CA certificate to verify an https controller (default: $LLMGW_CA_FILE)",
    )
    parser.add_argument(
        "--context", default=None, help="context from the config file (env LLMGW_CONTEXT)"
    )
    parser.add_argument("--token-file", metavar="FILE", default=None, help="file holding the token")
    parser.add_argument(
        "--readonly",
        action="store_true",
        help="look, don't touch: no cordon, uncordon or drain keys at all",
    )
    parser.add_argument(
        "--refresh",
        metavar="DURATION",
        type=duration_arg,
        default=1.0,
        help="poll interval (default 1s; changes show within about twice this)",
    )
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.refresh <= 0:
        p.error("--refresh must be a positive duration (0.5, 2s, 1m)")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from llmgw.console.app import ConsoleApp  # Textual loads only when we really run

    try:  # the same resolution as `llmgw ctl` (flags, environment, config file)
        where = resolve(
            controller=args.controller,
            token=args.token,
            token_file=args.token_file,
            ca_file=args.ca_file,
            context=args.context,
        )
        client = AdminClient(
            where.controllers, where.token, user=operator_name(), ca_file=where.ca_file
        )
    except (UsageError, TlsConfigError) as exc:
        sys.stderr.write(f"llmgw console: {exc}\n")
        return 2
    app = ConsoleApp(client, readonly=args.readonly, refresh=args.refresh)
    app.run()
    return app.return_code or 0
