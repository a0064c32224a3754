"""Every error that crosses llmgw's admin API, in one tree.

    LlmgwError
    ├── ServerError              raised in the controller, answered as {"error": message}
    │   ├── BadRequest           400  the request cannot be taken as sent (+ field detail)
    │   │   └── BadCursor        400  `since` is not a cursor from an earlier answer
    │   ├── ClientGone           400  the client left before its body arrived
    │   ├── SlowBody             408  the body arrived slower than the body timeout
    │   ├── TooLarge             413  the body is over the size limit
    │   └── Unknown              404  the name is nothing this controller knows
    │       ├── UnknownNode
    │       └── UnknownModel
    └── ClientError              raised in a client; ADVICE gives its exit code and hint
        ├── UsageError           2  asked for something that cannot be done as asked
        │   └── TlsConfigError   2  a CA file or certificate that cannot be used
        ├── ControllerUnreachable 1  no answer at all: refused, DNS, timeout
        │   └── TlsRefused       1  the controller's certificate did not verify
        ├── BadAnswer            1  an answer this client does not understand
        └── ControllerError      1  the controller answered with an error (status, message)
            ├── NeedsToken       401  no token, or one the controller does not know
            ├── WrongToken       403  a token of a kind that may not do this
            ├── NotFound         404  the name is nothing the controller knows
            ├── NoLeader         503  only followers answered: a failover is under way
            ├── ControllerFailing 5xx  the controller failed; its log says why
            └── NotAController        something answers at the URL, not a controller

A server error carries its status and message, so the controller's error
middleware is one clause; a client error is shown as its message plus the hint
from ADVICE, the one table ctl's exit codes and the console's advice read.

Importing this module loads nothing beyond the standard library (ctl starts fast).
"""

from __future__ import annotations

# typing only for the type checker: importing it costs a one-shot `ctl` 2 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar


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


class SlowBody(ServerError):
    status = 408
    close = True


class TooLarge(ServerError):
    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body too large: the limit is {limit} bytes")


class Unknown(ServerError):
    status = 404


class UnknownNode(Unknown):
    def __init__(self, name: str) -> None:
        super().__init__(f"no node named {name!r} has ever reported to this controller")
        self.name = name


class Conflict(ServerError):
    """The request is valid but the object's state refuses it."""

    status = 409


class AwaitsApproval(Conflict):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"node {name!r} awaits approval, not an uncordon: "
            f"`llmgw ctl credentials approve {name}` lets it take replicas"
        )


class UnknownModel(Unknown):
    def __init__(self, name: str) -> None:
        super().__init__(f"no model named {name!r} is declared")
        self.name = name


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


class Advice:
    """A plain class: a NamedTuple costs a one-shot `ctl` 1 ms to build at import."""

    __slots__ = ("exit_code", "hint")

    def __init__(self, exit_code: int, hint: str) -> None:
        self.exit_code = exit_code
        self.hint = hint  # what to do next; "" where the message says it already

    def __repr__(self) -> str:
        return f"Advice({self.exit_code}, {self.hint!r})"


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
