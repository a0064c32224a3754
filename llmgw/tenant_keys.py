"""Client keys of tenants, as both the controller and the gateways read them.

A key reads `sk-llmgw-ID-SECRET`: the ID is public (listed, revoked by), the
SECRET is 32 random bytes shown once. What is kept, and all a gateway ever
receives, is the SHA-256 of the whole key: a gateway hashes the bearer token it
is given and looks the digest up, so a guess close to a key teaches nothing
(the hash of a near miss is unrelated), as SMG's own key check does.

A key allows the models its patterns match: shell-style (`llama-*`, `chat`,
`org/*`; `*` is every model), matched against the whole name, case-sensitively.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import secrets

PREFIX = "sk-llmgw-"
_ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
ID_LENGTH = 8
ALL_MODELS = ("*",)


def digest(key: str) -> str:
    """What is kept of a client key, and what a gateway matches: its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(key_id: str) -> str:
    return f"{PREFIX}{key_id}-{secrets.token_urlsafe(32)}"


def new_id() -> str:
    return "".join(secrets.choice(_ID_CHARS) for _ in range(ID_LENGTH))


class Models:
    """Which model names a key's patterns allow (one compiled expression)."""

    __slots__ = ("_match", "patterns")

    def __init__(self, patterns: tuple[str, ...] | list[str]) -> None:
        self.patterns = tuple(patterns)
        if not self.patterns or "*" in self.patterns:
            self._match = None  # every model
        else:
            union = "|".join(f"(?:{fnmatch.translate(p)})" for p in self.patterns)
            self._match = re.compile(union).match

    def allows(self, model: str) -> bool:
        return self._match is None or self._match(model) is not None

    @property
    def every(self) -> bool:
        return self._match is None
