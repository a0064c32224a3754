"""`llmgw ctl`'s entry: parse, check, run one command, and turn what went wrong
into one line on stderr and an exit code (llmgw.errors.ADVICE: 0 done; 1 the
controller refused or could not be reached; 2 a usage error; 130 Ctrl-C)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from llmgw.ctl.checks import check_args
from llmgw.ctl.output import Terminal
from llmgw.ctl.parser import parser
from llmgw.errors import EXIT_OK, ClientError, advice, explain

EXIT_INTERRUPTED = 130  # as a shell says of a command ended by SIGINT


def main(argv: Sequence[str]) -> int:
    import gc

    # A one-shot frees everything at exit: the collector would only walk the
    # 2,000-row listing's objects again and again as they are made (a tenth of
    # `ctl nodes`). Commands that keep running (--watch, drain --wait) collect.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(list(argv), collecting)
    finally:
        if collecting:
            gc.enable()


def _run(argv: list[str], collecting: bool) -> int:
    args = parser(argv).parse_args(argv)
    if collecting and (getattr(args, "watch", False) or getattr(args, "wait", False)):
        import gc

        gc.enable()
    term = Terminal()
    try:
        check_args(args)
        if args.command == "config":
            from llmgw.ctl.contexts import config_command

            return config_command(args, term)
        from llmgw.ctl.commands import Ctl
        from llmgw.ctl.contexts import resolve_args
        from llmgw.identity import operator_name
        from llmgw.sync_client import SyncAdminClient

        resolved = resolve_args(args)
        with SyncAdminClient(
            resolved.controllers, resolved.token, user=operator_name(), ca_file=resolved.ca_file
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
        return EXIT_INTERRUPTED
