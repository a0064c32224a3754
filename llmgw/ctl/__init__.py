"""`llmgw ctl`: one-shot commands against the controller's admin API.

Built to start fast (a one-shot is run in loops and scripts): the blocking
stdlib client, no asyncio, no httpx, no rich; pydantic models are built on
first use; the parser is built for the one command asked. Output follows
kubectl: `-o json|yaml|wide|name`, `--no-headers`, `--sort-by`, `-w`; piped
output has no colour and nothing cut, one line per row.

One job per module:

    parser      the command line (argparse)
    checks      what argparse cannot check: combinations and ranges
    modelfile   models from a YAML or TOML file
    output      the terminal: tables, -o json|yaml|name, colour
    commands    one method per command, reads and writes
    watch       -w and drain --wait: the loops that keep running
    contexts    ctl config: contexts in the config file
    main        parse, check, run; an error's line and exit code (llmgw.errors)
"""

from __future__ import annotations

from llmgw.ctl.main import main
from llmgw.ctl.parser import parser, populate

__all__ = ["main", "parser", "populate"]
