"""The store's tenant tables: tokens metered per tenant and model by the hour, the
gateways' last batch counted, and tenants' limits (schema 11 and 12). Mixed into
`SqlStore`, whose `_tx` and `_read` they run on."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager

from llmgw.controller.core.records import TenantLimit, UsageCount
from llmgw.controller.store.session import Params, Row, Session

USAGE_COLUMNS = "requests, prompt_tokens, completion_tokens, errors, rate_limited"
_USAGE_ADD = (
    f"INSERT INTO tenant_usage(hour, tenant, model, {USAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (hour, tenant, model) DO UPDATE SET"
    " requests = tenant_usage.requests + excluded.requests,"
    " prompt_tokens = tenant_usage.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = tenant_usage.completion_tokens + excluded.completion_tokens,"
    " errors = tenant_usage.errors + excluded.errors,"
    " rate_limited = tenant_usage.rate_limited + excluded.rate_limited"
)
_BATCH_MARK = (
    "INSERT INTO usage_batches(gateway, run, seq, at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (gateway) DO UPDATE SET run=excluded.run, seq=excluded.seq, at=excluded.at"
)
_LIMIT_UPSERT = (
    "INSERT INTO tenant_limits(tenant, model, rpm, tpm, budget, per, by, at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, model) DO UPDATE SET"
    " rpm=excluded.rpm, tpm=excluded.tpm, budget=excluded.budget, per=excluded.per,"
    " by=excluded.by, at=excluded.at"
)
# A gateway's batch mark outlives its last batch this long (a gateway gone a day
# sends nothing again under the same run).
BATCH_MARK_KEPT_S = 86_400.0


def usage_row(u: UsageCount) -> tuple[object, ...]:
    return (
        u.hour,
        u.tenant,
        u.model,
        u.requests,
        u.prompt_tokens,
        u.completion_tokens,
        u.errors,
        u.rate_limited,
    )


def _limit_row(k: TenantLimit) -> tuple[object, ...]:
    return (k.tenant, k.model or "", k.rpm, k.tpm, k.budget, k.per, k.by, k.at)


def _limit_from_row(r: Row) -> TenantLimit:
    return TenantLimit(
        tenant=r["tenant"],
        model=r["model"] or None,
        rpm=r["rpm"],
        tpm=r["tpm"],
        budget=r["budget"],
        per=r["per"],
        by=r["by"],
        at=r["at"],
    )


def _count_from_row(r: Row, hour: float) -> UsageCount:
    return UsageCount(
        hour=hour,
        tenant=r["tenant"],
        model=r["model"],
        requests=int(r["requests"]),
        prompt_tokens=int(r["prompt_tokens"]),
        completion_tokens=int(r["completion_tokens"]),
        errors=int(r["errors"]),
        rate_limited=int(r["rate_limited"]),
    )


class TenantTables:
    """Every method is one transaction."""

    def _tx(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def _read(self, query: str, params: Params = ()) -> list[Row]:
        raise NotImplementedError

    # -- usage ------------------------------------------------------------------------

    def add_usage(
        self, gateway: str, run: str, seq: int, counts: Iterable[UsageCount], *, at: float
    ) -> bool:
        """Add a gateway's batch to the hourly counts, once: False (and nothing
        written) when batch `seq` of its `run` or a later one was counted before."""
        with self._tx() as s:
            seen = s.rows("SELECT run, seq FROM usage_batches WHERE gateway = ?", (gateway,))
            if seen and seen[0]["run"] == run and int(seen[0]["seq"]) >= seq:
                return False
            s.run_many(_USAGE_ADD, [usage_row(u) for u in counts])
            s.run(_BATCH_MARK, (gateway, run, seq, at))
            return True

    def usage_sums(self, since: float, until: float | None = None) -> list[UsageCount]:
        """Counts per (tenant, model) over the hours from `since` (up to `until`),
        each dated `since`."""
        query = (
            f"SELECT tenant, model, SUM(requests) AS requests,"
            f" SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens,"
            f" SUM(errors) AS errors, SUM(rate_limited) AS rate_limited"
            f" FROM tenant_usage WHERE hour >= ?{' AND hour < ?' if until is not None else ''}"
            " GROUP BY tenant, model ORDER BY tenant, model"
        )
        params: tuple[object, ...] = (since,) if until is None else (since, until)
        return [_count_from_row(r, since) for r in self._read(query, params)]

    def usage_counts(self) -> Iterator[UsageCount]:
        """Every hourly count (for `migrate`)."""
        for r in self._read(
            f"SELECT hour, tenant, model, {USAGE_COLUMNS} FROM tenant_usage"
            " ORDER BY hour, tenant, model"
        ):
            yield _count_from_row(r, r["hour"])

    def trim_usage(self, before: float, *, now: float) -> None:
        """Forget the hours before `before` (the retention), and marks of gateways
        gone a day."""
        with self._tx() as s:
            s.run("DELETE FROM tenant_usage WHERE hour < ?", (before,))
            s.run("DELETE FROM usage_batches WHERE at < ?", (now - BATCH_MARK_KEPT_S,))

    # -- limits ---------------------------------------------------------------------------

    def limits(self) -> list[TenantLimit]:
        rows = self._read("SELECT * FROM tenant_limits ORDER BY tenant, model")
        return [_limit_from_row(r) for r in rows]

    def put_limit(self, limit: TenantLimit) -> None:
        with self._tx() as s:
            s.run(_LIMIT_UPSERT, _limit_row(limit))

    def delete_limit(self, tenant: str, model: str | None) -> bool:
        with self._tx() as s:
            n = s.run(
                "DELETE FROM tenant_limits WHERE tenant = ? AND model = ?", (tenant, model or "")
            )
            return n > 0

    def load_tenants(
        self, s: Session, limits: Iterable[TenantLimit], usage: Iterable[UsageCount]
    ) -> None:
        """A dump's limits and counts, inside `load`'s transaction."""
        s.run_many(_LIMIT_UPSERT, [_limit_row(k) for k in limits])
        s.run_many(_USAGE_ADD, [usage_row(u) for u in usage])
