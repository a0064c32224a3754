"""TLS for the controller's clients (agents, ctl, the console) and its server.

Clients verify the controller's certificate: against the system's trust store,
or against the CA in `--ca-file` / LLMGW_CA_FILE for a private CA. A
certificate that does not verify is refused with a message that says what to
do, never ignored.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from llmgw.errors import TlsConfigError

CA_ENV = "LLMGW_CA_FILE"


def ca_file(explicit: Path | str | None = None) -> Path | None:
    value = explicit or os.environ.get(CA_ENV) or None
    return Path(value) if value else None


def client_context(ca: Path | str | None = None) -> ssl.SSLContext:
    """A verifying client context: the given CA (or LLMGW_CA_FILE), else the system's."""
    path = ca_file(ca)
    try:
        return ssl.create_default_context(cafile=str(path) if path else None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot use CA file {path}: {exc}") from exc


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load --tls-cert {cert} / --tls-key {key}: {exc}") from exc
    return ctx


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = frozenset({62, 64})


def _verify_error(exc: BaseException | None) -> BaseException | None:
    """The failed certificate check inside a connection error (aiohttp and httpx wrap
    it): the ssl error itself where the chain holds it, else the first error naming it."""
    named: BaseException | None = None
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        inner = getattr(exc, "certificate_error", None)  # aiohttp's certificate error
        if isinstance(inner, ssl.SSLCertVerificationError):
            return inner
        if named is None and "CERTIFICATE_VERIFY_FAILED" in str(exc):
            named = exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return named


def is_verify_failure(exc: BaseException | None) -> bool:
    """Whether a connection error (or one it wraps) is a failed certificate check."""
    return _verify_error(exc) is not None


def verify_hint(url: str, exc: BaseException) -> str:
    """Why the controller's certificate was refused, and what to do about it."""
    err = _verify_error(exc) or exc
    code = getattr(err, "verify_code", None)
    if code in _NAME_MISMATCH or (code is None and "mismatch" in str(err)):
        host = urlsplit(url).hostname
        return (
            f"the TLS certificate of {url} is not trusted: it does not name host {host!r} "
            f"({_first_line(err)}); connect by a name the certificate lists, or reissue it "
            "with that name"
        )
    return (
        f"the TLS certificate of {url} is not trusted: it is not signed by a CA this client "
        f"trusts ({_first_line(err)}); pass --ca-file (or set {CA_ENV}) with the CA that "
        "signed it"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
