"""Every error a client can see (llmgw.errors), produced for real and read as a
person reads it: ctl's one line on stderr and its exit code, and the console's
next step, both from the one table (ADVICE)."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trustme

from llmgw import errors
from llmgw.console.state import Connection, Link, next_step
from llmgw.errors import ADVICE, ClientError, advice
from tests.ctl.ctl_support import READ, Controller, controller_process, ctl, one_line_error

HEALTHY = (200, "application/json", b'{"ok": true, "version": "test"}')
Answers = dict[str, tuple[int, str, bytes]]


@contextmanager
def fake_controller(answers: Answers, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """An HTTP server answering each path with a fixed (status, type, body)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, kind, body = answers.get(self.path, (404, "text/plain", b"no"))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("ctl-errors")) as c:
        c.report("gpu-a01")
        yield c


def _untrusted() -> ssl.SSLContext:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


TOKEN_HINT = (
    "pass a valid token with --token, --token-file or LLMGW_TOKEN, or a context's token-file "
    "(`llmgw ctl config view` shows which is used; a read token is enough to look)"
)

# class -> how to make ctl meet it (controller url -> stderr line, exit code)
Case = Callable[[Controller, Path], tuple[str, int]]


def _usage(fleet: Controller, tmp: Path) -> tuple[str, int]:
    line = one_line_error(ctl(fleet.url, "nodes", "--sort-by", "NOPE"), 2)
    assert line == (
        "llmgw ctl: cannot sort by 'NOPE': the columns are NODE, STATE, GPUS, USED, UNHEALTHY, "
        "CLASSES, FABRICS, MODELS, AGE, REASON"
    )
    return line, 2


def _tls_config(fleet: Controller, tmp: Path) -> tuple[str, int]:
    missing = tmp / "missing.pem"
    line = one_line_error(ctl("https://127.0.0.1:9", "status", "--ca-file", str(missing)), 2)
    assert line.startswith(f"llmgw ctl: cannot use CA file {missing}: "), line
    assert line.endswith("; check --ca-file (or LLMGW_CA_FILE)"), line
    return line, 2


def _unreachable(fleet: Controller, tmp: Path) -> tuple[str, int]:
    line = one_line_error(ctl("http://127.0.0.1:9", "status"), 1)
    assert line == (
        "llmgw ctl: cannot reach the controller at http://127.0.0.1:9: connection refused; "
        "check that `llmgw controller` runs and --controller points at it"
    )
    return line, 1


def _tls_refused(fleet: Controller, tmp: Path) -> tuple[str, int]:
    with fake_controller({"/healthz": HEALTHY}, tls=_untrusted()) as url:
        line = one_line_error(ctl(url, "status"), 1)
    assert line.startswith(
        f"llmgw ctl: cannot reach the controller at {url}: the TLS certificate of {url} "
        "is not trusted: it is not signed by a CA this client trusts ("
    ), line
    assert line.endswith("); pass --ca-file (or set LLMGW_CA_FILE) with the CA that signed it")
    return line, 1


def _bad_answer(fleet: Controller, tmp: Path) -> tuple[str, int]:
    answers = {"/healthz": HEALTHY, "/v1/summary": (200, "application/json", b"<oops>")}
    with fake_controller(answers) as url:
        line = one_line_error(ctl(url, "status"), 1)
    assert line == (
        f"llmgw ctl: the answer from {url}/v1/summary was not understood: Expecting value: "
        "line 1 column 1 (char 0); this client may not match the controller's version "
        "(llmgw --version)"
    )
    return line, 1


def _refused(fleet: Controller, tmp: Path) -> tuple[str, int]:
    line = one_line_error(ctl(fleet.url, "cordon", "gpu-a01", "--reason", "a\x01b"), 1)
    # The field and what is wrong with it, never the request's class name.
    assert line.startswith("llmgw ctl: gpu-a01: invalid reason: "), line
    assert "Request" not in line, line
    return line, 1


def _needs_token(fleet: Controller, tmp: Path) -> tuple[str, int]:
    line = one_line_error(ctl(fleet.url, "status", token=None), 1)
    assert line == ("llmgw ctl: missing token: this controller needs a bearer token; " + TOKEN_HINT)
    return line, 1


