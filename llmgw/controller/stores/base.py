"""The store interface both backends give, and the dump `migrate` copies."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.controller.store import SCHEMA_VERSION, Backoff, ReplicaRecord
from llmgw.wire import AdminEvent, AdminInfo, ModelSpec

__all__ = ["SCHEMA_VERSION", "StateDump", "StateStore"]


@dataclass
class StateDump:
    """Everything durable, in a form either backend can load (for `migrate`)."""

    nodes: dict[str, float] = field(default_factory=dict)
    admin: dict[str, AdminInfo] = field(default_factory=dict)
    events: list[AdminEvent] = field(default_factory=list)  # oldest first
    models: dict[str, tuple[ModelSpec, float]] = field(default_factory=dict)
    replicas: dict[str, ReplicaRecord] = field(default_factory=dict)
    backoffs: dict[str, Backoff] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (
            self.nodes or self.admin or self.events or self.models or self.replicas or self.backoffs
        )


class StateStore(Protocol):
    """Every method is one transaction; a write that could not be stored raises
    `StoreUnavailable` and changes nothing. `epoch`: how many times the store's
    writer changed (SQLite: always 1, one controller)."""

    epoch: int

    def close(self) -> None: ...
    def known_nodes(self) -> dict[str, float]: ...
    def add_nodes(self, nodes: Iterable[tuple[str, float]]) -> None: ...
    def forget_node(self, name: str, replica_ids: Iterable[str], *, by: str, at: float) -> None: ...
    def admin(self) -> dict[str, AdminInfo]: ...
    def set_admin(
        self,
        name: str,
        info: AdminInfo,
        *,
        action: str,
        by: str,
        at: float,
        first_seen: float | None = None,
    ) -> None: ...
    def history(self, name: str, limit: int = 50) -> list[AdminEvent]: ...
    def models(self) -> dict[str, ModelSpec]: ...
    def put_models(self, specs: Iterable[ModelSpec], at: float) -> None: ...
    def delete_model(self, name: str) -> bool: ...
    def replicas(self) -> dict[str, ReplicaRecord]: ...
    def put_replicas(self, records: Iterable[ReplicaRecord]) -> None: ...
    def delete_replicas(self, ids: Iterable[str]) -> None: ...
    def backoffs(self) -> dict[str, Backoff]: ...
    def put_backoff(self, b: Backoff) -> None: ...
    def clear_backoff(self, model: str) -> None: ...
    def dump(self) -> StateDump: ...
    def load(self, state: StateDump) -> None: ...
