"""Every error that crosses llmgw's admin API, in one tree.

    LlmgwError
    ├── ServerError               raised in the controller, answered as {"error": message}
    │   ├── BadRequest            400  the request cannot be taken as sent (+ field detail)
    │   │   └── BadCursor         400  `since` is not a cursor from an earlier answer
    │   ├── ClientGone            400  the client left before its body arrived
    │   ├── NotAuthenticated      401  no token, or one this controller does not take
    │   │   └── TokenSpent        401  an enrollment token expired or used up
    │   ├── PermissionDenied      403  a token or credential that may not do this
    │   ├── Unknown               404  the name is nothing this controller knows
    │   │   ├── UnknownNode       404
    │   │   ├── UnknownModel      404
    │   │   ├── UnknownEnrollToken 404
    │   │   ├── UnknownClientKey  404
    │   │   └── UnknownLimit      404
    │   ├── SlowBody              408  the body arrived slower than the body timeout
    │   ├── Conflict              409  valid, but the object's state refuses it
    │   │   ├── AwaitsApproval    409  an uncordon of a node that awaits approval
    │   │   ├── AlreadyEnrolled   409  the node holds a credential already
    │   │   ├── EnrollNotAllowed  409  the node reported before and holds no allowance
    │   │   ├── NotRevocable      409  a credential from --agent-token-file
    │   │   ├── TooManyTokens     409  the enrollment tokens kept are at their bound
    │   │   ├── TooManyKeys       409  the client keys kept are at their bound
    │   │   └── TooManyLimits     409  the tenant limits kept are at their bound
    │   ├── TooLarge              413  the body is over the size limit
    │   ├── CompressedBody        415  a compressed body, refused before it is read
    │   ├── TooMany               429  past a rate or a bound (+ Retry-After when known)
    │   │   ├── TooManyEnrollments 429 past the enrollment rate
    │   │   └── TooManyGateways   429  past the gateway names kept
    │   └── Unavailable           503  nothing was done; the same request may work later
    │       ├── NotTheLeader      503  a follower: the leader's URL in the body and a header
    │       └── StoreUnavailable  503  a write was not stored; nothing in memory changed
    │           └── Fenced        503  ... because another controller leads (a NotTheLeader too)
    └── ClientError               raised in a client; ADVICE gives its exit code and hint
        ├── UsageError            2  asked for something that cannot be done as asked
        │   └── TlsConfigError    2  a CA file or certificate that cannot be used
        ├── ControllerUnreachable 1  no answer at all: refused, DNS, timeout
        │   └── TlsRefused        1  the controller's certificate did not verify
        ├── BadAnswer             1  an answer this client does not understand
        └── ControllerError       1  the controller answered with an error (status, message)
            ├── NeedsToken        401  no token, or one the controller does not know
            ├── WrongToken        403  a token of a kind that may not do this
            ├── NotFound          404  the name is nothing the controller knows
            ├── NoLeader          503  only followers answered: a failover is under way
            ├── ControllerFailing 5xx  the controller failed; its log says why
            └── NotAController         something answers at the URL, not a controller

Every refusal the controller gives is a server error raised where the refusal is
decided (a handler, the facts, the store, the auth middleware): it carries its
status, its body and its headers, so the controller's front middleware maps them
all in one clause and no handler builds an error answer. A client error is shown
as its message plus the hint from ADVICE, the one table ctl's exit codes and the
console's advice read.

Signals that never reach an answer stay beside their code: the change log's
`HistoryLost` (a view resyncs), the store's `StateError` (the controller does not
start) and its rolled-back `_Spent`.

Importing this module loads nothing beyond the standard library (ctl starts fast).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

from llmgw.leader import LEADER_HEADER, NOT_THE_LEADER


class LlmgwError(Exception):
    """The root: `except LlmgwError` catches everything below and nothing else."""


# -- the controller's side -----------------------------------------------------------


class ServerError(LlmgwError):
    """An answer the controller gives: `status`, `message`, and for 400s the fields
    at fault. `close`: the connection is closed after the answer."""

    status: ClassVar[int] = 500
    close: ClassVar[bool] = False

    def __init__(self, message: str, detail: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def body(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"error": self.message}
        if self.detail:
            payload["detail"] = self.detail
        return payload

    def headers(self) -> dict[str, str] | None:
        return None


class BadRequest(ServerError):
    status = 400


class BadCursor(BadRequest):
    def __init__(self, cursor: str) -> None:
        shown = cursor if len(cursor) <= 40 else cursor[:40] + "…"
        super().__init__(
            "`since` must be the cursor from an earlier answer (EPOCH.REVISION, e.g."
            f" 9f2c01ab.42), or empty for every node; got {shown!r}"
        )
        self.cursor = cursor


class ClientGone(ServerError):
    """Answered for the access log only: the connection is already gone. Not a
    BadRequest: the request was never seen, so it was not refused."""

    status = 400
    close = True

    def __init__(self) -> None:
        super().__init__("the client closed the connection before its body arrived")


class NotAuthenticated(ServerError):
    status = 401


class TokenSpent(NotAuthenticated):
    """`why`: the token and how it is spent (llmgw.controller.state.enroll_tokens.why_spent)."""

    def __init__(self, why: str) -> None:
        super().__init__(f"{why}: ask an admin for a new one (llmgw ctl credentials token create)")


class PermissionDenied(ServerError):
    status = 403


class Unknown(ServerError):
    status = 404


class UnknownNode(Unknown):
    def __init__(self, name: str) -> None:
        super().__init__(f"no node named {name!r} has ever reported to this controller")
        self.name = name


class UnknownModel(Unknown):
    def __init__(self, name: str) -> None:
        super().__init__(f"no model named {name!r} is declared")
        self.name = name


class UnknownEnrollToken(Unknown):
    def __init__(self, token_id: str) -> None:
        super().__init__(
            f"no enrollment token {token_id[:20]!r} (llmgw ctl credentials token list)"
        )


class UnknownClientKey(Unknown):
    def __init__(self, key_id: str) -> None:
        super().__init__(f"no client key {key_id[:20]!r} (llmgw ctl keys list)")


class UnknownLimit(Unknown):
    def __init__(self, tenant: str, model: str | None) -> None:
        on = f" on model {model[:80]!r}" if model else ""
        super().__init__(f"no limit of tenant {tenant[:64]!r}{on} (llmgw ctl limits list)")


class SlowBody(ServerError):
    status = 408
    close = True


class Conflict(ServerError):
    """The request is valid but the object's state refuses it."""

    status = 409


