"""Tenants' limits at a gateway, in process and on a made-up clock: token buckets,
budget periods, and what the controller says the other gateways spent."""

from __future__ import annotations

import calendar

import pytest

from llmgw.gateway.limits import Limiter
from llmgw.tenant_limits import Bucket, LimitKind, period_bounds
from llmgw.wire import LimitShare, TenantLimitView, UsageAnswer

T0 = float(calendar.timegm((2026, 12, 6, 12, 0, 0)))


def limiter(*limits: TenantLimitView) -> Limiter:
    lim = Limiter()
    lim.set_limits(limits, now=T0)
    return lim


def test_periods_are_utc_days_and_months() -> None:
    assert period_bounds("day", T0) == (
        calendar.timegm((2026, 12, 6, 0, 0, 0)),
        calendar.timegm((2026, 12, 7, 0, 0, 0)),
    )
    assert period_bounds("month", T0) == (
        calendar.timegm((2026, 12, 1, 0, 0, 0)),
        calendar.timegm((2027, 1, 1, 0, 0, 0)),
    )
    feb = calendar.timegm((2028, 2, 29, 23, 59, 59))
    assert period_bounds("month", feb)[1] == calendar.timegm((2028, 3, 1, 0, 0, 0))
    with pytest.raises(ValueError):
        period_bounds("week", T0)


def test_a_bucket_holds_a_minute_and_refills_continuously() -> None:
    b = Bucket(60, T0)
    for _ in range(60):
        assert b.wait_one(T0) == 0
        b.take(1, T0)
    assert b.wait_one(T0) == pytest.approx(1.0)
    assert b.wait_one(T0 + 1) == 0  # one a second
    assert b.wait_one(T0 + 3600) == 0 and b.level == 60  # never above a minute's worth
    tokens = Bucket(600, T0)
    tokens.take(900, T0)  # taken after the fact: below zero
    assert tokens.wait_any(T0) == pytest.approx(30.0, abs=0.01)


def test_requests_per_minute_refused_with_when_to_come_back() -> None:
    lim = limiter(TenantLimitView(tenant="acme", rpm=2))
    assert lim.check("acme", "m", now=T0) is None
    assert lim.check("acme", "other", now=T0) is None  # a tenant's limit: all its models
    refused = lim.check("acme", "m", now=T0)
    assert refused is not None and refused.kind is LimitKind.RPM
    assert refused.retry_after_s == 30 and "requests per minute" in refused.message
    assert lim.check("beta", "m", now=T0) is None  # another tenant is untouched
    assert lim.check("acme", "m", now=T0 + 30) is None


def test_tokens_per_minute_and_a_model_s_own_limit() -> None:
    lim = limiter(
        TenantLimitView(tenant="acme", tpm=1000), TenantLimitView(tenant="acme", model="big", rpm=1)
    )
    assert lim.check("acme", "big", now=T0) is None
    refused = lim.check("acme", "big", now=T0)
    assert (
        refused is not None and refused.kind is LimitKind.RPM and "on model big" in refused.message
    )
    assert lim.check("acme", "small", now=T0) is None
    lim.spent("acme", "small", 1500, now=T0)  # over: the next waits until it is paid back
    refused = lim.check("acme", "small", now=T0)
    assert refused is not None and refused.kind is LimitKind.TPM and refused.retry_after_s == 30


def test_a_budget_holds_until_its_period_ends() -> None:
    lim = limiter(TenantLimitView(tenant="acme", budget=100, per="day"))
    lim.spent("acme", "m", 99, now=T0)
    assert lim.check("acme", "m", now=T0) is None
    lim.spent("acme", "m", 1, now=T0)
    refused = lim.check("acme", "m", now=T0)
    assert refused is not None and refused.kind is LimitKind.BUDGET
    assert refused.retry_after_s == 12 * 3600  # at midnight UTC
    assert "2026-12-07 00:00:00Z" in refused.message
    assert lim.check("acme", "m", now=T0 + 12 * 3600) is None  # a new day


def test_the_other_gateways_spend_counts_here_too() -> None:
    lim = limiter(
        TenantLimitView(tenant="acme", rpm=10), TenantLimitView(tenant="beta", budget=50, per="day")
    )
    share = LimitShare(tenant="acme", others_requests=100, others_tokens=0)
    lim.shared(UsageAnswer(run="r1", shares=[share]), now=T0)  # a first answer: the baseline
    assert lim.check("acme", "m", now=T0) is None
    share = LimitShare(tenant="acme", others_requests=109, others_tokens=0)
    lim.shared(UsageAnswer(run="r1", shares=[share]), now=T0)  # nine more elsewhere
    refused = lim.check("acme", "m", now=T0)
    assert refused is not None and refused.kind is LimitKind.RPM
    # A new controller run: its totals start again, a baseline and no debt.
    lim.shared(UsageAnswer(run="r2", shares=[LimitShare(tenant="acme")]), now=T0 + 60)
    assert lim.check("acme", "m", now=T0 + 60) is None
    # A budget: the controller's figure for the period, plus what is counted here since.
    lim.spent("beta", "m", 10, now=T0)
    lim.cut()  # ... sent in a batch
    lim.spent("beta", "m", 10, now=T0)
    lim.shared(UsageAnswer(run="r2", shares=[LimitShare(tenant="beta", budget_used=35)]), now=T0)
    assert lim.check("beta", "m", now=T0) is None  # 35 + 10 < 50
    lim.spent("beta", "m", 5, now=T0)
    refused = lim.check("beta", "m", now=T0)
    assert (
        refused is not None and refused.kind is LimitKind.BUDGET and "50 of 50" in refused.message
    )


def test_a_limit_that_did_not_change_keeps_its_counts() -> None:
    lim = limiter(TenantLimitView(tenant="acme", rpm=1))
    assert lim.check("acme", "m", now=T0) is None
    lim.set_limits([TenantLimitView(tenant="acme", rpm=1, by="x", at=5)], now=T0)
    assert lim.check("acme", "m", now=T0) is not None
    lim.set_limits([TenantLimitView(tenant="acme", rpm=5)], now=T0)  # changed: a new bucket
    assert lim.check("acme", "m", now=T0) is None
    lim.set_limits([], now=T0)
    assert not lim and lim.check("acme", "m", now=T0) is None
