"""The fake engine serves LoRA adapters as vLLM does (issue 33 item 5): the runtime
endpoints exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING, refusals carry vLLM's status
and error type, /v1/models lists adapters with their parent, and an answer names the
adapter as its model."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from pytest_aiohttp import AiohttpClient

from llmgw.agent.fake_engine import STATE, FakeConfig, make_app, runtime_lora_updates
from llmgw.agent.fake_lora import LoraConfig
from llmgw.agent.sample_models import write_adapter

LORA = FakeConfig(
    model="base",
    load_seconds=0,
    latency_s=0,
    lora=LoraConfig(enabled=True, runtime_updates=True, max_loras=2, max_cpu_loras=2, load_s=0),
)


def _with(**lora: object) -> FakeConfig:
    return replace(LORA, lora=replace(LORA.lora, **lora))  # type: ignore[arg-type]


async def test_without_runtime_updating_the_endpoints_are_404(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    client = await aiohttp_client(make_app(_with(runtime_updates=False)))
    body = {"lora_name": "a", "lora_path": str(write_adapter(tmp_path / "a"))}
    assert (await client.post("/v1/load_lora_adapter", json=body)).status == 404
    assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "a"})).status == 404


def test_runtime_updating_is_read_as_vllm_reads_it() -> None:
    assert runtime_lora_updates({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    assert runtime_lora_updates({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": " 1 "})
    assert not runtime_lora_updates({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "yes"})
    assert not runtime_lora_updates({})


async def test_load_serve_by_name_list_and_unload(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    client = await aiohttp_client(make_app(LORA))
    path = str(write_adapter(tmp_path / "sql", base="base"))
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": path})
    assert resp.status == 200
    assert await resp.text() == "Success: LoRA adapter 'sql' added successfully."

    models = (await (await client.get("/v1/models")).json())["data"]
    assert [(m["id"], m.get("parent")) for m in models] == [("base", None), ("sql", "base")]
    assert models[1]["root"] == path

    resp = await client.post("/v1/completions", json={"model": "sql", "prompt": "x"})
    assert resp.status == 200
    assert (await resp.json())["model"] == "sql"
    chat = {"model": "sql", "messages": [{"role": "user", "content": "x"}], "stream": True}
    resp = await client.post("/v1/chat/completions", json=chat)
    chunks = [line for line in (await resp.text()).splitlines() if line.startswith("data: {")]
    assert chunks and all(json.loads(c[6:])["model"] == "sql" for c in chunks)
    resp = await client.post("/v1/completions", json={"model": "base", "prompt": "x"})
    assert (await resp.json())["model"] == "base"

    resp = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert resp.status == 200
    assert await resp.text() == "Success: LoRA adapter 'sql' removed successfully."
    assert [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]] == ["base"]
    resp = await client.post("/v1/completions", json={"model": "sql", "prompt": "x"})
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "model_not_found"


async def _refusal(
    client: object, path: str, body: dict[str, object]
) -> tuple[int, dict[str, object]]:
    resp = await client.post(path, json=body)  # type: ignore[attr-defined]
    return resp.status, (await resp.json())["error"]


async def test_refusals_carry_vllms_status_and_type(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    client = await aiohttp_client(make_app(LORA))
    load = "/v1/load_lora_adapter"
    status, err = await _refusal(client, load, {"lora_name": "a", "lora_path": ""})
    assert (status, err["type"], err["code"]) == (400, "InvalidUserInput", 400)
    assert err["message"] == "Both 'lora_name' and 'lora_path' must be provided."

    missing = str(tmp_path / "nowhere")
    status, err = await _refusal(client, load, {"lora_name": "a", "lora_path": missing})
    assert (status, err["type"], err["code"]) == (404, "NotFoundError", 404)
    assert err["message"] == "Loading lora a failed: No adapter found for <path>"

    wide = str(write_adapter(tmp_path / "wide", rank=32))
    status, err = await _refusal(client, load, {"lora_name": "a", "lora_path": wide})
    # vLLM 0.32 (its CPU build, by hand): the engine core's worker refuses it, a 500.
    assert (status, err["type"], err["code"]) == (500, "InternalServerError", 500)
    assert err["message"] == (
        "Call to add_lora method failed: Worker failed with error 'LoRA rank 32 is greater "
        "than max_lora_rank 16.', please check the stack trace above for the root cause"
    )

    bare = write_adapter(tmp_path / "bare")
    (bare / "adapter_model.safetensors").unlink()
    status, err = await _refusal(client, load, {"lora_name": "a", "lora_path": str(bare)})
    assert (status, err["type"]) == (500, "InternalServerError")
    assert "'<path> doesn't contain tensors'" in str(err["message"])

    good = str(write_adapter(tmp_path / "good"))
    assert (await client.post(load, json={"lora_name": "a", "lora_path": good})).status == 200
    status, err = await _refusal(client, load, {"lora_name": "a", "lora_path": good})
    assert (status, err["type"]) == (400, "InvalidUserInput")
    assert "has already been loaded" in str(err["message"])

    status, err = await _refusal(client, "/v1/unload_lora_adapter", {"lora_name": "zz"})
    assert (status, err["type"], err["message"]) == (
        404,
        "NotFoundError",
        "The lora adapter 'zz' cannot be found.",
    )
    # None of it changed what is loaded.
    ids = [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]
    assert ids == ["base", "a"]


async def test_without_enable_lora_a_load_is_refused(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    client = await aiohttp_client(make_app(_with(enabled=False)))
    good = str(write_adapter(tmp_path / "good"))
    status, err = await _refusal(
        client, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": good}
    )
    assert (status, err["type"]) == (400, "BadRequestError")
    assert "--enable-lora" in str(err["message"])


async def test_past_max_cpu_loras_the_oldest_is_read_again_not_refused(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """vLLM refuses no load past --max-cpu-loras: it pushes the least recently used out
    of host memory and reads it from disk again when asked for."""
    app = make_app(_with(max_cpu_loras=2))
    client = await aiohttp_client(app)
    for name in ("a", "b", "c"):
        path = str(write_adapter(tmp_path / name))
        body = {"lora_name": name, "lora_path": path}
        assert (await client.post("/v1/load_lora_adapter", json=body)).status == 200
    loras = app[STATE].loras
    assert loras is not None
    assert list(loras.resident) == ["b", "c"] and loras.loads == 3
    assert (await client.post("/v1/completions", json={"model": "a", "prompt": "x"})).status == 200
    assert list(loras.resident) == ["c", "a"] and loras.loads == 4
    ids = [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]
    assert ids == ["base", "a", "b", "c"]


async def test_at_most_max_loras_adapters_run_in_one_batch(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    app = make_app(replace(_with(max_loras=1, max_cpu_loras=2), latency_s=0.2))
    client = await aiohttp_client(app)
    for name in ("a", "b"):
        body = {"lora_name": name, "lora_path": str(write_adapter(tmp_path / name))}
        assert (await client.post("/v1/load_lora_adapter", json=body)).status == 200
    loop = asyncio.get_running_loop()
    start = loop.time()
    done: dict[str, float] = {}

    async def ask(model: str) -> None:
        resp = await client.post("/v1/completions", json={"model": model, "prompt": "x"})
        assert resp.status == 200
        done[model] = loop.time() - start

    await asyncio.gather(ask("a"), ask("b"))
    # One batch holds one adapter: the second waited for the first to finish.
    assert max(done.values()) >= 0.4 > min(done.values())
