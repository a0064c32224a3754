"""Clients follow the leader (llmgw/leader.py): ctl's blocking client, the async
client the console uses, and the agent's report loop, against real HTTP servers
on loopback that answer as a follower does (the controller's own answer to
`NotTheLeader`), as a leader, or not at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from llmgw import api
from llmgw.agent.loop import ReportLoop
from llmgw.client import AdminClient
from llmgw.controller.http.web_io import answer
from llmgw.errors import NotTheLeader
from llmgw.leader import Endpoints, Following, Tries, leader_of, split_urls
from llmgw.sync_client import SyncAdminClient
from llmgw.wire import AdminFlag, NodeReport, NodeState, ReportReply
from tests.agent.test_loop import builder
from tests.e2e.procs import free_port


class Server:
    """A loopback server that answers as the leader, or as a follower naming `leader`."""

    def __init__(self) -> None:
        self.leader: str | None = None
        self.following = False
        self.hits = 0
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.custom: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        if self.following:
            return answer(NotTheLeader(self.leader))
        if self.custom is not None:
            return await self.custom(request)
        if request.path == "/v1/agent/report":
            report = NodeReport.model_validate_json(await request.read())
            reply = ReportReply(
                node=report.node, admin_flag=AdminFlag.NONE, state=NodeState.READY, assignments=[]
            )
            return web.Response(text=reply.model_dump_json(), content_type="application/json")
        return web.json_response({"served_by": self.url})

    async def start(self) -> Server:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    def follow(self, leader: Server | None) -> None:
        self.following = True
        self.leader = leader.url if leader is not None else None


@pytest.fixture
async def servers() -> AsyncIterator[tuple[Server, Server]]:
    leader, follower = await Server().start(), await Server().start()
    follower.follow(leader)
    yield leader, follower
    for s in (leader, follower):
        assert s.runner is not None
        await s.runner.cleanup()


DEAD = f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_a_follower_answer_is_told_from_other_503s() -> None:
    follower = answer(NotTheLeader("http://ctl-b:7460"))
    assert follower.body is not None
    assert leader_of(503, follower.headers, bytes(follower.body)) == (True, "http://ctl-b:7460")
    body = b'{"error": "not the leader", "leader": "ctl-c:7460"}'
    assert leader_of(503, {}, body) == (True, "http://ctl-c:7460")  # no header: the body
    assert leader_of(503, {}, b'{"error": "not the leader", "leader": null}') == (True, None)
    unstored = b'{"error": "state not stored: PostgreSQL: connection refused"}'
    assert leader_of(503, {}, unstored) == (False, None), "a store outage is not a redirect"
    assert leader_of(200, {"X-LLMGW-Leader": "x"}, b"{}") == (False, None)


def test_the_url_list() -> None:
    assert split_urls("ctl-a:7460, https://ctl-b:7460/,,ctl-a:7460") == [
        "http://ctl-a:7460",
        "https://ctl-b:7460",
    ]
    with pytest.raises(ValueError):
        Endpoints([])
    ends = Endpoints(["a", "b", "c"])
    tries = Tries(ends)
    assert tries.next() == "http://a"
    tries.redirect("http://c")  # a's answer named c: c goes next, and first from now on
    assert tries.next() == "http://c" and ends.current == "http://c"
    tries.redirect("http://a")  # and c named a: a is tried again (the lease moved)
    assert [tries.next(), tries.next(), tries.next()] == ["http://a", "http://b", None]
    assert ends.order() == ["http://a", "http://b", "http://c"]


FOLLOWER = b'{"error": "not the leader", "leader": "http://c"}'


def test_following_the_leader_needs_no_io() -> None:
    """The one loop every transport drives: told what came back, it says where next."""
    ends = Endpoints(["a", "b", "c"])
    follow = Following(ends)
    assert follow.next() == "http://a"
    refused = ConnectionRefusedError("a is down")
    follow.unreachable(refused)
    assert follow.next() == "http://b"
    assert not follow.answered("http://b", 503, {}, FOLLOWER)  # b follows c: c next
    assert follow.next() == "http://c"
    assert follow.answered("http://c", 404, {}, b'{"error": "no node"}'), "an answer is an answer"
    assert ends.current == "http://c" and follow.tried() == ["http://a", "http://b", "http://c"]
    assert follow.failure is refused and follow.follower == ("http://b", 503, FOLLOWER)

    nobody = Following(Endpoints(["a", "b"]))  # every one a follower naming nobody
    while (url := nobody.next()) is not None:
        assert not nobody.answered(url, 503, {}, b'{"error": "not the leader", "leader": null}')
    assert nobody.follower is not None and nobody.failure is None
    assert nobody.tried() == ["http://a", "http://b"]


async def test_ctl_follows_the_named_leader_past_a_dead_url(servers: tuple[Server, Server]) -> None:
    leader, follower = servers

    def calls() -> tuple[object, str, object]:
        with SyncAdminClient([DEAD, follower.url]) as client:
            first = client.json(api.summary_json())
            where = client.base_url
            second = client.json(api.summary_json())
            return first, where, second

    first, where, second = await asyncio.to_thread(calls)
    assert first == second == {"served_by": leader.url}
    assert where == leader.url
    assert follower.hits == 1, "once the leader is known, calls go straight to it"


async def test_ctl_with_only_followers_says_no_controller_leads(
    servers: tuple[Server, Server],
) -> None:
    leader, follower = servers
    leader.follow(None)  # an election under way: nobody leads

    def call() -> None:
        with SyncAdminClient(",".join([follower.url, leader.url])) as client:
            client.json(api.summary_json())

    with pytest.raises(api.ControllerError) as refused:
        await asyncio.to_thread(call)
    assert refused.value.status == 503
    assert refused.value.message.startswith("not the leader: no controller leads right now")
    assert follower.url in refused.value.message and "try again" in refused.value.message


async def test_the_console_client_follows_the_leader(servers: tuple[Server, Server]) -> None:
    leader, follower = servers
    async with AdminClient(f"{follower.url},{DEAD}") as client:
        assert await client.run(api.summary_json()) == {"served_by": leader.url}
        assert client.base_url == leader.url
        # The leader dies and the follower takes over: the client moves on.
        leader.follow(follower)
        follower.following = False
        assert await client.run(api.summary_json()) == {"served_by": follower.url}
        assert client.base_url == follower.url


async def test_an_agent_reports_to_the_leader_and_does_not_back_off_in_a_failover(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    leader, follower = servers
    loop = ReportLoop(builder(tmp_path), f"{DEAD},{follower.url}")
    import aiohttp

    async with aiohttp.ClientSession() as session:
        reply = await loop.cycle(session)
        assert reply.node == "n1" and loop.controller == leader.url
        assert leader.hits == 1
        leader.follow(None)  # nobody leads for a moment
        follower.leader = None
        await loop._one(session)
        assert loop.failed["leader"] == 1 and loop.failures == 0, "no backoff for a failover"
        follower.following = False  # the follower took over
        await loop._one(session)
        assert loop.controller == follower.url and loop.failures == 0 and loop.sent == 2


async def test_the_gateway_follows_the_leader_for_endpoints(
    servers: tuple[Server, Server],
) -> None:
    """The gateway's endpoint poll goes to the leader a follower names (its status posts
    go through the same `aiohttp_request`)."""
    import aiohttp

    from llmgw.gateway.sync import Follower

    leader, follower = servers
    seen: list[tuple[str, str]] = []

    async def endpoints(request: web.Request) -> web.StreamResponse:
        seen.append((request.method, request.path))
        delta = {"cursor": "ab.1", "full": True, "endpoints": [], "removed": []}
        return web.json_response(delta)

    leader.custom = endpoints
    gw = Follower(f"{DEAD},{follower.url}", None, "gw-1", smg=None)  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as http:
        poll = asyncio.create_task(gw._poll(http))
        for _ in range(200):
            if gw.cursor:
                break
            await asyncio.sleep(0.01)
        poll.cancel()
    assert gw.cursor == "ab.1" and gw.controllers.current == leader.url
    assert ("GET", "/v1/endpoints") in seen


def test_the_console_takes_every_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmgw.console import cli
    from llmgw.console.app import ConsoleApp

    seen: list[list[str]] = []
    monkeypatch.setattr(ConsoleApp, "run", lambda self: seen.append(self.client.endpoints.urls))
    monkeypatch.delenv("LLMGW_CONTROLLER", raising=False)
    assert cli.main(["--controller", "ctl-a:7460,ctl-b:7460"]) == 0
    monkeypatch.setenv("LLMGW_CONTROLLER", "http://ctl-c:1,http://ctl-d:2")
    assert cli.main([]) == 0
    assert seen == [
        ["http://ctl-a:7460", "http://ctl-b:7460"],
        ["http://ctl-c:1", "http://ctl-d:2"],
    ]
