"""What argparse cannot check: combinations of options and their ranges."""

from __future__ import annotations

import argparse

from llmgw.errors import UsageError


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
        if args.yes and not (args.force or args.force_after is not None):
            raise UsageError(
                "--yes confirms --force or --force-after; without either there is nothing to confirm"
            )
        if args.dry_run and (args.wait or args.force or args.force_after is not None):
            raise UsageError("--dry-run only reports; it cannot be combined with --wait or --force")
        if not args.dry_run and (args.reason is None or not args.reason.strip()):
            raise UsageError("drain needs --reason TEXT (it is recorded with who and when)")
    if args.command == "cordon" and not args.reason.strip():
        raise UsageError("--reason must not be empty (it is recorded with who and when)")
    if args.command in ("cordon", "uncordon", "drain") and len(set(args.nodes)) != len(args.nodes):
        raise UsageError("a node is named twice")
    if args.command == "rollout":
        if args.action != "status" and (args.wait or args.timeout is not None):
            raise UsageError("--wait and --timeout apply to `rollout status`")
        if args.timeout is not None and not args.wait:
            raise UsageError("--timeout applies to --wait; add --wait or drop --timeout")
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError("--timeout must be a positive duration")
        if args.to_revision is not None and args.action != "undo":
            raise UsageError("--to-revision applies to `rollout undo`")
        if args.to_revision is not None and args.to_revision < 1:
            raise UsageError("--to-revision must be 1 or more")
        if args.action != "history" and args.output not in ("table", "json", "yaml"):
            raise UsageError(f"rollout {args.action} prints one line: -o json or -o yaml, or no -o")
    if args.command == "events":
        obj = args.object
        if obj is not None and (
            not obj.startswith(("node/", "model/")) or obj.endswith("/") or len(obj) > 512
        ):
            raise UsageError(f"--for wants node/NAME or model/NAME, got {obj!r}")
        if args.output in ("wide", "name") and args.watch:
            raise UsageError("events -w prints the table; -o json or yaml print each event")
    writes = ("cordon", "uncordon", "apply", "delete")
    if args.command in writes and args.output != "table":
        raise UsageError(f"-o/--json applies to reads; {args.command} prints one line per change")
