"""Tenants' limits (`ctl limits`): the store first, then this memory, then the
gateways, which follow them on the keys feed (client_keys.py) and enforce them
(gateway/limits.py; what each limit means: llmgw/tenant_limits.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from llmgw.controller.core.records import TenantLimit
from llmgw.controller.store.base import StateStore
from llmgw.errors import TooManyLimits
from llmgw.tenant_limits import Scope
from llmgw.wire import LimitRequest, TenantLimitView

# Limits kept at once: each set by an admin, and every gateway gets them all.
MAX_LIMITS = 10_000


def view(limit: TenantLimit) -> TenantLimitView:
    return TenantLimitView(
        tenant=limit.tenant,
        model=limit.model,
        rpm=limit.rpm,
        tpm=limit.tpm,
        budget=limit.budget,
        per=limit.per,
        by=limit.by,
        at=limit.at,
    )


class Limits:
    def __init__(self, store: StateStore, changed: Callable[[], None]) -> None:
        self._store = store
        self._changed = changed  # the keys feed moves on: gateways take the change
        self._by_scope = {k.scope: k for k in store.limits()}

    def set(self, body: LimitRequest, *, by: str, at: float) -> TenantLimit:
        """The kinds `body` gives replace the scope's; the others stay."""
        scope = (body.tenant, body.model)
        old = self._by_scope.get(scope)
        if old is None and len(self._by_scope) >= MAX_LIMITS:
            raise TooManyLimits(MAX_LIMITS)
        if old is None:
            old = TenantLimit(body.tenant, body.model, None, None, None, None, by, at)
        limit = replace(
            old,
            rpm=old.rpm if body.rpm is None else body.rpm,
            tpm=old.tpm if body.tpm is None else body.tpm,
            budget=old.budget if body.budget is None else body.budget,
            per=old.per if body.per is None else body.per,
            by=by,
            at=at,
        )
        self._store.put_limit(limit)
        self._by_scope[scope] = limit
        self._changed()
        return limit

    def delete(self, scope: Scope) -> TenantLimit | None:
        limit = self._by_scope.get(scope)
        if limit is None:
            return None
        self._store.delete_limit(*scope)
        del self._by_scope[scope]
        self._changed()
        return limit

    def get(self, scope: Scope) -> TenantLimit | None:
        return self._by_scope.get(scope)

    def list(self) -> list[TenantLimit]:
        return sorted(self._by_scope.values(), key=lambda k: (k.tenant, k.model or ""))

    def scopes(self) -> dict[Scope, TenantLimit]:
        return dict(self._by_scope)
