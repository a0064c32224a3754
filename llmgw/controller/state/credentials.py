"""Node credentials: one secret per node, issued by enrollment, revocable.

An agent holding an enrollment token trades it, once per node name, for a
credential of its own (`POST /v1/agent/enroll`). Only the credential's SHA-256
is stored (the secret is 32 random bytes, so a fast hash is enough), durably in
the controller's database. Enrollment is bounded, as kubeadm bounds joining:
- a name that already holds a credential cannot be enrolled again until an
  operator revokes it: whoever has an enrollment token cannot take over a node;
- a name that has reported before (a fleet moving from a shared agent token to
  enrollment, or a revoked node) enrolls only once an admin allows it
  (`ctl credentials allow NODE`): the allowance is used up by that enrollment;
- tokens made with `ctl credentials token create` expire and count their uses
  (`enroll_tokens.py`); with --enroll-approval a new credential awaits an admin's
  approval before its node gets work (`Approvals.await_approval`);
- a credential whose node has not reported with it within `UNREPORTED_TTL_S`
  (an hour) of its issue expires: it no longer authenticates, and goes at the next
  enrollment or listing (`expire`). An enrollment flood, a new name each time and
  no agent behind any, so keeps at most --enroll-rate x an hour of them (18,000 at
  the default 5 per second); `ctl credentials list` shows each one's expiry.

Credentials from `--agent-token-file NODE TOKEN` lines are listed too; they live
in the operator's file, so they are revoked by editing it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from llmgw.controller.core.auth import Tokens, digest
from llmgw.controller.core.records import EnrollToken
from llmgw.controller.state.enroll_tokens import EnrollTokens
from llmgw.controller.store.base import StateStore
from llmgw.errors import AlreadyEnrolled, EnrollNotAllowed, NotRevocable, TokenSpent

# An agent reports within seconds of its enrollment: an hour is generous.
UNREPORTED_TTL_S = 3600.0


@dataclass(frozen=True)
class Credential:
    node: str
    source: str  # "enrolled" | "file"
    issued_at: float | None
    by: str | None
    expires_at: float | None = None  # its node has not reported with it: it goes then


class Credentials:
    def __init__(self, store: StateStore, tokens: Tokens) -> None:
        self._store = store
        self._file_nodes = tokens.node_names()
        self._issued: dict[str, tuple[str, float, str]] = {}
        self._by_digest: dict[str, str] = {}
        self._allowed: dict[str, tuple[str, float]] = {}
        # Issued and not reported with -> issued_at, oldest first.
        self._unreported: dict[str, float] = {}
        self.tokens = EnrollTokens(store)
        self.reload()

    def reload(self) -> None:
        """Read the issued credentials from the store (at start, and for a new leader)."""
        self._issued = self._store.credentials()
        self._by_digest = {d: node for node, (d, _, _) in self._issued.items()}
        self._allowed = self._store.enroll_allowed()
        self._unreported = self._store.unreported_credentials()
        self.tokens.reload()

    def identify(self, presented: str, now: float) -> str | None:
        """The node an issued credential speaks for, or None (also once it expired)."""
        node = self._by_digest.get(digest(presented))
        expires = None if node is None else self.expires_at(node)
        return None if expires is not None and expires <= now else node

    def expires_at(self, node: str) -> float | None:
        """When the node's credential expires unless its node reports (None: never)."""
        issued = self._unreported.get(node)
        return None if issued is None else issued + UNREPORTED_TTL_S

    def reported(self, node: str, at: float) -> None:
        """The node reported with its credential: it no longer expires."""
        if node in self._unreported:
            self._store.credential_reported(node, at=at)
            del self._unreported[node]

    def expire(self, now: float) -> list[str]:
        """Drop the credentials that never reported within UNREPORTED_TTL_S of their
        issue; returns their nodes."""
        gone = []
        for node, issued in self._unreported.items():  # oldest first
            if issued + UNREPORTED_TTL_S > now:
                break
            gone.append(node)
        if gone:
            self._store.expire_credentials(gone)
            for node in gone:
                del self._unreported[node]
                d, _, _ = self._issued.pop(node)
                self._by_digest.pop(d, None)
        return gone

    def holds(self, node: str) -> bool:
        """Whether the node holds a credential (issued or from the token file)."""
        return node in self._issued or node in self._file_nodes

    def enroll(
        self,
        node: str,
        *,
        by: str,
        at: float,
        known: bool = False,
        pending: bool = False,
        token: EnrollToken | None = None,
    ) -> str:
        """A new credential for `node`, stored before it is handed out.

        `known`: the node has reported before; `pending`: it awaits approval;
        `token`: the admin-made token it came with, one of whose uses it takes."""
        if node in self._file_nodes:
            raise AlreadyEnrolled(node, "file")
        if node in self._issued:
            raise AlreadyEnrolled(node, "enrolled")
        if known and node not in self._allowed:
            raise EnrollNotAllowed(node)
        secret = "llmgw-node-" + secrets.token_urlsafe(32)
        d = digest(secret)
        token_id = token.id if token is not None else None
        if not self._store.enroll(node, d, at=at, by=by, pending=pending, token=token_id):
            raise TokenSpent(f"enrollment token {token_id} has expired or is used up")
        if token_id is not None:
            self.tokens.used(token_id)
        self._allowed.pop(node, None)
        self._issued[node] = (d, at, by)
        self._by_digest[d] = node
        self._unreported[node] = at
        return secret

    def allow(self, node: str, *, by: str, at: float) -> None:
        """Let a node that has reported before enroll once more."""
        if self.holds(node):
            raise AlreadyEnrolled(node, "enrolled" if node in self._issued else "file")
        self._store.allow_enroll(node, by=by, at=at)
        self._allowed[node] = (by, at)

    def revoke(self, node: str) -> bool:
        """Revoke an issued credential; False when the node holds none."""
        if node in self._file_nodes and node not in self._issued:
            raise NotRevocable(node)
        if node not in self._issued:
            return False
        self._store.delete_credential(node)
        d, _, _ = self._issued.pop(node)
        self._by_digest.pop(d, None)
        self._unreported.pop(node, None)
        return True

    def list(self) -> list[Credential]:
        out = [
            Credential(n, "enrolled", at, by, self.expires_at(n))
            for n, (_, at, by) in self._issued.items()
        ]
        out += [Credential(n, "file", None, None) for n in self._file_nodes - set(self._issued)]
        return sorted(out, key=lambda c: c.node)
