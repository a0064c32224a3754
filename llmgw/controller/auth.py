"""Bearer-token auth: who may report, who may read, who may change things.

Four kinds of token: agent (for /v1/agent/*), admin (mutations and reads),
read (reads only), gateway (the endpoint feed and gateway status only). With no token configured at all the controller is open, which
it allows only on a loopback address. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class Role(StrEnum):
    AGENT = "agent"
    ADMIN = "admin"
    READ = "read"
    GATEWAY = "gateway"  # reads endpoints and posts gateway status, nothing else


@dataclass(frozen=True)
class Identity:
    name: str  # recorded as "who" on cordons and drains
    role: Role | None  # None: open mode, no tokens configured


@dataclass(frozen=True)
class Tokens:
    """Configured tokens as (secret, name, role)."""

    entries: tuple[tuple[str, str, Role], ...] = field(default_factory=tuple)

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    def has(self, role: Role) -> bool:
        return any(r is role for _, _, r in self.entries)

    def identify(self, presented: str) -> Identity | None:
        """The identity whose token matches, or None. Checks every entry so the
        time taken does not reveal which one matched."""
        found: Identity | None = None
        for secret, name, role in self.entries:
            if hmac.compare_digest(secret.encode(), presented.encode()):
                found = Identity(name, role)
        return found

    @classmethod
    def load(
        cls,
        env: dict[str, str] | None = None,
        files: dict[Role, Path | None] | None = None,
    ) -> Tokens:
        """Tokens from LLMGW_{AGENT,ADMIN,READ,GATEWAY}_TOKEN and/or token files.

        A token file holds one token per line, optionally `NAME TOKEN` so that
        several operators' actions are told apart; `#` starts a comment.
        """
        env = dict(os.environ) if env is None else env
        entries: list[tuple[str, str, Role]] = []
        for role in Role:
            value = env.get(f"LLMGW_{role.value.upper()}_TOKEN", "").strip()
            if value:
                entries.append((value, role.value, role))
            path = (files or {}).get(role)
            if path is not None:
                entries.extend(_read_token_file(path, role))
        return cls(tuple(entries))


def _read_token_file(path: Path, role: Role) -> list[tuple[str, str, Role]]:
    entries = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, secret = line.rpartition(" ")
        entries.append((secret, name.strip() or role.value, role))
    if not entries:
        raise ValueError(f"token file {path} holds no token")
    return entries


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


# Which roles may call which kind of endpoint.
AGENT_ROLES = frozenset({Role.AGENT})
READ_ROLES = frozenset({Role.AGENT, Role.ADMIN, Role.READ})
ADMIN_ROLES = frozenset({Role.ADMIN})
GATEWAY_ROLES = frozenset({Role.GATEWAY})
ENDPOINT_READERS = READ_ROLES | GATEWAY_ROLES
