"""Tenants' limits, as both the controller and the gateways read them.

A limit's scope is a tenant (every model of it together) or a tenant on one model;
both hold when both exist. Requests and tokens per minute are token buckets that
refill continuously (a minute's worth held at most, so a quiet tenant may burst
that much); a budget is tokens per UTC day or month, starting again at the
period's first second. Tokens are a request's prompt and completion together,
counted when its answer ends: a request is let through while its scope has any
tokens left, and what it costs is taken after (the overshoot is the tokens of the
requests in flight when the limit is reached).
"""

from __future__ import annotations

import calendar
import time
from enum import StrEnum

Scope = tuple[str, str | None]  # (tenant, model or None: all its models)


class LimitKind(StrEnum):
    """Which limit refused a request (the 429's `x-llmgw-limit` header: data)."""

    RPM = "rpm"
    TPM = "tpm"
    BUDGET = "budget"


def period_bounds(per: str, now: float) -> tuple[float, float]:
    """The UTC day or month `now` falls in: (its first second, the next period's)."""
    t = time.gmtime(now)
    if per == "day":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return float(start), float(start + 86_400)
    if per != "month":
        raise ValueError(f"a budget's period is day or month, not {per!r}")
    start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return float(start), float(calendar.timegm((year, month, 1, 0, 0, 0)))


class Bucket:
    """A token bucket: `per_minute` a minute, refilled continuously, holding at most
    a minute's worth. It may go below zero (tokens are taken after the fact)."""

    __slots__ = ("at", "level", "per_minute", "rate")

    def __init__(self, per_minute: int, now: float) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self.level = float(per_minute)
        self.at = now

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.per_minute, self.level + (now - self.at) * self.rate)
            self.at = now

    def wait_one(self, now: float) -> float:
        """Seconds until it holds one whole (a request): 0 when it does now."""
        self._refill(now)
        return 0.0 if self.level >= 1 else (1 - self.level) / self.rate

    def wait_any(self, now: float) -> float:
        """Seconds until it holds anything above zero (tokens): 0 when it does now."""
        self._refill(now)
        return 0.0 if self.level > 0 else (1e-6 - self.level) / self.rate

    def take(self, n: float, now: float) -> None:
        self._refill(now)
        self.level -= n
