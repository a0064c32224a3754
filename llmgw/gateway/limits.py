"""Tenants' limits at the gateway: a request over one is answered 429 here, before
it is sent anywhere (llmgw.tenant_limits says what each limit means).

Each gateway decides alone, from what it counts itself at once and what the
others spent, which the controller tells it in the answer to each usage batch
(`shared`, about every second): the other gateways' running totals of requests
and tokens per limited scope, taken from this gateway's buckets as they grow, and
each budget's tokens used in its period, every gateway's. So a tenant can pass a
limit across the fleet by at most what the other gateways let through in one
report interval and its round trip (about one second of the tenant's traffic),
plus, for tokens, what the requests in flight then cost. A gateway that loses
the controller goes on with its own counts and the last it heard.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.tenant_limits import Bucket, LimitKind, Scope, period_bounds
from llmgw.wire import TenantLimitView, UsageAnswer


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: LimitKind
    retry_after_s: int
    message: str


def _seconds(wait: float) -> int:
    return max(1, math.ceil(wait - 1e-3))  # (a millisecond past a whole second: that second)


class _Scope:
    """One limit's state at this gateway."""

    __slots__ = ("base", "limit", "local", "others", "pending", "period", "rpm", "tpm")

    def __init__(self, limit: TenantLimitView, now: float) -> None:
        self.limit = limit
        self.rpm = Bucket(limit.rpm, now) if limit.rpm else None
        self.tpm = Bucket(limit.tpm, now) if limit.tpm else None
        # A budget's tokens this period: the controller's figure (`base`), and this
        # gateway's since (in the batch on its way, `pending`; after it, `local`).
        self.base = self.pending = self.local = 0
        self.period = period_bounds(limit.per, now) if limit.budget and limit.per else None
        self.others: tuple[int, int] | None = None  # the last (requests, tokens) told

    def same(self, limit: TenantLimitView) -> bool:
        """Whether `limit` sets what this one does (who set it and when aside)."""
        mine = self.limit
        return (mine.rpm, mine.tpm, mine.budget, mine.per) == (
            limit.rpm,
            limit.tpm,
            limit.budget,
            limit.per,
        )

    def _roll(self, now: float) -> None:
        if self.period is not None and now >= self.period[1]:
            assert self.limit.per is not None
            self.period = period_bounds(self.limit.per, now)
            self.base = self.pending = self.local = 0

    def refusal(self, now: float) -> Refusal | None:
        limit = self.limit
        on = f" on model {limit.model}" if limit.model else ""
        if self.rpm is not None and (wait := self.rpm.wait_one(now)):
            return Refusal(
                LimitKind.RPM,
                _seconds(wait),
                f"Rate limit reached for tenant {limit.tenant}{on} on requests per minute "
                f"(RPM): limit {limit.rpm}. Please try again in {_seconds(wait)}s.",
            )
        if self.tpm is not None and (wait := self.tpm.wait_any(now)):
            return Refusal(
                LimitKind.TPM,
                _seconds(wait),
                f"Rate limit reached for tenant {limit.tenant}{on} on tokens per minute "
                f"(TPM): limit {limit.tpm}. Please try again in {_seconds(wait)}s.",
            )
        if self.period is not None and limit.budget is not None:
            self._roll(now)
            used = self.base + self.pending + self.local
            if used >= limit.budget:
                wait = self.period[1] - now
                return Refusal(
                    LimitKind.BUDGET,
                    _seconds(wait),
                    f"Token budget of tenant {limit.tenant}{on} used up: {used} of "
                    f"{limit.budget} tokens this {limit.per} (UTC); it starts again at "
                    f"{time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(self.period[1]))}.",
                )
        return None

    def spent(self, tokens: int, now: float) -> None:
        if self.tpm is not None:
            self.tpm.take(tokens, now)
        if self.period is not None:
            self._roll(now)
            self.local += tokens


class Limiter:
    def __init__(self) -> None:
        self._scopes: dict[Scope, _Scope] = {}
        self._by_tenant: dict[str, list[_Scope]] = {}
        self._run = ""  # the controller run the `others` figures are totals of

    def __bool__(self) -> bool:
        return bool(self._scopes)

    def set_limits(self, limits: Iterable[TenantLimitView], now: float | None = None) -> None:
        """The limits as the controller has them now; a scope whose limit did not
        change keeps what it counted."""
        now = time.time() if now is None else now
        scopes: dict[Scope, _Scope] = {}
        for limit in limits:
            scope = (limit.tenant, limit.model)
            old = self._scopes.get(scope)
            scopes[scope] = old if old is not None and old.same(limit) else _Scope(limit, now)
            scopes[scope].limit = limit
        by_tenant: dict[str, list[_Scope]] = {}
        for (tenant, _), s in scopes.items():
            by_tenant.setdefault(tenant, []).append(s)
        self._scopes, self._by_tenant = scopes, by_tenant

    def check(self, tenant: str, model: str, now: float | None = None) -> Refusal | None:
        """None and the request counted, or why it is refused (the longest wait of
        the limits it is over)."""
        scopes = self._by_tenant.get(tenant)
        if not scopes:
            return None
        now = time.time() if now is None else now
        worst: Refusal | None = None
        applies = [s for s in scopes if s.limit.model is None or s.limit.model == model]
        for s in applies:
            r = s.refusal(now)
            if r is not None and (worst is None or r.retry_after_s > worst.retry_after_s):
                worst = r
        if worst is None:
            for s in applies:
                if s.rpm is not None:
                    s.rpm.take(1, now)
        return worst

    def spent(self, tenant: str, model: str, tokens: int, now: float | None = None) -> None:
        """A request's tokens, once its answer ended."""
        scopes = self._by_tenant.get(tenant)
        if not scopes or not tokens:
            return
        now = time.time() if now is None else now
        for s in scopes:
            if s.limit.model is None or s.limit.model == model:
                s.spent(tokens, now)

    def cut(self) -> None:
        """A batch of this gateway's counts leaves for the controller: the budget
        tokens in it are on their way."""
        for s in self._scopes.values():
            s.pending += s.local
            s.local = 0

    def shared(self, answer: UsageAnswer, now: float | None = None) -> None:
        """The controller's answer to the batch last cut: what the other gateways
        spent, and the budgets' tokens so far (that batch included)."""
        now = time.time() if now is None else now
        same_run = answer.run == self._run
        self._run = answer.run
        for share in answer.shares:
            s = self._scopes.get((share.tenant, share.model))
            if s is None:
                continue
            told = (share.others_requests, share.others_tokens)
            if same_run and s.others is not None:
                requests = told[0] - s.others[0]
                tokens = told[1] - s.others[1]
                if s.rpm is not None and requests > 0:
                    s.rpm.take(requests, now)
                if s.tpm is not None and tokens > 0:
                    s.tpm.take(tokens, now)
            s.others = told
            if share.budget_used is not None and s.period is not None:
                s.base, s.pending = share.budget_used, 0
