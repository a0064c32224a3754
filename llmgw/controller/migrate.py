"""`llmgw controller migrate`: copy a fleet's durable state into an empty store."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from llmgw.common import HelpWithExamples, examples
from llmgw.controller.store import (
    STATE_FILE,
    StateError,
    StateStore,
    StoreSpec,
    StoreUnavailable,
    describe,
    open_store,
    parse_store,
)

__all__ = ["migrate"]


def migrate(argv: list[str]) -> int:
    """`llmgw controller migrate --from STORE --to STORE`: copy a fleet's durable state
    into an empty store (stop the controller first)."""
    p = argparse.ArgumentParser(
        prog="llmgw controller migrate",
        description="Copy durable state (cordons, history, models and their revisions, "
        "replicas, backoffs, decision events, node credentials, enrollment tokens and "
        "allowances) from one store to another, empty one. Stop the controller first.",
        epilog=examples(
            "llmgw controller migrate --from sqlite:/var/lib/llmgw --to postgresql://llmgw@db/llmgw"
        ),
        formatter_class=HelpWithExamples,
    )
    p.add_argument("--from", dest="source", required=True, help="sqlite:DIR or postgresql://...")
    p.add_argument("--to", dest="target", required=True, help="sqlite:DIR or postgresql://...")
    args = p.parse_args(argv)
    try:
        source_spec, target_spec = parse_store(args.source), parse_store(args.target)
        if source_spec[0] == "sqlite" and not (Path(source_spec[1]) / STATE_FILE).exists():
            raise StateError(
                f"no state to copy: {Path(source_spec[1]) / STATE_FILE} does not exist"
            )
        source = open_store(source_spec)
        state = source.dump()
        source.close()
        target = open_store(target_spec)
        if not target.dump().empty():
            target.close()
            raise StateError(
                f"{describe(target_spec)} already holds state: migrate copies only into an empty store"
            )
        with _leading(target, target_spec):
            target.load(state)
        target.close()
    except (ValueError, StateError, StoreUnavailable) as exc:
        print(f"llmgw controller migrate: {exc}", file=sys.stderr)
        return 2
    print(f"copied {state.counts()} from {describe(source_spec)} to {describe(target_spec)}")
    return 0


@contextlib.contextmanager
def _leading(store: StateStore, spec: StoreSpec) -> Iterator[None]:
    """`migrate` writes a PostgreSQL store as its leader would: holding the lease
    (refused while a controller leads it), released when done."""
    if spec[0] != "postgresql":
        yield
        return
    from llmgw.controller.store.postgres import PgLease, new_holder

    lease = PgLease(
        spec[1], holder=new_holder(), advertise_url="llmgw controller migrate", ttl_s=60
    )
    try:
        epoch = lease.acquire()
        if epoch is None:
            _, leader, _ = lease.leader()
            raise StateError(
                f"a controller leads {describe(spec)} (at {leader}): stop every controller "
                "on it first"
            )
        store.epoch = epoch
        yield
        lease.release(epoch)
    except Exception as exc:
        if isinstance(exc, StateError | StoreUnavailable):
            raise
        raise StateError(f"cannot take the lease of {describe(spec)}: {exc}") from exc
    finally:
        lease.close()
