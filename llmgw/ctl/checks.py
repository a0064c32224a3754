"""What argparse cannot check: combinations of options and their ranges."""

from __future__ import annotations

import argparse

from llmgw.ctl.parser import SORTS, WAIT_INTERVAL_S, WAITS, WATCH_INTERVAL_S, WATCHES
from llmgw.errors import UsageError


def check_args(args: argparse.Namespace) -> None:
    """What argparse cannot say: combinations and ranges (a UsageError each)."""
    # Options a command does not list are absent from its namespace: give them one meaning.
    for name in ("controller", "token", "token_file", "ca_file", "context", "sort_by"):
        setattr(args, name, getattr(args, name, None))
    for name in ("no_headers", "watch"):
        setattr(args, name, bool(getattr(args, name, False)))
    if getattr(args, "output", None) is None:
        args.output = "table"
    # One meaning wherever it is written: the time between polls of -w or --wait.
    interval = getattr(args, "interval", None)
    waits = args.command in WAITS and args.wait
    if interval is not None and not (args.watch or waits):
        raise UsageError(
            "--interval applies to -w (and to drain --wait, rollout status --wait); "
            "add one or drop --interval"
        )
    if interval is None:
        interval = WAIT_INTERVAL_S if waits else WATCH_INTERVAL_S
    args.interval = interval
    if args.interval <= 0:
        raise UsageError("--interval must be a positive duration (0.5, 2s, 1m)")
    _check_output_options(args)
    _check_names(args)
    if args.command == "drain":
        if args.timeout is not None and not args.wait:
            raise UsageError("--timeout applies to --wait; add --wait or drop --timeout")
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError("--timeout must be a positive duration")
        if args.force_after is not None and not 0 < args.force_after <= 7 * 86400:
            raise UsageError("--force-after must be more than 0s and at most 7d")
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
    if args.command == "credentials":
        _check_credentials(args)
    if args.command == "keys":
        _check_keys(args)
    if args.command == "limits":
        _check_limits(args)
    if args.output == "csv" and args.command != "usage":
        raise UsageError("-o csv applies to usage")
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


def _check_credentials(args: argparse.Namespace) -> None:
    """Which words and options each credentials action takes."""
    action, words = args.action, args.nodes
    if action in ("revoke", "approve", "allow") and not words:
        raise UsageError(f"credentials {action} needs at least one NODE")
    if action == "list" and words:
        raise UsageError("credentials list takes no NODE (to revoke: credentials revoke NODE)")
    if args.allow_enroll and action != "revoke":
        raise UsageError("--allow-enroll applies to `credentials revoke`")
    verb, ids = (words[0], words[1:]) if action == "token" and words else ("list", [])
    if action == "token" and not (
        (verb == "create" and not ids) or (verb == "delete" and ids) or (verb == "list" and not ids)
    ):
        raise UsageError(
            "credentials token takes: create [--ttl D] [--uses N] [--description TEXT], "
            "list, or delete ID..."
        )
    creating = action == "token" and verb == "create"
    for option, value in (
        ("--ttl", args.ttl),
        ("--uses", args.uses),
        ("--description", args.description),
    ):
        if value is not None and not creating:
            raise UsageError(f"{option} applies to `credentials token create`")
    if args.uses is not None and args.uses < 1:
        raise UsageError("--uses must be at least 1 (leave it out for no limit)")


def _check_output_options(args: argparse.Namespace) -> None:
    """An option given before the command that the command has no use for is
    refused, never silently ignored."""
    command = args.command
    tables = command in SORTS and not (command == "rollout" and args.action != "history")
    if args.sort_by is not None and not tables:
        raise UsageError(f"--sort-by applies to tables ({', '.join(SORTS[:-1])}, rollout history)")
    headers = tables or (command == "config" and args.config_command != "current-context")
    if args.no_headers and not headers:
        raise UsageError(
            f"--no-headers applies to tables; {command} prints no header line to leave out"
        )
    if args.watch and command not in WATCHES:
        raise UsageError(f"-w applies to {', '.join(WATCHES)}")