class AwaitsApproval(Conflict):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"node {name!r} awaits approval, not an uncordon: "
            f"`llmgw ctl credentials approve {name}` lets it take replicas"
        )


class AlreadyEnrolled(Conflict):
    """`source`: "enrolled" (revocable) or "file" (--agent-token-file)."""

    def __init__(self, node: str, source: str) -> None:
        how = (
            f"revoke it first (`llmgw ctl credentials revoke {node}`) to enroll it again"
            if source == "enrolled"
            else "it is configured in --agent-token-file"
        )
        super().__init__(f"node {node!r} already holds a credential; {how}")


class EnrollNotAllowed(Conflict):
    """A name that has reported before, not allowed to enroll by an admin."""

    def __init__(self, node: str) -> None:
        super().__init__(
            f"node {node!r} has reported to this controller before: an enrollment could "
            "take it over, so an admin must allow it first "
            f"(`llmgw ctl credentials allow {node}`)"
        )


class NotRevocable(Conflict):
    def __init__(self, node: str) -> None:
        super().__init__(
            f"node {node!r}'s credential is configured in --agent-token-file: "
            "remove its line and restart the controller"
        )


class TooManyTokens(Conflict):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"{limit} enrollment tokens are kept already: delete some "
            "(`llmgw ctl credentials token delete ID`; `token list` shows the spent ones)"
        )


class TooManyKeys(Conflict):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"{limit} client keys are kept already: revoke some "
            "(`llmgw ctl keys revoke ID`; `keys list` shows the expired ones)"
        )


class TooManyLimits(Conflict):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"{limit} tenant limits are kept already: delete some (`llmgw ctl limits delete`)"
        )


class TooLarge(ServerError):
    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body too large: the limit is {limit} bytes")


class CompressedBody(ServerError):
    """Refused before anything reads it (llmgw.controller.http.bodies): the rest of the
    body is not read, so the connection closes."""

    status = 415
    close = True

    def __init__(self, coding: str) -> None:
        super().__init__(
            f"compressed request bodies are refused (Content-Encoding: {coding}); "
            "send the body uncompressed"
        )


class TooMany(ServerError):
    """`retry_after_s`: when the same request may pass, where that is known."""

    status = 429

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str] | None:
        if self.retry_after_s is None:
            return None
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}  # whole seconds


class TooManyEnrollments(TooMany):
    def __init__(self, rate: float, retry_after_s: float) -> None:
        super().__init__(
            f"too many enrollments (at most {rate:g} per second): try again shortly",
            retry_after_s,
        )


class TooManyGateways(TooMany):
    """A status under a new gateway name past the bound: refused, nothing kept."""


class Unavailable(ServerError):
    status = 503


class NotTheLeader(Unavailable):
    """A follower's answer: the leader's URL (when one leads) in the body and in the
    X-LLMGW-Leader header, which every client follows (llmgw.leader)."""

    def __init__(self, leader: str | None, why: str | None = None) -> None:
        super().__init__(NOT_THE_LEADER)
        self.leader = leader
        self.why = why

    def body(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"error": NOT_THE_LEADER, "leader": self.leader}
        if self.why:
            payload["why"] = self.why
        return payload

    def headers(self) -> dict[str, str] | None:
        return {LEADER_HEADER: self.leader} if self.leader else None


