"""A gateway posting its counts, in process against a scripted controller: a batch
not answered is sent again as it was (same run and seq, so the controller counts it
once) while what is metered meanwhile waits for the next; a batch the controller
refuses as it is goes; the answer's shares reach the limiter. And ctl's checks of
`limits` and `usage` arguments."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.ctl.checks import check_args
from llmgw.ctl.parser import parser
from llmgw.errors import UsageError
from llmgw.gateway import sync
from llmgw.gateway.limits import Limiter
from llmgw.gateway.metering import Meter
from llmgw.gateway.sync import Follower
from llmgw.wire import TenantLimitView


async def test_a_batch_is_sent_again_as_it_was_until_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sync, "USAGE_EVERY_S", 0.02)
    got: list[dict[str, Any]] = []
    answers = [503, 200, 400, 200]
    arrived = asyncio.Event()

    async def until(n: int) -> None:
        while len(got) < n:
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 10)

    async def usage(request: web.Request) -> web.Response:
        got.append(await request.json())
        arrived.set()
        status = answers.pop(0) if answers else 200
        if status != 200:
            return web.json_response({"error": "not now"}, status=status)
        share = {"tenant": "acme", "others_requests": 5, "others_tokens": 0}
        return web.json_response({"run": "c1", "shares": [share]})

    app = web.Application()
    app.router.add_post("/v1/gateways/usage", usage)
    server = TestServer(app)
    await server.start_server()
    meter, limiter = Meter(), Limiter()
    limiter.set_limits([TenantLimitView(tenant="acme", rpm=100)])
    follower = Follower(
        str(server.make_url("")),
        None,
        "gw-a",
        object(),
        meter=meter,
        limiter=limiter,  # type: ignore[arg-type]
    )
    meter.served("acme", "m", 5, 3, error=False)
    async with aiohttp.ClientSession() as http:
        task = asyncio.create_task(follower._post_usage(http))
        try:
            await until(2)
            meter.served("acme", "m", 1, 1, error=True)  # after the first batch was cut
            await until(5)
        finally:
            task.cancel()
    await server.close()
    first, again, second, after_refusal = got[0], got[1], got[2], got[3]
    assert first == again, "sent again as it was"
    assert first["seq"] == 1 and first["rows"] == [
        {
            "tenant": "acme",
            "model": "m",
            "requests": 1,
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "errors": 0,
            "rate_limited": 0,
        }
    ]
    assert second["seq"] == 2 and second["rows"][0]["errors"] == 1  # metered meanwhile
    assert after_refusal["seq"] == 3 and after_refusal["rows"] == [], "the refused one went"
    assert {b["run"] for b in got} == {first["run"]} and first["name"] == "gw-a"
    # The shares reached the limiter: the other gateways' 5 requests (a baseline first).
    assert limiter.check("acme", "m") is None


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["limits", "set", "acme"], "limits set needs --rpm N"),
        (["limits", "set"], "limits set needs a TENANT"),
        (["limits", "set", "acme", "--budget", "5"], "--budget TOKENS goes with --per"),
        (["limits", "set", "acme", "--per", "day", "--rpm", "5"], "--budget TOKENS goes with"),
        (["limits", "set", "acme", "--rpm", "0"], "--rpm must be at least 1"),
        (["limits", "list", "acme"], "limits list takes no TENANT"),
        (["limits", "delete", "acme", "--rpm", "5"], "limits delete takes TENANT [--model M]"),
        (["keys", "list", "-o", "csv"], "-o csv applies to usage"),
    ],
)
def test_limits_and_usage_arguments_are_checked(argv: list[str], said: str) -> None:
    with pytest.raises(UsageError) as refused:
        check_args(parser(argv).parse_args(argv))
    assert said in str(refused.value)


def test_what_ctl_takes() -> None:
    for argv in (
        ["limits", "set", "acme", "--model", "m", "--budget", "5", "--per", "month"],
        ["limits", "delete", "acme", "--model", "m"],
        ["limits", "list", "-o", "json"],
        ["usage", "--since", "7d", "--by", "tenant", "-o", "csv"],
    ):
        check_args(parser(argv).parse_args(argv))
