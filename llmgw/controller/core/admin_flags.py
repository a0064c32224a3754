"""What a node's admin flag says: the flags an operator sets (cordon, drain,
uncordon), the cordon llmgw sets itself, and what awaiting approval shows.

Pure constructors of `AdminInfo`: `Facts` (facts.py) decides and writes them.
"""

from __future__ import annotations

from llmgw.wire import AdminFlag, AdminInfo

# Who the admin history names for what llmgw decides by itself (a drain done or
# forced, a cordon for a failed card), never an operator's name.
BY_LLMGW = "llmgw"
AWAITING_APPROVAL = "awaiting approval: llmgw ctl credentials approve NODE"
NO_ADMIN = AdminInfo()  # shared, never mutated: built once, not once per report
ACTIONS = {AdminFlag.NONE: "uncordon", AdminFlag.CORDONED: "cordon", AdminFlag.DRAINING: "drain"}


def awaiting(enrolled_at: float) -> AdminInfo:
    """What a node awaiting approval shows: one reason for all, so that `ctl status`
    lists them as one group, as `sinfo -R` does."""
    return AdminInfo(
        flag=AdminFlag.CORDONED,
        reason=AWAITING_APPROVAL,
        by=BY_LLMGW,
        at=enrolled_at,
        awaiting_approval=True,
    )


def flag_info(
    flag: AdminFlag,
    reason: str | None,
    by: str,
    at: float,
    *,
    force: bool = False,
    force_after_s: float | None = None,
) -> AdminInfo:
    """An operator's flag. A drain with `force_after_s` is forced by the reconcile
    loop that many seconds after `at` unless done first."""
    if flag is AdminFlag.NONE:
        return AdminInfo()
    force_at = (
        at + force_after_s
        if flag is AdminFlag.DRAINING and force_after_s is not None and not force
        else None
    )
    return AdminInfo(flag=flag, reason=reason, by=by, at=at, force=force, force_at=force_at)


def drained(old: AdminInfo) -> AdminInfo:
    """A drain finished: the node stays cordoned, marked as drained."""
    return AdminInfo(flag=AdminFlag.CORDONED, reason=old.reason, by=old.by, at=old.at, drained=True)