class StoreUnavailable(Unavailable):
    """A write was not stored (message names the cause); nothing in memory changed."""


class Fenced(StoreUnavailable, NotTheLeader):
    """A write refused because this controller does not hold the leader's lease (any
    more): `leader` is the URL of the controller that does, when one does. Answered
    as a follower answers, with the store's words as `why`."""

    def __init__(self, message: str, leader: str | None) -> None:
        ServerError.__init__(self, message)
        self.leader = leader
        self.why = message


# -- the clients' side ---------------------------------------------------------------


class ClientError(LlmgwError):
    """What a client (ctl, the console) shows a person: see `advice`."""


class UsageError(ClientError):
    """The user asked for something that cannot be done as asked; nothing was sent."""


class TlsConfigError(UsageError, ValueError):
    """A CA file, certificate or key that cannot be used (a ValueError for old callers)."""


class ControllerUnreachable(ClientError):
    """No answer at all: connection refused, DNS, timeout, a certificate not trusted."""

    def __init__(self, url: str, cause: Exception) -> None:
        super().__init__(f"cannot reach the controller at {url}: {_first_line(cause)}")
        self.url = url
        self.cause = cause


class TlsRefused(ControllerUnreachable):
    """The certificate did not verify; `cause` (a TlsConfigError) says what to do."""


class BadAnswer(ClientError):
    """The controller answered 2xx with something this client cannot read."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"the answer from {url} was not understood: {why}")
        self.url = url


class ControllerError(ClientError):
    """The controller answered with an error; `message` is its own words.

    Build one with `controller_error(status, ...)`: it picks the class by status."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.url = url


class NeedsToken(ControllerError):
    """401."""


class WrongToken(ControllerError):
    """403."""


class NotFound(ControllerError):
    """404."""


class NoLeader(ControllerError):
    """503 from every controller asked, each a follower."""


class ControllerFailing(ControllerError):
    """5xx other than "not the leader"."""


class NotAController(ControllerError):
    """Something answered at the URL, but not an llmgw controller."""


_BY_STATUS: dict[int, type[ControllerError]] = {401: NeedsToken, 403: WrongToken, 404: NotFound}


def error_class(status: int) -> type[ControllerError]:
    """The client error for an answer with this status."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ControllerFailing if status >= 500 else ControllerError


def controller_error(status: int, message: str, url: str) -> ControllerError:
    return error_class(status)(status, message, url)


# -- what a person does about a client error: one table -------------------------------

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Advice(NamedTuple):
    exit_code: int
    hint: str  # what to do next; "" where the message says it already


_TOKEN_SOURCES = "--token, --token-file or LLMGW_TOKEN, or a context's token-file"

ADVICE: dict[type[ClientError], Advice] = {
    UsageError: Advice(EXIT_USAGE, ""),  # the message names the flag to fix
    TlsConfigError: Advice(EXIT_USAGE, "check --ca-file (or LLMGW_CA_FILE)"),
    ControllerUnreachable: Advice(
        EXIT_FAILED, "check that `llmgw controller` runs and --controller points at it"
    ),
    TlsRefused: Advice(EXIT_FAILED, ""),  # the cause names the check that failed and the fix
    BadAnswer: Advice(
        EXIT_FAILED, "this client may not match the controller's version (llmgw --version)"
    ),
    ControllerError: Advice(EXIT_FAILED, ""),  # a refusal: the controller's words say why
    NeedsToken: Advice(
        EXIT_FAILED,
        f"pass a valid token with {_TOKEN_SOURCES} "
        "(`llmgw ctl config view` shows which is used; a read token is enough to look)",
    ),
    WrongToken: Advice(
        EXIT_FAILED,
        f"use a token of the kind it names (read to look, admin to change): {_TOKEN_SOURCES}",
    ),
    NotFound: Advice(EXIT_FAILED, ""),  # "no node named …": nothing more to say
    NoLeader: Advice(EXIT_FAILED, ""),  # the message says to wait for the failover
    ControllerFailing: Advice(EXIT_FAILED, "the controller's log says why"),
    NotAController: Advice(EXIT_FAILED, ""),  # the message names --controller
}


def advice(error: type[ClientError] | ClientError) -> Advice:
    """The exit code and hint of a client error (the nearest class in ADVICE)."""
    cls = error if isinstance(error, type) else type(error)
    for klass in cls.__mro__:
        if klass in ADVICE:
            return ADVICE[klass]
    raise KeyError(cls)  # every ClientError is below an entry: a test checks each


def explain(error: ClientError) -> str:
    """The one line a person reads: what happened, then what to do next."""
    text = error.message if isinstance(error, ControllerError) else str(error)
    hint = advice(error).hint
    return f"{text}; {hint}" if hint else text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
