"""Enrollment tokens an admin makes, as kubeadm's bootstrap tokens are made.

`llmgw ctl credentials token create --ttl 1h --uses 10` makes a token that enrolls
at most 10 nodes within the hour. A token reads `llmgw-enroll-ID.SECRET`: the ID is
public (listed, deleted by), the SECRET is shown once and kept only as a SHA-256
(32 random bytes: a fast hash is enough). A token that has expired or is used up is
refused with a 401 that says so; its record stays listed until an admin deletes it.
Each use is taken in the same transaction as the credential it issues
(`StateStore.enroll`), so two controllers, or two requests, cannot overspend it.

The static enrollment token (--enroll-token-file, LLMGW_ENROLL_TOKEN) still works,
without expiry or limit, for fleets that have one.
"""

from __future__ import annotations

import hmac
import re
import secrets
from dataclasses import replace

from llmgw.controller.core.auth import digest
from llmgw.controller.core.records import EnrollToken
from llmgw.controller.store.base import StateStore
from llmgw.errors import TooManyTokens
from llmgw.present import timestamp
from llmgw.wire import EnrollTokenView

PREFIX = "llmgw-enroll-"
_FORM = re.compile(r"llmgw-enroll-([a-z0-9]{6})\.([A-Za-z0-9_-]{16,64})")
# Tokens kept at once: each is made by an admin, but the table must stay small.
MAX_TOKENS = 1000


def _new_id() -> str:
    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))


def state(token: EnrollToken, now: float) -> str:
    """`valid`, `expired` or `used up` (expiry first: an expired token is that for good)."""
    if token.expires_at is not None and now >= token.expires_at:
        return "expired"
    if token.uses is not None and token.used >= token.uses:
        return "used up"
    return "valid"


def why_spent(token: EnrollToken, now: float) -> str | None:
    """Why `token` can enroll no more nodes, or None while it can."""
    match state(token, now):
        case "expired":
            return f"enrollment token {token.id} expired at {timestamp(token.expires_at)}"
        case "used up":
            return f"enrollment token {token.id} is used up ({token.used} of {token.uses} uses)"
    return None


def view(token: EnrollToken, now: float, secret: str | None = None) -> EnrollTokenView:
    """What `ctl credentials token list` shows; `secret` only in the answer that made it."""
    return EnrollTokenView(
        id=token.id,
        state=state(token, now),
        created_at=token.created_at,
        by=token.by,
        expires_at=token.expires_at,
        uses=token.uses,
        used=token.used,
        description=token.description,
        token=secret,
    )


class EnrollTokens:
    """The admin-made enrollment tokens: the store first, then this memory."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._by_id: dict[str, EnrollToken] = {}
        self.reload()

    def reload(self) -> None:
        self._by_id = {t.id: t for t in self._store.enroll_tokens()}

    def create(
        self,
        *,
        by: str,
        at: float,
        ttl_s: float | None,
        uses: int | None,
        description: str | None,
    ) -> tuple[str, EnrollToken]:
        """A new token: (the secret to hand out once, its record)."""
        if len(self._by_id) >= MAX_TOKENS:
            raise TooManyTokens(MAX_TOKENS)
        token_id = _new_id()
        while token_id in self._by_id:
            token_id = _new_id()
        secret = f"{PREFIX}{token_id}.{secrets.token_urlsafe(32)}"
        record = EnrollToken(
            id=token_id,
            digest=digest(secret),
            created_at=at,
            by=by,
            expires_at=None if ttl_s is None else at + ttl_s,
            uses=uses,
            description=description,
        )
        self._store.put_enroll_token(record)
        self._by_id[token_id] = record
        return secret, record

    def delete(self, token_id: str) -> bool:
        if token_id not in self._by_id:
            return False
        self._store.delete_enroll_token(token_id)
        del self._by_id[token_id]
        return True

    def identify(self, presented: str) -> EnrollToken | None:
        """The token `presented` is, or None (a wrong secret is None too)."""
        m = _FORM.fullmatch(presented)
        if m is None:
            return None
        token = self._by_id.get(m.group(1))
        if token is None or not hmac.compare_digest(token.digest, digest(presented)):
            return None
        return token

    def used(self, token_id: str) -> None:
        """One use was taken in the store (with the credential it issued)."""
        token = self._by_id.get(token_id)
        if token is not None:
            self._by_id[token_id] = replace(token, used=token.used + 1)

    def list(self) -> list[EnrollToken]:
        return sorted(self._by_id.values(), key=lambda t: (t.created_at, t.id))
