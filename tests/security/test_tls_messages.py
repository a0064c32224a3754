"""A refused controller certificate says which check failed: a CA the client does
not trust, or a certificate that does not name the host dialled. Real TLS
handshakes over loopback against a certificate made with trustme."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web

from llmgw.agent.loop import connection_error
from llmgw.client import AdminClient, ControllerUnreachable
from llmgw.tls import client_context


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


async def _summary(_: web.Request) -> web.Response:
    return web.json_response({})


async def _serve(cert: trustme.LeafCert) -> AsyncIterator[str]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    app = web.Application()
    app.router.add_get("/v1/summary", _summary)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def wrong_name(ca: trustme.CA) -> AsyncIterator[str]:
    """A controller whose certificate (signed by `ca`) names another host only."""
    async for url in _serve(ca.issue_cert("controller.example")):
        yield url


@pytest.fixture
async def right_name(ca: trustme.CA) -> AsyncIterator[str]:
    async for url in _serve(ca.issue_cert("127.0.0.1")):
        yield url


def _pem(ca: trustme.CA, path: Path) -> str:
    ca.cert_pem.write_to_path(str(path))
    return str(path)


async def _admin_error(url: str, ca_file: str) -> str:
    async with AdminClient(url, ca_file=ca_file) as client:
        with pytest.raises(ControllerUnreachable) as caught:
            await client.summary()
    return str(caught.value)


async def _agent_error(url: str, ca_file: str) -> str:
    connector = aiohttp.TCPConnector(ssl=client_context(ca_file))
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises(aiohttp.ClientError) as caught:
            await session.get(url + "/v1/summary")
    return str(connection_error(url, caught.value))


@pytest.mark.parametrize("client", [_admin_error, _agent_error])
async def test_a_certificate_for_another_host_is_named_so(
    client: object, wrong_name: str, ca: trustme.CA, tmp_path: Path
) -> None:
    message = await client(wrong_name, _pem(ca, tmp_path / "ca.pem"))  # type: ignore[operator]
    assert "does not name host '127.0.0.1'" in message, message
    assert "not signed" not in message


@pytest.mark.parametrize("client", [_admin_error, _agent_error])
async def test_a_certificate_from_another_ca_is_named_so(
    client: object, right_name: str, tmp_path: Path
) -> None:
    message = await client(right_name, _pem(trustme.CA(), tmp_path / "other.pem"))  # type: ignore[operator]
    assert "not signed by a CA this client trusts" in message, message
    assert "--ca-file" in message and "LLMGW_CA_FILE" in message
