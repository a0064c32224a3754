"""How each record of the store is written as a row and read back from one: the
mappings stores/sql.py uses for its queries and for `dump` / `load`."""

from __future__ import annotations

import json

from llmgw.controller.core.records import (
    Backoff,
    ClientKey,
    EnrollToken,
    IssuedCredential,
    LeaveReason,
    ReplicaRecord,
    ShardRecord,
    StartCount,
)
from llmgw.controller.store.session import Row
from llmgw.wire import (
    AdminEvent,
    AdminFlag,
    AdminInfo,
    EventView,
    ModelRevision,
    ReplicaState,
    StartKind,
)

__all__ = [
    "admin_event_from_row",
    "admin_from_row",
    "admin_row",
    "backoff_row",
    "client_key_from_row",
    "client_key_row",
    "credential_from_row",
    "credential_row",
    "decision_from_row",
    "decision_row",
    "replica_from_row",
    "replica_row",
    "revision_row",
    "token_from_row",
    "token_row",
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
        None if rec.leave_reason is None else rec.leave_reason.value,
        rec.reclaimed_for,
        rec.asleep_since,
        None if rec.start is None else rec.start.value,
        rec.engine_key,
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
        leave_reason=None if r["leave_reason"] is None else LeaveReason(r["leave_reason"]),
        reclaimed_for=r["reclaimed_for"],
        asleep_since=r["asleep_since"],
        start=None if r["start_kind"] is None else StartKind(r["start_kind"]),
        engine_key=r["engine_key"],
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


def decision_row(e: EventView) -> tuple[object, ...]:
    return (e.id, e.at, e.object, e.reason.value, e.message, e.count, e.first_at)


def decision_from_row(r: Row) -> EventView:
    return EventView(
        id=r["id"],
        at=r["at"],
        object=r["object"],
        reason=r["reason"],
        message=r["message"],
        count=r["count"],
        first_at=r["first_at"],
    )


def credential_row(c: IssuedCredential) -> tuple[object, ...]:
    return (c.node, c.digest, c.issued_at, c.by, int(c.pending), c.token, c.reported_at)


def credential_from_row(r: Row) -> IssuedCredential:
    return IssuedCredential(
        node=r["node"],
        digest=r["digest"],
        issued_at=r["issued_at"],
        by=r["by"],
        pending=bool(r["pending"]),
        token=r["token"],
        reported_at=r["reported_at"],
    )


def client_key_row(k: ClientKey) -> tuple[object, ...]:
    return (
        k.id,
        k.tenant,
        k.digest,
        json.dumps(list(k.models)),
        k.created_at,
        k.by,
        k.expires_at,
        k.last_used,
    )


def client_key_from_row(r: Row) -> ClientKey:
    return ClientKey(
        id=r["id"],
        tenant=r["tenant"],
        digest=r["digest"],
        models=tuple(json.loads(r["models"])),
        created_at=r["created_at"],
        by=r["by"],
        expires_at=r["expires_at"],
        last_used=r["last_used"],
    )


def token_row(t: EnrollToken) -> tuple[object, ...]:
    return (t.id, t.digest, t.created_at, t.by, t.expires_at, t.uses, t.used, t.description)


def token_from_row(r: Row) -> EnrollToken:
    return EnrollToken(
        id=r["id"],
        digest=r["digest"],
        created_at=r["created_at"],
        by=r["by"],
        expires_at=r["expires_at"],
        uses=r["uses"],
        used=r["used"],
        description=r["description"],
    )


def start_row(c: StartCount) -> tuple[object, ...]:
    return (c.model, c.kind.value, c.level, c.count, c.last_s, c.last_at)


def start_from_row(r: Row) -> StartCount:
    return StartCount(
        model=r["model"],
        kind=StartKind(r["kind"]),
        level=r["level"],
        count=r["count"],
        last_s=r["last_s"],
        last_at=r["last_at"],
    )
