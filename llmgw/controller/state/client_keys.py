"""Tenants' client keys, made and revoked by an admin, followed by every gateway.

`llmgw ctl keys create --tenant acme --models 'llama-*'` makes a key that the
answer shows once; the store keeps its SHA-256 (llmgw.tenant_keys), as it keeps
node credentials. Gateways long-poll `GET /v1/keys/feed?since=CURSOR&wait=S`
with their gateway token: each answer is every key's digest, tenant, patterns
and expiry (there are few; a whole list is simpler than a delta and cannot
drift), so a key made or revoked reaches every gateway in one round trip.
A revoked key is deleted; an expired one stays listed (state `expired`) until an
admin revokes it, and gateways refuse it from its expiry on, by their own clock.

The gateways say which keys they saw in their status each second; `last_used`
is written to the store at most once a minute per key (it is shown to the minute).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from llmgw.controller.core.records import ClientKey
from llmgw.controller.store.base import StateStore
from llmgw.errors import TooManyKeys
from llmgw.tenant_keys import digest, new_id, new_key
from llmgw.wire import ClientKeyEntry, ClientKeysFeed, ClientKeyView

# Keys kept at once: each is made by an admin, and every gateway gets the whole list.
MAX_KEYS = 10_000
LAST_USED_EVERY_S = 60.0


def state(key: ClientKey, now: float) -> str:
    return "expired" if key.expires_at is not None and now >= key.expires_at else "valid"


def view(key: ClientKey, now: float, secret: str | None = None) -> ClientKeyView:
    """What `ctl keys list` shows; `secret` only in the answer that made it."""
    return ClientKeyView(
        id=key.id,
        tenant=key.tenant,
        models=list(key.models),
        state=state(key, now),
        created_at=key.created_at,
        by=key.by,
        expires_at=key.expires_at,
        last_used=key.last_used,
        key=secret,
    )


class ClientKeys:
    """The client keys: the store first, then this memory, then the feed's waiters."""

    def __init__(self, store: StateStore, run: str) -> None:
        self._store = store
        self._run = run  # in every cursor: one of another term is stale by its run
        self._by_id = {k.id: k for k in store.client_keys()}
        self._revision = 0
        self._changed = asyncio.Event()

    def create(
        self,
        *,
        tenant: str,
        models: tuple[str, ...],
        by: str,
        at: float,
        expires_s: float | None,
    ) -> tuple[str, ClientKey]:
        """A new key: (the key to hand out once, its record)."""
        if len(self._by_id) >= MAX_KEYS:
            raise TooManyKeys(MAX_KEYS)
        key_id = new_id()
        while key_id in self._by_id:
            key_id = new_id()
        secret = new_key(key_id)
        record = ClientKey(
            id=key_id,
            tenant=tenant,
            digest=digest(secret),
            models=models or ("*",),
            created_at=at,
            by=by,
            expires_at=None if expires_s is None else at + expires_s,
        )
        self._store.put_client_key(record)
        self._by_id[key_id] = record
        self._changed_now()
        return secret, record

    def revoke(self, key_id: str) -> ClientKey | None:
        key = self._by_id.get(key_id)
        if key is None:
            return None
        self._store.delete_client_key(key_id)
        del self._by_id[key_id]
        self._changed_now()
        return key

    def used(self, seen: dict[str, float]) -> None:
        """A gateway saw these keys (id -> when); stored when a minute has passed."""
        due: list[tuple[str, float]] = []
        for key_id, at in seen.items():
            key = self._by_id.get(key_id)
            if key is None or (
                key.last_used is not None and at < key.last_used + LAST_USED_EVERY_S
            ):
                continue
            due.append((key_id, at))
        if due:
            self._store.client_keys_used(due)
            for key_id, at in due:
                self._by_id[key_id] = replace(self._by_id[key_id], last_used=at)

    def list(self) -> list[ClientKey]:
        return sorted(self._by_id.values(), key=lambda k: (k.created_at, k.id))

    # -- the gateways' feed -----------------------------------------------------------------

    @property
    def cursor(self) -> str:
        return f"{self._run}.{self._revision}"

    def feed(self) -> ClientKeysFeed:
        return ClientKeysFeed(
            cursor=self.cursor,
            keys=[
                ClientKeyEntry(
                    id=k.id,
                    tenant=k.tenant,
                    digest=k.digest,
                    models=list(k.models),
                    expires_at=k.expires_at,
                )
                for k in self.list()
            ],
        )

    async def wait_past(self, since: str, wait_s: float) -> None:
        """Return once the keys differ from what cursor `since` saw, or after `wait_s`."""
        if since != self.cursor:
            return
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), wait_s)

    def touch(self) -> None:
        """Something else on the feed changed (a tenant's limits): the cursor moves on."""
        self._changed_now()

    def _changed_now(self) -> None:
        self._revision += 1
        self._changed.set()
        self._changed = asyncio.Event()
