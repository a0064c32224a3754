"""Node credentials: one secret per node, issued by enrollment, revocable.

An agent holding the enrollment token trades it, once per node name, for a
credential of its own (`POST /v1/agent/enroll`). Only the credential's SHA-256
is stored (the secret is 32 random bytes, so a fast hash is enough), durably in
the controller's database. A name that already holds a credential cannot be
enrolled again until an operator revokes it: whoever has the enrollment token
cannot take over a node that exists.

Credentials from `--agent-token-file NODE TOKEN` lines are listed too; they live
in the operator's file, so they are revoked by editing it.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from llmgw.controller.auth import Tokens
from llmgw.controller.stores.base import StateStore


class AlreadyEnrolled(Exception):
    def __init__(self, node: str, source: str) -> None:
        how = (
            f"revoke it first (`llmgw ctl credentials revoke {node}`) to enroll it again"
            if source == "enrolled"
            else "it is configured in --agent-token-file"
        )
        super().__init__(f"node {node!r} already holds a credential; {how}")


class NotRevocable(Exception):
    pass


@dataclass(frozen=True)
class Credential:
    node: str
    source: str  # "enrolled" | "file"
    issued_at: float | None
    by: str | None


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Credentials:
    def __init__(self, store: StateStore, tokens: Tokens) -> None:
        self._store = store
        self._file_nodes = tokens.node_names()
        self._issued: dict[str, tuple[str, float, str]] = {}
        self._by_digest: dict[str, str] = {}
        self.reload()

    def reload(self) -> None:
        """Read the issued credentials from the store (at start, and for a new leader)."""
        self._issued = self._store.credentials()
        self._by_digest = {d: node for node, (d, _, _) in self._issued.items()}

    def identify(self, presented: str) -> str | None:
        """The node an issued credential speaks for, or None."""
        return self._by_digest.get(digest(presented))

    def enroll(self, node: str, *, by: str, at: float) -> str:
        """A new credential for `node`, stored before it is handed out."""
        if node in self._file_nodes:
            raise AlreadyEnrolled(node, "file")
        if node in self._issued:
            raise AlreadyEnrolled(node, "enrolled")
        secret = "llmgw-node-" + secrets.token_urlsafe(32)
        d = digest(secret)
        self._store.put_credential(node, d, at=at, by=by)
        self._issued[node] = (d, at, by)
        self._by_digest[d] = node
        return secret

    def revoke(self, node: str) -> bool:
        """Revoke an issued credential; False when the node holds none."""
        if node in self._file_nodes and node not in self._issued:
            raise NotRevocable(
                f"node {node!r}'s credential is configured in --agent-token-file: "
                "remove its line and restart the controller"
            )
        if node not in self._issued:
            return False
        self._store.delete_credential(node)
        d, _, _ = self._issued.pop(node)
        self._by_digest.pop(d, None)
        return True

    def list(self) -> list[Credential]:
        out = [Credential(n, "enrolled", at, by) for n, (_, at, by) in self._issued.items()]
        out += [Credential(n, "file", None, None) for n in self._file_nodes - set(self._issued)]
        return sorted(out, key=lambda c: c.node)