def _wrong_token(fleet: Controller, tmp: Path) -> tuple[str, int]:
    line = one_line_error(ctl(fleet.url, "uncordon", "gpu-a01", token=READ), 1)
    assert line == (
        "llmgw ctl: gpu-a01: a read token cannot do this; it needs an admin token; use a token "
        "of the kind it names (read to look, admin to change): --token, --token-file or "
        "LLMGW_TOKEN, or a context's token-file"
    )
    return line, 1


def _not_found(fleet: Controller, tmp: Path) -> tuple[str, int]:
    line = one_line_error(ctl(fleet.url, "node", "gpu-zz"), 1)
    assert line == "llmgw ctl: no node named 'gpu-zz' has ever reported to this controller"
    return line, 1


def _no_leader(fleet: Controller, tmp: Path) -> tuple[str, int]:
    follower = (503, "application/json", json.dumps({"error": "not the leader"}).encode())
    with fake_controller({"/healthz": HEALTHY, "/v1/summary": follower}) as url:
        line = one_line_error(ctl(url, "status"), 1)
    assert line == (
        f"llmgw ctl: not the leader: no controller leads right now (asked {url}); a failover "
        "takes up to the lease TTL (8 s by default): try again in a few seconds"
    )
    return line, 1


def _failing(fleet: Controller, tmp: Path) -> tuple[str, int]:
    boom = (500, "application/json", b'{"error": "the store is on fire"}')
    with fake_controller({"/healthz": HEALTHY, "/v1/summary": boom}) as url:
        line = one_line_error(ctl(url, "status"), 1)
    assert line == "llmgw ctl: the store is on fire; the controller's log says why"
    return line, 1


def _not_a_controller(fleet: Controller, tmp: Path) -> tuple[str, int]:
    page = (200, "text/html", b"<html>hello</html>")
    with fake_controller({"/healthz": page, "/v1/summary": page}) as url:
        line = one_line_error(ctl(url, "status"), 1)
    assert line == (
        f"llmgw ctl: {url} is not an llmgw controller (GET /healthz answered 200 with "
        "text/html); check --controller (e.g. http://HOST:7460)"
    )
    return line, 1


CASES: dict[type[ClientError], Case] = {
    errors.UsageError: _usage,
    errors.TlsConfigError: _tls_config,
    errors.ControllerUnreachable: _unreachable,
    errors.TlsRefused: _tls_refused,
    errors.BadAnswer: _bad_answer,
    errors.ControllerError: _refused,
    errors.NeedsToken: _needs_token,
    errors.WrongToken: _wrong_token,
    errors.NotFound: _not_found,
    errors.NoLeader: _no_leader,
    errors.ControllerFailing: _failing,
    errors.NotAController: _not_a_controller,
}


def _tree(cls: type[ClientError]) -> Iterator[type[ClientError]]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _tree(sub)


def test_every_client_error_has_a_case_and_a_row_in_the_table() -> None:
    every = set(_tree(ClientError)) - {ClientError}
    assert every == set(CASES), "a client error without a test case here"
    assert every == set(ADVICE), "a client error without its exit code and hint"


@pytest.mark.parametrize("error", list(CASES), ids=lambda c: c.__name__)
def test_ctl_says_each_error_with_its_hint_and_exit_code(
    fleet: Controller, tmp_path: Path, error: type[ClientError]
) -> None:
    line, code = CASES[error](fleet, tmp_path)
    assert advice(error).exit_code == code
    assert line.endswith(advice(error).hint)


@pytest.mark.parametrize(
    ("connection", "error"),
    [
        (Connection(Link.LOST, "refused"), errors.ControllerUnreachable),
        (Connection(Link.ERROR, "not understood"), errors.BadAnswer),
        (Connection(Link.ERROR, "401", status=401), errors.NeedsToken),
        (Connection(Link.ERROR, "403", status=403), errors.WrongToken),
        (Connection(Link.ERROR, "404", status=404), errors.NotFound),
        (Connection(Link.ERROR, "500", status=500), errors.ControllerFailing),
        (Connection(Link.ERROR, "503", status=503), errors.ControllerFailing),
        (Connection(Link.ERROR, "409", status=409), errors.ControllerError),
    ],
)
def test_the_console_gives_the_same_hint(connection: Connection, error: type[ClientError]) -> None:
    hint = advice(error).hint
    step = next_step(connection)
    assert step.endswith(".") and step[0].isupper()
    if hint:
        assert step == hint[0].upper() + hint[1:] + "."
    else:
        assert step == "The controller's message says why."
