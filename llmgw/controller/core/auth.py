"""Bearer-token auth: who may report, who may read, who may change things.

Kinds of token: agent (for /v1/agent/*), admin (mutations and reads), read
(reads only), enroll (may only trade itself for a node's own credential),
gateway (the endpoint feed and gateway status only), metrics (/metrics only). An
agent token is either a node credential, which speaks for one node only (as
Kubernetes' node authorizer has it), or a shared token, which may report as any
node and is accepted only when the operator says so. With no token configured
at all the controller is open, which it allows only on a loopback address.
Tokens are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from llmgw.wire import node_name


class Role(StrEnum):
    AGENT = "agent"
    ADMIN = "admin"
    READ = "read"
    ENROLL = "enroll"
    METRICS = "metrics"  # may only scrape /metrics
    GATEWAY = "gateway"  # reads endpoints and posts gateway status, nothing else


@dataclass(frozen=True)
class Identity:
    name: str  # recorded as "who" on cordons and drains
    role: Role | None  # None: open mode, no tokens configured
    node: str | None = None  # a node credential: the one node it speaks for


@dataclass(frozen=True)
class Tokens:
    """Configured tokens as (secret, name, role), and node credentials as (secret, node)."""

    entries: tuple[tuple[str, str, Role], ...] = field(default_factory=tuple)
    nodes: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def enabled(self) -> bool:
        return bool(self.entries or self.nodes)

    def has(self, role: Role) -> bool:
        if role is Role.AGENT and self.nodes:
            return True
        return any(r is role for _, _, r in self.entries)

    @property
    def shared_agent(self) -> bool:
        """A token that may report as any node is configured."""
        return any(r is Role.AGENT for _, _, r in self.entries)

    def node_names(self) -> set[str]:
        return {node for _, node in self.nodes}

    def identify(self, presented: str) -> Identity | None:
        """The identity whose token matches, or None. Checks every entry so the
        time taken does not reveal which one matched."""
        found: Identity | None = None
        given = presented.encode()
        for secret, name, role in self.entries:
            if hmac.compare_digest(secret.encode(), given):
                found = Identity(name, role)
        for secret, node in self.nodes:
            if hmac.compare_digest(secret.encode(), given):
                found = Identity(node, Role.AGENT, node)
        return found

    @classmethod
    def load(
        cls,
        env: dict[str, str] | None = None,
        files: dict[Role, Path | None] | None = None,
    ) -> Tokens:
        """Tokens from LLMGW_{AGENT,ADMIN,READ,ENROLL,GATEWAY,METRICS}_TOKEN and/or token files.

        A token file holds one token per line, optionally `NAME TOKEN` so that
        several operators' actions are told apart; `#` starts a comment. In the
        agent token file NAME is the node the token speaks for; a line without
        one (and LLMGW_AGENT_TOKEN) is a shared token.
        """
        env = dict(os.environ) if env is None else env
        entries: list[tuple[str, str, Role]] = []
        nodes: list[tuple[str, str]] = []
        for role in Role:
            value = env.get(f"LLMGW_{role.value.upper()}_TOKEN", "").strip()
            if value:
                entries.append((value, role.value, role))
            path = (files or {}).get(role)
            if path is None:
                continue
            for secret, name in _read_token_file(path):
                if role is Role.AGENT and name:
                    try:
                        nodes.append((secret, node_name(name)))  # as reports name it
                    except ValueError as exc:
                        raise ValueError(f"{path}: node {exc}") from None
                else:
                    entries.append((secret, name or role.value, role))
        return cls(tuple(entries), tuple(nodes))


def _read_token_file(path: Path) -> list[tuple[str, str]]:
    """(secret, name) per line; name is "" on a line holding only a token."""
    entries = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, secret = line.rpartition(" ")
        entries.append((secret, name.strip()))
    if not entries:
        raise ValueError(f"token file {path} holds no token")
    return entries


def digest(secret: str) -> str:
    """What is kept of an issued secret (a node credential, an enrollment token): its
    SHA-256. The secrets are 32 random bytes, so a fast hash is enough."""
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


# Which roles may call which kind of endpoint.
AGENT_ROLES = frozenset({Role.AGENT})
ENROLL_ROLES = frozenset({Role.ENROLL})
READ_ROLES = frozenset({Role.AGENT, Role.ADMIN, Role.READ})
ADMIN_ROLES = frozenset({Role.ADMIN})
METRICS_ROLES = READ_ROLES | {Role.METRICS}
GATEWAY_ROLES = frozenset({Role.GATEWAY})
ENDPOINT_READERS = READ_ROLES | GATEWAY_ROLES
