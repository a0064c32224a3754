"""The fake engine sleeps as vLLM does (issue 32 item 6): the development endpoints
exist only with VLLM_SERVER_DEV_MODE=1, inference answers 503 while it sleeps, and
the memory it says it holds on its cards drops on a sleep (unless the fault keeps it)."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path

import aiohttp
from pytest_aiohttp import AiohttpClient

from llmgw.agent import fake_process_memory
from llmgw.agent.fake_engine import ASLEEP_MIB, FakeConfig, make_app
from llmgw.agent.fake_gpus import FakeGpus, parse_fake_spec
from tests.engines.test_fake_engine import _free_port, _wait_health

SLEEPY = FakeConfig(
    model="m", load_seconds=0, latency_s=0, dev_mode=True, sleep_mode=True, sleep_s=0, wake_s=0
)


async def test_without_dev_mode_the_endpoints_are_404(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(make_app(replace(SLEEPY, dev_mode=False)))
    assert (await client.post("/sleep?level=1")).status == 404
    assert (await client.post("/wake_up")).status == 404
    assert (await client.get("/is_sleeping")).status == 404
    assert (await client.post("/v1/completions", json={"prompt": "x"})).status == 200


async def test_without_sleep_mode_a_sleep_fails_and_nothing_sleeps(
    aiohttp_client: AiohttpClient,
) -> None:
    client = await aiohttp_client(make_app(replace(SLEEPY, sleep_mode=False)))
    resp = await client.post("/sleep?level=1")
    assert resp.status == 500
    assert "not enabled" in (await resp.json())["error"]["message"]
    assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
    assert (await client.post("/v1/completions", json={"prompt": "x"})).status == 200


async def test_sleep_refuses_inference_and_wake_serves_again(
    aiohttp_client: AiohttpClient,
) -> None:
    client = await aiohttp_client(make_app(SLEEPY))
    assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
    assert (await client.post("/sleep?level=1")).status == 200
    assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
    resp = await client.post("/v1/completions", json={"prompt": "x"})
    assert resp.status == 503
    assert "sleeping" in (await resp.json())["error"]["message"]
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert (await client.post("/v1/chat/completions", json=chat)).status == 503
    # What needs no weights still answers, as vLLM's.
    assert (await client.get("/health")).status == 200
    assert (await client.get("/v1/models")).status == 200
    assert (await client.get("/metrics")).status == 200
    assert (await client.post("/sleep?level=2")).status == 200  # asleep already: a no-op
    assert (await client.post("/wake_up")).status == 200
    assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
    assert (await client.post("/v1/completions", json={"prompt": "x"})).status == 200
    assert (await client.post("/wake_up")).status == 200  # awake already: a no-op


async def test_bad_level_is_400(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(make_app(SLEEPY))
    assert (await client.post("/sleep?level=3")).status == 400
    assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": False}


async def test_a_request_during_the_sleep_is_refused(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(make_app(replace(SLEEPY, sleep_s=30)))
    sleeping = asyncio.create_task(client.post("/sleep?level=1"))
    for _ in range(100):  # until the sleep has begun
        if (await client.post("/v1/completions", json={"prompt": "x"})).status == 503:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("inference was served on the way to sleep")
    assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
    sleeping.cancel()


def _held(directory: Path) -> dict[str, int]:
    return {p.gpu_uuid: p.used_mib for p in fake_process_memory.read(directory)}


async def test_memory_drops_on_sleep_and_comes_back_on_wake(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    cfg = replace(SLEEPY, memory_dir=tmp_path, gpus=("GPU-a", "GPU-b"), gpu_memory_mib=20000)
    client = await aiohttp_client(make_app(cfg))
    assert _held(tmp_path) == {"GPU-a": 20000, "GPU-b": 20000}
    assert (await client.post("/sleep?level=1")).status == 200
    assert _held(tmp_path) == {"GPU-a": ASLEEP_MIB, "GPU-b": ASLEEP_MIB}
    assert (await client.post("/wake_up")).status == 200
    assert _held(tmp_path) == {"GPU-a": 20000, "GPU-b": 20000}


async def test_the_fault_answers_the_sleep_and_keeps_the_memory(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    cfg = replace(
        SLEEPY, memory_dir=tmp_path, gpus=("GPU-a",), gpu_memory_mib=20000, sleep_keeps_memory=True
    )
    client = await aiohttp_client(make_app(cfg))
    assert (await client.post("/sleep?level=1")).status == 200
    assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
    assert _held(tmp_path) == {"GPU-a": 20000}


def test_fake_gpus_count_what_live_processes_hold(tmp_path: Path) -> None:
    gpus = FakeGpus("n1", [parse_fake_spec("2xH100-80GB")], memory_dir=tmp_path)
    first, second = gpus.uuids
    fake_process_memory.write(tmp_path, os.getpid(), [first], 20000)
    fake_process_memory.write(tmp_path, 2**22 + 1, [second], 30000)  # no such process
    (tmp_path / "junk.json").write_text("{")
    assert gpus.processes() == [fake_process_memory.ProcessMemory(os.getpid(), first, 20000)]
    cards = {g.uuid: g for g in gpus.scan().gpus}
    assert cards[first].memory_used_mib == 20000 and cards[first].in_use
    assert cards[second].memory_used_mib == 0 and not cards[second].in_use


async def test_process_reads_the_dev_mode_and_its_cards_from_its_environment(
    tmp_path: Path,
) -> None:
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "CUDA_VISIBLE_DEVICES": "GPU-x",
        fake_process_memory.ENV_DIR: str(tmp_path),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.agent.fake_engine",
        "--port",
        str(port),
        "--load-seconds",
        "0",
        "--enable-sleep-mode",
        "--gpu-memory-mib",
        "1000",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await _wait_health(port, 200)
        assert _held(tmp_path) == {"GPU-x": 1000}
        url = f"http://127.0.0.1:{port}/sleep?level=1"
        async with aiohttp.ClientSession() as s, s.post(url) as r:
            assert r.status == 200  # after the default 0.2 s
        assert _held(tmp_path) == {"GPU-x": ASLEEP_MIB}
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 5) == 0
        assert _held(tmp_path) == {}
        assert not os.listdir(tmp_path)  # it said it let go
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
