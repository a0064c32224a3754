"""Tokens metered per tenant and model: the gateways' batches, stored by the hour,
and what each gateway is told back about its tenants' limits.

Each gateway posts what it counted about every second (`POST /v1/gateways/usage`,
gateway/sync.py). A batch is added to the store's hourly counts in one
transaction with the gateway's batch mark (its run and sequence number), so a
batch sent again after its answer was lost, to this controller or to the next
leader, counts once; nothing a gateway was answered for is lost to a restart or a
failover. Counts are kept `RETENTION_S`, trimmed once an hour.

The answer tells the gateway, for each limited scope, what the other gateways
spent (running totals of this term's) and each budget's tokens so far in its
period, every gateway's: the store's sum for the period when the term first needs
it, and each batch after. Only scopes whose figures changed since the gateway was
last told are sent.

This term's totals per (tenant, model) are the Prometheus counters
(`llmgw_tenant_*_total`, metrics.py): counted here rather than at each gateway, one
series per tenant and model for the whole fleet, bounded by the keys and the
declared models, carried from term to term within a process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmgw.controller.core.records import TenantLimit, UsageCount
from llmgw.controller.state.limits import Limits
from llmgw.controller.store.base import StateStore
from llmgw.tenant_limits import Scope, period_bounds
from llmgw.wire import LimitShare, UsageAnswer, UsageBatch, UsageRow

HOUR_S = 3600.0
RETENTION_S = 400 * 86_400.0  # 13 months: a year of history, and this month's budgets
MAX_GATEWAYS = 1024  # gateways whose running totals are kept (the oldest go first)

Totals = dict[tuple[str, str], list[int]]  # (tenant, model) -> the five counts
_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "errors", "rate_limited")


def hour_of(t: float) -> float:
    return t - t % HOUR_S


def rows_of(counts: Iterable[UsageCount], by: tuple[str, ...]) -> list[UsageRow]:
    """`counts` summed over what `by` leaves out (`tenant`, `model`; "" for a
    column summed over), largest token count first."""
    sums: dict[tuple[str, str], list[int]] = {}
    for c in counts:
        key = (c.tenant if "tenant" in by else "", c.model if "model" in by else "")
        into = sums.setdefault(key, [0] * len(_FIELDS))
        for i, name in enumerate(_FIELDS):
            into[i] += getattr(c, name)
    rows = [
        UsageRow(tenant=t, model=m, **dict(zip(_FIELDS, v, strict=True)))
        for (t, m), v in sums.items()
    ]
    rows.sort(key=lambda r: (-(r.prompt_tokens + r.completion_tokens), r.tenant, r.model))
    return rows


@dataclass
class _Gateway:
    run: str  # the gateway process's
    spent: dict[Scope, list[int]] = field(default_factory=dict)  # [requests, tokens] sent
    told: dict[Scope, tuple[int, int, int | None]] = field(default_factory=dict)


class Usage:
    def __init__(self, store: StateStore, run: str, limits: Limits) -> None:
        self._store = store
        self._run = run
        self._limits = limits
        self.totals: Totals = {}  # this term's, and the terms' before in this process
        self._fleet: dict[Scope, list[int]] = {}  # limited scope -> [requests, tokens]
        self._gateways: OrderedDict[str, _Gateway] = OrderedDict()  # the newest last
        self._budgets: dict[Scope, tuple[float, int]] = {}  # scope -> (period start, used)
        self._trimmed_hour = 0.0

    def carry(self, before: Usage) -> None:
        """The term before's totals go on (a counter never goes back)."""
        self.totals = {k: list(v) for k, v in before.totals.items()}

    def ingest(self, batch: UsageBatch, now: float) -> UsageAnswer:
        limits = self._limits.scopes()
        self._load_budgets(limits, now)  # before the batch is stored: counted once
        gateway = self._gateways.pop(batch.name, None)
        if gateway is None or gateway.run != batch.run:
            gateway = _Gateway(batch.run, gateway.spent if gateway else {})
        self._gateways[batch.name] = gateway
        while len(self._gateways) > MAX_GATEWAYS:
            self._gateways.popitem(last=False)
        counts = [
            UsageCount(hour_of(now), r.tenant, r.model, *(getattr(r, f) for f in _FIELDS))
            for r in batch.rows
        ]
        if counts:
            if self._store.add_usage(batch.name, batch.run, batch.seq, counts, at=now):
                self._count(gateway, counts, limits)
            else:  # counted before: its answer was lost, so tell everything again
                gateway.told.clear()
        if hour_of(now) != self._trimmed_hour:
            self._trimmed_hour = hour_of(now)
            self._store.trim_usage(self._trimmed_hour - RETENTION_S, now=now)
        return UsageAnswer(run=self._run, shares=self._shares(gateway, limits))

    def _count(
        self, gateway: _Gateway, counts: list[UsageCount], limits: dict[Scope, TenantLimit]
    ) -> None:
        for c in counts:
            into = self.totals.setdefault((c.tenant, c.model), [0] * len(_FIELDS))
            for i, name in enumerate(_FIELDS):
                into[i] += getattr(c, name)
            tokens = c.prompt_tokens + c.completion_tokens
            for scope in ((c.tenant, None), (c.tenant, c.model)):
                limit = limits.get(scope)
                if limit is None:
                    continue
                for figures in (self._fleet, gateway.spent):
                    f = figures.setdefault(scope, [0, 0])
                    f[0] += c.requests
                    f[1] += tokens
                if limit.budget is not None and scope in self._budgets:
                    start, used = self._budgets[scope]
                    self._budgets[scope] = (start, used + tokens)

    def _load_budgets(self, limits: dict[Scope, TenantLimit], now: float) -> None:
        """Each budget's tokens so far in its period, from the store, where this term
        has not read them for the period yet."""
        sums: dict[float, list[UsageCount]] = {}
        for scope, limit in limits.items():
            if limit.budget is None or limit.per is None:
                continue
            start = period_bounds(limit.per, now)[0]
            known = self._budgets.get(scope)
            if known is not None and known[0] == start:
                continue
            if start not in sums:
                sums[start] = self._store.usage_sums(start)
            tenant, model = scope
            used = sum(
                c.prompt_tokens + c.completion_tokens
                for c in sums[start]
                if c.tenant == tenant and (model is None or c.model == model)
            )
            self._budgets[scope] = (start, used)

    def _shares(self, gateway: _Gateway, limits: dict[Scope, TenantLimit]) -> list[LimitShare]:
        shares = []
        for scope, limit in limits.items():
            fleet, own = self._fleet.get(scope, [0, 0]), gateway.spent.get(scope, [0, 0])
            budget = self._budgets.get(scope) if limit.budget is not None else None
            figures = (fleet[0] - own[0], fleet[1] - own[1], None if budget is None else budget[1])
            if gateway.told.get(scope) == figures:
                continue
            gateway.told[scope] = figures
            shares.append(
                LimitShare(
                    tenant=scope[0],
                    model=scope[1],
                    others_requests=figures[0],
                    others_tokens=figures[1],
                    budget_used=figures[2],
                )
            )
        return shares

    def report(self, since: float, by: tuple[str, ...]) -> list[UsageRow]:
        """`ctl usage`: the counts from the hour `since` falls in, summed by `by`."""
        return rows_of(self._store.usage_sums(hour_of(since)), by)
