"""One rule for who did it: ctl and the console record the same name (issue 23 item 9)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

import llmgw.console.app
from llmgw.client import AdminClient
from llmgw.console.cli import main as console_main
from llmgw.identity import operator_name
from tests.e2e.procs import Cluster, wait_until


def test_the_os_user_or_under_sudo_who_ran_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGNAME", "alice")
    assert operator_name({}) == "alice"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert operator_name({"SUDO_USER": "bob"}) == "bob"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert operator_name({"SUDO_USER": "bob"}) == "alice"  # not root: sudo -u someone


def console_client(monkeypatch: pytest.MonkeyPatch, url: str) -> AdminClient:
    """The client `llmgw console` builds, taken from the app it would run."""
    made: list[AdminClient] = []

    class App:
        return_code = 0

        def __init__(self, client: AdminClient, **_: Any) -> None:
            made.append(client)

        def run(self) -> None:
            pass

    monkeypatch.setattr(llmgw.console.app, "ConsoleApp", App)
    assert console_main(["--controller", url]) == 0
    return made[0]


def test_console_and_ctl_record_the_same_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_controller()
        for name in ("n1", "n2"):
            cluster.start_agent(name)
        wait_until(lambda: len(cluster.get("/v1/nodes")) == 2, timeout=30, what="two nodes")
        cluster.ctl("cordon", "n1", "--reason", "from ctl")
        client = console_client(monkeypatch, cluster.url)

        async def cordon() -> None:
            async with client:
                await client.cordon("n2", "from the console")

        asyncio.run(cordon())
        by = {n["name"]: n["admin"]["by"] for n in cluster.get("/v1/nodes")}
    finally:
        cluster.close()
    assert by["n1"] == by["n2"] == operator_name(), by
