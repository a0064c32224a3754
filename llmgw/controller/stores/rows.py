"""How each record of the store is written as a row and read back from one: the
mappings stores/sql.py uses for its queries and for `dump` / `load`."""

from __future__ import annotations

import json

from llmgw.controller.records import Backoff, ReplicaRecord, ShardRecord
from llmgw.controller.stores.session import Row
from llmgw.wire import AdminEvent, AdminFlag, AdminInfo, ModelRevision, ReplicaState

__all__ = [
    "admin_event_from_row",
    "admin_from_row",
    "admin_row",
    "backoff_row",
    "replica_from_row",
    "replica_row",
    "revision_row",
]


def admin_row(name: str, info: AdminInfo) -> tuple[object, ...]:
    return (
        name,
        info.flag.value,
        info.reason,
        info.by,
        info.at,
        int(info.drained),
        int(info.force),
        info.force_at,
    )


def admin_from_row(r: Row) -> AdminInfo:
    return AdminInfo(
        flag=AdminFlag(r["flag"]),
        reason=r["reason"],
        by=r["by"],
        at=r["at"],
        drained=bool(r["drained"]),
        force=bool(r["force"]),
        force_at=r["force_at"],
    )


def backoff_row(b: Backoff) -> tuple[object, ...]:
    return (b.model, b.failures, b.retry_at, b.last_failure)


def replica_row(rec: ReplicaRecord) -> tuple[object, ...]:
    shards = json.dumps(
        [{"node": s.node, "rank": s.rank, "gpus": list(s.gpus)} for s in rec.shards]
    )
    return (
        rec.id,
        rec.model,
        rec.state.value,
        shards,
        rec.created_at,
        rec.error,
        rec.replaces,
        rec.revision,
        rec.leaving,
    )


def revision_row(r: ModelRevision) -> tuple[object, ...]:
    return (r.spec.name, r.revision, r.at, r.by, r.change, r.spec.model_dump_json())


def replica_from_row(r: Row) -> ReplicaRecord:
    return ReplicaRecord(
        id=r["id"],
        model=r["model"],
        state=ReplicaState(r["state"]),
        shards=tuple(
            ShardRecord(node=s["node"], rank=s["rank"], gpus=tuple(s["gpus"]))
            for s in json.loads(r["shards"])
        ),
        created_at=r["created_at"],
        error=r["error"],
        replaces=r["replaces"],
        revision=r["revision"] or 0,
        leaving=r["leaving"],
    )


def admin_event_from_row(r: Row) -> AdminEvent:
    return AdminEvent(
        node=r["node"],
        action=r["action"],
        reason=r["reason"],
        by=r["by"],
        at=r["at"],
        force_at=r["force_at"],
    )
