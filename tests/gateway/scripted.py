"""Stand-ins for one side of the gateway, so a test can say exactly what it sends:

- `ScriptedNode` reports to a real controller as an agent would, but the test
  chooses its address and the port each engine listens on;
- `FakeController` serves `/v1/endpoints` with whatever entries the test gives
  (including ones a real controller refuses) and records the gateway's status;
- `engine()` starts a fake engine process on a port of the test's choosing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import httpx
from aiohttp import web
from pydantic import ValidationError, create_model

from llmgw.controller.http.web_io import answer, refusal_words, validation_detail
from llmgw.errors import BadRequest
from llmgw.wire import GatewayStatus, validate_json
from llmgw.wire.rules import Inbound
from tests.e2e.procs import free_port, wait_until


def engine(model: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "llmgw.agent.fake_engine", "--port", str(port), "--model", model]
    argv += ["--load-seconds", "0"]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def wait_engine(port: int) -> None:
    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=20, what=f"a fake engine on port {port}")


class ScriptedNode:
    """Reports every 0.3 s as `name`, each assigned shard ready on `ports[replica]`."""

    def __init__(self, controller: str, name: str, address: str = "127.0.0.1") -> None:
        self.controller = controller
        self.name = name
        self.address = address
        self.port_for: Callable[[str], int | None] = lambda rid: None
        self.assigned: list[str] = []
        self.models: dict[str, str] = {}  # replica id -> model, as assigned
        self.last_status = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def body(self) -> dict[str, Any]:
        gpus = [
            {
                "uuid": f"GPU-{self.name}-0",
                "index": 0,
                "gpu_class": "H100-SXM-80GB",
                "memory_total_mib": 81920,
                "health": "healthy",
            }
        ]
        replicas = []
        for rid in self.assigned:
            port = self.port_for(rid)
            if port is not None:
                replicas.append(
                    {
                        "id": rid,
                        "model": self.models[rid],
                        "state": "ready",
                        "gpus": [gpus[0]["uuid"]],
                        "port": port,
                    }
                )
        return {
            "node": self.name,
            "agent_version": "scripted",
            "boot_id": "boot-1",
            "interval_s": 0.3,
            "address": self.address,
            "gpus": gpus,
            "fabrics": ["ib-a"],
            "replicas": replicas,
        }

    def report_once(self, http: httpx.Client) -> None:
        r = http.post(f"{self.controller}/v1/agent/report", json=self.body())
        self.last_status = r.status_code
        if r.status_code == 200:
            assignments = r.json()["assignments"]
            self.models = {a["replica_id"]: a["model"] for a in assignments}
            self.assigned = sorted(self.models)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as http:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    self.report_once(http)
                self._stop.wait(0.3)

    def start(self) -> ScriptedNode:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class FakeController:
    """`/v1/endpoints` answers with `self.endpoints`; `/v1/gateways/status` bodies are kept."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.endpoints: list[dict[str, Any]] = []
        self.unserved: dict[str, str] = {}
        self.revision = 1
        self.statuses: list[dict[str, Any]] = []  # taken
        # As a controller older than these fields of a gateway's status: it refuses
        # a status with any of them, as unknown.
        self.unknown_fields: frozenset[str] = frozenset()
        self.refused: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def set(self, endpoints: list[dict[str, Any]]) -> None:
        self.endpoints = endpoints
        self.revision += 1

    async def _feed(self, request: web.Request) -> web.Response:
        since = request.query.get("since", "")
        cursor = f"abc.{self.revision}"
        if since == cursor:
            await asyncio.sleep(min(float(request.query.get("wait", "0")), 0.5))
        body = {
            "cursor": f"abc.{self.revision}",
            "full": True,
            "endpoints": self.endpoints,
            "removed": [],
            "unserved": self.unserved,
        }
        return web.json_response(body)

    async def _status(self, request: web.Request) -> web.Response:
        raw = await request.read()
        status, body = older_controller_answer(raw, self.unknown_fields)
        if status != 200:
            self.refused.append(json.loads(raw))
            return web.Response(status=status, body=body, content_type="application/json")
        self.statuses.append(json.loads(raw))
        return web.Response(status=204)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/v1/endpoints", self._feed)
        app.router.add_post("/v1/gateways/status", self._status)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def start(self) -> FakeController:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def older_controller_answer(raw: bytes, unknown: frozenset[str]) -> tuple[int, bytes]:
    """What a controller that does not know the fields `unknown` of a gateway's status
    answers to `raw`: the real controller's validation and refusal (llmgw.controller.http),
    on the status model without those fields. (200, b"") when it takes it."""
    if not unknown:
        return 200, b""
    fields: Any = {
        name: (info.annotation, info)
        for name, info in GatewayStatus.model_fields.items()
        if name not in unknown
    }
    older = create_model("OlderGatewayStatus", __base__=Inbound, **fields)
    try:
        validate_json(older, raw)
    except ValidationError as exc:
        detail = validation_detail(exc)
        refusal = answer(BadRequest(refusal_words(detail), detail))
        assert isinstance(refusal.body, bytes)
        return refusal.status, refusal.body
    return 200, b""


def endpoint(rid: str, model: str, url: str, state: str = "serving") -> dict[str, Any]:
    return {
        "replica_id": rid,
        "model": model,
        "url": url,
        "node": "n1",
        "fabric": None,
        "state": state,
    }
