"""Where ctl's output goes and how it looks: tables (sorted, cut to the terminal,
or names), JSON and YAML."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from llmgw import render
from llmgw.ctl.parser import terminal_columns, terminal_lines
from llmgw.errors import UsageError


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

    def height(self) -> int | None:
        """The terminal's height (LINES honoured); None when piped."""
        if not self.tty:
            return None
        return terminal_lines()

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


class Output:
    """One command's output, as its options ask (-o, --sort-by, --no-headers)."""

    def __init__(self, term: Terminal, args: argparse.Namespace) -> None:
        self.term = term
        self.args = args

    def data(self, data: Any) -> None:
        """-o json or -o yaml: the answer as served."""
        if self.args.output == "yaml":
            import yaml

            self.term.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        else:
            self.term.write(json.dumps(data, indent=2) + "\n")

    def table(self, table: render.Table, *, headers: bool = True) -> str:
        sort_by = getattr(self.args, "sort_by", None)
        if sort_by:
            try:
                table.sort_by(sort_by)
            except ValueError as exc:
                raise UsageError(str(exc)) from exc
        if not table.rows:  # as kubectl: data on stdout, the absence of it on stderr
            # (nodes named and not found are said each by name)
            if not self.args.watch and not getattr(self.args, "names", None):
                print(f"no {self.args.command} found", file=sys.stderr)
            return ""
        if self.args.output == "name":
            return render.names(table)
        return table.format(
            headers=headers and not self.args.no_headers,
            color=self.term.color,
            width=None if self.args.output == "wide" else self.term.width(),
        )
