"""Sleep and wake against a scripted HTTP engine: no process, no monitor. What each
answer of /sleep and /wake_up leads to, the calls a level-2 wake makes, and the one
rule the node keeps whatever the controller says: no two awake engines on a card.
(The same with real fake-engine processes: test_sleep.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from llmgw.agent.engine_http import EngineHttp
from llmgw.agent.engine_lifecycle import EngineLifecycle
from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engine_shard import Engine
from llmgw.agent.engine_sleep import EngineSleep
from llmgw.agent.engine_templates import EngineTemplate, SleepMode
from llmgw.wire import ShardAssignment, ShardState, SleepFailure


@dataclass
class Script:
    """What the scripted engine answers (by path), and what it was asked."""

    status: dict[str, int] = field(default_factory=dict)  # 200 where not given
    calls: list[str] = field(default_factory=list)


async def scripted_engine(aiohttp_server: AiohttpServer, script: Script) -> int:
    async def answer(request: web.Request) -> web.Response:
        body = await request.text()
        script.calls.append(f"{request.path_qs} {body}".strip())
        return web.Response(status=script.status.get(request.path, 200), text="no")

    app = web.Application()
    app.router.add_post("/{path:.*}", answer)
    server = await aiohttp_server(app)
    return int(server.port)


@dataclass
class Node:
    lifecycle: EngineLifecycle
    sleep: EngineSleep


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    settings = SupervisorSettings(state_dir=tmp_path, node="n1", sleep_settle_s=0.1)
    life = EngineLifecycle(settings)
    http = EngineHttp(settings)
    yield Node(life, EngineSleep(life, http))
    await http.close()
    life.release()


def add(
    node: Node,
    port: int | None,
    state: ShardState = ShardState.READY,
    *,
    replica: str = "r1",
    gpus: tuple[str, ...] = ("GPU-a",),
    sleep_level: int | None = None,
    mode: SleepMode | None = SleepMode(),  # noqa: B008 (frozen)
    share: float | None = None,
) -> Engine:
    a = ShardAssignment(
        replica_id=replica,
        model="org/m",
        source="org/m",
        engine="scripted",
        gpus=list(gpus),
        sleep_mode=True,
        sleep_level=sleep_level,
        gpu_memory_share=share,
    )
    template = EngineTemplate(command="scripted --port {port}", sleep=mode)
    eng = Engine(assignment=a, template=template, state=state, port=port)
    node.lifecycle.engines[eng.key] = eng
    return eng


def ask(eng: Engine, sleep_level: int | None) -> None:
    eng.assignment = eng.assignment.model_copy(update={"sleep_level": sleep_level})


async def turned(node: Node, eng: Engine) -> None:
    node.sleep.steer()
    assert eng.turning is not None, "a turn began"
    await eng.turning


async def test_a_level_2_sleep_and_its_wake_reload_the_weights(
    aiohttp_server: AiohttpServer, node: Node
) -> None:
    script = Script()
    eng = add(node, await scripted_engine(aiohttp_server, script), sleep_level=2)
    await turned(node, eng)
    assert eng.state is ShardState.SLEEPING and eng.slept_level == 2
    assert script.calls == ["/sleep?level=2"]
    ask(eng, None)
    await turned(node, eng)
    assert eng.state is ShardState.READY and eng.sleep_error is None
    assert script.calls[1:] == [
        "/wake_up",
        '/collective_rpc {"method": "reload_weights"}',
        "/reset_prefix_cache",
    ]
    (rep,) = node.lifecycle.reports()
    assert rep.last_wake_level == 2 and rep.last_wake_s is not None and rep.last_wake_s >= 0


@pytest.mark.parametrize(
    ("status", "failure", "words"),
    [
        (404, SleepFailure.NO_ENDPOINTS, "POST /sleep answered 404 (no sleep endpoints"),
        (500, SleepFailure.REFUSED, "did not sleep: POST /sleep?level=1 answered 500: no"),
    ],
)
async def test_a_sleep_the_engine_refuses_is_said_once_and_not_tried_again(
    aiohttp_server: AiohttpServer, node: Node, status: int, failure: SleepFailure, words: str
) -> None:
    script = Script(status={"/sleep": status})
    eng = add(node, await scripted_engine(aiohttp_server, script), sleep_level=1)
    await turned(node, eng)
    assert eng.state is ShardState.READY and eng.sleep_failure is failure
    assert eng.sleep_error is not None and words in eng.sleep_error
    node.sleep.steer()
    assert eng.turning is not None and eng.turning.done() and len(script.calls) == 1


async def test_an_engine_without_sleep_mode_is_never_asked(node: Node) -> None:
    eng = add(node, None, sleep_level=1, mode=None)  # no port: nothing may be called
    await turned(node, eng)
    assert eng.sleep_failure is SleepFailure.NO_SLEEP_MODE
    assert eng.sleep_error == "engine 'scripted' cannot sleep: its template has no sleep mode"


async def test_a_wake_that_fails_kills_the_engine_and_counts_it(
    aiohttp_server: AiohttpServer, node: Node
) -> None:
    script = Script(status={"/wake_up": 500})
    eng = add(node, await scripted_engine(aiohttp_server, script), ShardState.SLEEPING)
    eng.slept_level = 1
    await turned(node, eng)
    assert eng.state is ShardState.FAILED
    assert eng.error is not None
    assert eng.error.startswith("engine did not wake: POST /wake_up answered 500: no; killed")
    assert node.lifecycle.kills["wake_failed"] == 1
    assert script.calls == ["/wake_up"], "a level-1 sleep kept its weights: no reload"


async def test_no_wake_beside_an_awake_engine_on_a_shared_card(
    aiohttp_server: AiohttpServer, node: Node
) -> None:
    script = Script()
    port = await scripted_engine(aiohttp_server, script)
    asleep = add(node, port, ShardState.SLEEPING, replica="a", gpus=("GPU-a", "GPU-b"))
    awake = add(node, port, ShardState.READY, replica="b", gpus=("GPU-b",))
    add(node, port, ShardState.READY, replica="c", gpus=("GPU-c",))  # another card
    node.sleep.steer()
    assert asleep.state is ShardState.SLEEPING and asleep.turning is None
    awake.state = ShardState.FAILED  # a failed engine holds nothing awake
    await turned(node, asleep)
    assert asleep.state is ShardState.READY and script.calls == ["/wake_up"]


@pytest.mark.parametrize(
    ("shares", "wakes"),
    [
        ((0.45, 0.45, 0.55), True),  # 0.45 + 0.55 on GPU-b
        ((0.45, 0.6, 0.45), False),
        ((0.45, None, 0.45), False),  # the awake one has the card to itself
        ((None, 0.45, 0.45), False),
    ],
    ids=["shares add up", "shares over the card", "awake one has no share", "no share"],
)
async def test_a_wake_beside_an_awake_engine_only_while_their_shares_fit(
    aiohttp_server: AiohttpServer,
    node: Node,
    shares: tuple[float | None, float | None, float | None],
    wakes: bool,
) -> None:
    mine, beside, other_card = shares
    script = Script()
    port = await scripted_engine(aiohttp_server, script)
    asleep = add(node, port, ShardState.SLEEPING, replica="a", gpus=("GPU-b",), share=mine)
    add(node, port, ShardState.READY, replica="b", gpus=("GPU-b",), share=beside)
    add(node, port, ShardState.READY, replica="c", gpus=("GPU-c",), share=other_card)
    node.sleep.steer()
    if wakes:
        assert asleep.turning is not None
        await asleep.turning
        assert asleep.state is ShardState.READY and script.calls == ["/wake_up"]
    else:
        assert asleep.state is ShardState.SLEEPING and asleep.turning is None