def _check_keys(args: argparse.Namespace) -> None:
    if args.action != "create" and (args.tenant or args.models or args.expires is not None):
        raise UsageError("--tenant, --models and --expires go with `keys create`")
    if args.action == "create":
        if not args.tenant:
            raise UsageError("keys create needs --tenant NAME")
        if args.ids:
            raise UsageError("keys create takes no ID")
        if args.expires is not None and args.expires <= 0:
            raise UsageError("--expires must be a positive duration (leave it out: never)")
    elif args.action == "revoke" and not args.ids:
        raise UsageError("keys revoke needs the ID of each key (llmgw ctl keys list)")
    elif args.action == "list" and args.ids:
        raise UsageError("keys list takes no ID")


def _check_limits(args: argparse.Namespace) -> None:
    kinds = {"--rpm": args.rpm, "--tpm": args.tpm, "--budget": args.budget, "--per": args.per}
    if args.action == "list":
        if args.tenant or args.model or any(v is not None for v in kinds.values()):
            raise UsageError("limits list takes no TENANT and no option")
        return
    if not args.tenant:
        raise UsageError(f"limits {args.action} needs a TENANT")
    if args.action == "delete":
        if any(v is not None for v in kinds.values()):
            raise UsageError("limits delete takes TENANT [--model M] only")
        return
    if all(v is None for v in kinds.values()):
        raise UsageError("limits set needs --rpm N, --tpm N or --budget TOKENS --per day|month")
    if (args.budget is None) != (args.per is None):
        raise UsageError("--budget TOKENS goes with --per day|month")
    for option in ("--rpm", "--tpm", "--budget"):
        value = kinds[option]
        if value is not None and value < 1:
            raise UsageError(f"{option} must be at least 1 (to lift a limit: limits delete)")


def _check_names(args: argparse.Namespace) -> None:
    """Names as `-o name` prints them (node/gpu-a01, model/org/name) are taken
    back where a node or a model is expected; the wrong kind is refused."""
    command = args.command
    if command in ("cordon", "uncordon", "drain", "credentials"):
        args.nodes = [node_name(n, command) for n in args.nodes]
    elif command == "nodes":
        args.names = [node_name(n, command) for n in args.names]
    elif command == "node":
        if args.name == "forget" and args.target:
            args.target = node_name(args.target, "node forget")
        else:
            args.name = node_name(args.name, command)
            if args.target is not None:
                raise UsageError(
                    f"node shows one node; for a row each: llmgw ctl nodes {args.name} {args.target}"
                )
    elif command == "rollout":
        args.model = model_name(args.model, f"rollout {args.action}")
    elif command == "delete":
        kind, _, rest = args.kind.partition("/")
        if kind != "model":
            raise UsageError(f"delete takes model NAME or model/NAME, not {args.kind!r}")
        if rest and args.name is not None:
            raise UsageError(f"delete takes model NAME or model/NAME, not both ({args.kind!r})")
        if not rest and args.name is None:
            raise UsageError("delete model needs the model's NAME")
        args.name = rest or model_name(args.name, "delete model")


# The kinds `-o name` prints: a refusal names the one it was given.
_KINDS = ("node", "model", "replica", "event", "revision", "gateway", "context")


def node_name(text: str, command: str) -> str:
    """NAME or node/NAME; a node name never holds `/`, so any other kind is refused."""
    kind, slash, name = text.partition("/")
    if not slash:
        return text
    if kind == "node" and name and "/" not in name:
        return name
    what = f"{text} is a {kind}" if kind in _KINDS and name else f"{text!r} is not a node name"
    raise UsageError(f"{command} takes nodes (NAME or node/NAME); {what}")


def model_name(text: str, command: str) -> str:
    """NAME or model/NAME (a model whose name starts with `model/` is given as model/model/...);
    a node or a replica where a model is expected is refused."""
    kind, slash, name = text.partition("/")
    if slash and kind == "model" and name:
        return name
    if slash and kind in ("node", "replica") and name:
        raise UsageError(f"{command} takes a model (NAME or model/NAME); {text} is a {kind}")
    return text
