"""The console against a real controller on loopback (aiohttp test server):
real HTTP, real auth, real cordon/drain semantics; no fake in between."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from console_pilot import loaded, repoll, until
from textual.widgets import DataTable

from llmgw.client import AdminClient, ControllerError
from llmgw.console.app import ConsoleApp
from llmgw.console.screens.modals import CordonModal, DrainModal
from llmgw.console.widgets.nodes import NodesTable
from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.wire import NodeReport

AGENT, ADMIN, READ = "agent-secret", "admin-secret", "read-secret"
ServerFactory = Callable[..., Awaitable[TestServer]]


def report(node: str, fabric: str) -> str:
    gpus = [
        {
            "uuid": f"GPU-{node}-{i}",
            "index": i,
            "gpu_class": "H100-SXM-80GB",
            "memory_total_mib": 81920,
            "health": "healthy",
        }
        for i in range(8)
    ]
    body = {
        "node": node,
        "agent_version": "test",
        "boot_id": "b1",
        "interval_s": 5.0,
        "gpus": gpus,
        "fabrics": [fabric],
    }
    return NodeReport.model_validate(body).model_dump_json()


@pytest.fixture
async def controller(aiohttp_server: ServerFactory, tmp_path: Path) -> TestServer:
    tokens = Tokens(
        ((AGENT, "agent", Role.AGENT), (ADMIN, "alice", Role.ADMIN), (READ, "viewer", Role.READ))
    )
    server = await aiohttp_server(create_app(ControllerSettings(state_dir=tmp_path, tokens=tokens)))
    async with aiohttp.ClientSession() as http:
        for node, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b")):
            resp = await http.post(
                server.make_url("/v1/agent/report"),
                data=report(node, fabric),
                headers={"Authorization": f"Bearer {AGENT}", "Content-Type": "application/json"},
            )
            assert resp.status == 200, await resp.text()
    return server


def console(server: TestServer, **kwargs: Any) -> ConsoleApp:
    client = AdminClient(str(server.make_url("")), ADMIN)
    return ConsoleApp(client, refresh=3600.0, **kwargs)


async def node_state(server: TestServer, name: str) -> dict[str, Any]:
    async with AdminClient(str(server.make_url("")), ADMIN) as c:
        return (await c.node(name)).row.admin.model_dump()


async def test_cordon_uncordon_and_drain_against_a_real_controller(
    controller: TestServer,
) -> None:
    async with console(controller).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = app.screen.query_one(NodesTable)
        assert set(table.shown) == {"n1", "n2", "n3"}
        assert app.fleet is not None and app.fleet.summary.nodes.ready == 3

        await pilot.press("c", *"bad fan", "enter")
        await until(pilot, lambda: table.rows_by_name["n1"].state == "cordoned", "cordon shown")
        admin = await node_state(controller, "n1")
        assert admin["flag"] == "cordoned" and admin["reason"] == "bad fan"
        assert admin["by"] == "alice"

        await pilot.press("u", "tab", "enter")  # confirm: Cancel -> Uncordon
        await until(pilot, lambda: table.rows_by_name["n1"].state == "ready", "uncordon shown")

        await pilot.press("down", "d")  # n2
        modal = app.screen
        assert isinstance(modal, DrainModal)
        await until(pilot, lambda: modal.plan is not None, "the controller's pre-check")
        assert modal.plan is not None and modal.plan.nodes == ["n2"]
        assert isinstance(modal.query_one("#plan"), DataTable)
        await pilot.press(*"kernel", "enter")
        await until(
            pilot,
            lambda: (
                table.rows_by_name["n2"].admin.flag == "draining"
                or table.rows_by_name["n2"].admin.drained
            ),
            "drain shown",
        )
        assert (await node_state(controller, "n2"))["reason"] == "kernel"


async def test_a_bad_token_is_an_error_banner_not_a_crash(controller: TestServer) -> None:
    client = AdminClient(str(controller.make_url("")), "wrong-token")
    async with ConsoleApp(client, refresh=3600.0).run_test(size=(120, 40)) as pilot:
        app = pilot.app
        assert isinstance(app, ConsoleApp)
        await until(pilot, lambda: app.polls >= 1, "first poll")
        await pilot.pause()
        assert app.connection.link == "error"
        assert "401" in app.connection.message
        banner = str(app.screen.query_one("#banner").render())
        # What to do, without claiming an admin token is needed to look.
        assert "--token" in banner and "LLMGW_TOKEN" in banner
        assert "admin token" not in banner and "a read token is enough" in banner
        assert app.screen.query_one("#banner").has_class("-visible")
        assert app.readonly  # never offers what the controller has not allowed
        # … but does not claim the token may only read: nobody has said so.
        assert "READ-ONLY" not in str(app.screen.query_one("#header").render())


async def test_a_read_token_makes_the_console_read_only(controller: TestServer) -> None:
    client = AdminClient(str(controller.make_url("")), READ)
    async with ConsoleApp(client, refresh=3600.0).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        assert app.role == "read" and app.readonly
        screen = app.screen
        for action in ("cordon", "uncordon", "drain", "mark"):
            assert screen.check_action(action, ()) is False
        footer = {key for key, b in screen.active_bindings.items() if b.enabled}
        assert not {"c", "u", "d", "space"} & footer
        await pilot.press("c", "d", "space", "c")
        assert not isinstance(app.screen, CordonModal | DrainModal)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not [t for t in titles if t.split()[0] in ("Cordon", "Uncordon", "Drain")]
        assert "READ-ONLY" in str(screen.query_one("#header").render())
        await pilot.press("question_mark")
        help_text = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "Read-only" in help_text and "cordon:" not in help_text


async def test_whoami_names_the_token(controller: TestServer) -> None:
    for token, name, role in ((ADMIN, "alice", "admin"), (READ, "viewer", "read")):
        async with AdminClient(str(controller.make_url("")), token) as c:
            me = await c.whoami()
            assert (me.name, me.role) == (name, role)
    async with AdminClient(str(controller.make_url("")), "nope") as c:
        with pytest.raises(ControllerError) as err:
            await c.whoami()
        assert err.value.status == 401


async def test_controller_going_away_and_coming_back(
    controller: TestServer, tmp_path: Path
) -> None:
    port = controller.port
    async with console(controller).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await controller.close()
        await repoll(pilot)
        assert app.connection.link == "unreachable"
        assert app.screen.query_one("#banner").has_class("-visible")
        assert app.screen.query_one(NodesTable).row_count == 3  # last data stays
        # A controller restarted on the same port, same state directory.
        tokens = Tokens(((ADMIN, "alice", Role.ADMIN),))
        again = TestServer(
            create_app(ControllerSettings(state_dir=tmp_path, tokens=tokens)), port=port
        )
        await again.start_server()
        try:
            await repoll(pilot)
            assert app.connection.link == "live"
            assert not app.screen.query_one("#banner").has_class("-visible")
        finally:
            await again.close()
