"""LoRA adapters on the agent (issue 33 item 1): an adapter directory is present only
when complete, by the same truth rules as weights; a ready engine is brought to the
adapters its assignment lists through the engine's own endpoints, and what it refuses
is kept with the engine's words."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from pathlib import Path

import aiohttp
from pytest_aiohttp import AiohttpServer

from llmgw.agent.engine_adapters import AdapterState, sync
from llmgw.agent.fake_engine import FakeConfig, make_app
from llmgw.agent.fake_lora import LoraConfig
from llmgw.agent.sample_models import write_adapter, write_model
from llmgw.agent.storage import StorageDir, StorageScanner, local_adapters
from llmgw.wire import StorageLocation


def scan(directory: Path) -> StorageLocation:
    (location,) = StorageScanner([StorageDir(str(directory))]).scan()
    return location


def test_complete_adapters_are_found_beside_models(tmp_path: Path) -> None:
    write_model(tmp_path / "org" / "base")
    write_adapter(tmp_path / "acme" / "sql", base="org/base", rank=8)
    write_adapter(tmp_path / "flat")
    location = scan(tmp_path)
    assert [m.name for m in location.models] == ["org/base"]
    assert {a.name: (a.rank, a.base) for a in location.adapters} == {
        "acme/sql": (8, "org/base"),
        "flat": (8, "m"),
    }
    assert location.incomplete == []
    assert local_adapters([location])["acme/sql"] == str(tmp_path / "acme" / "sql")


def test_a_directory_given_as_storage_that_is_an_adapter_is_one(tmp_path: Path) -> None:
    location = scan(write_adapter(tmp_path / "only"))
    assert [a.name for a in location.adapters] == ["only"]


def test_incomplete_adapters_are_not_present_and_say_why(tmp_path: Path) -> None:
    cut = write_adapter(tmp_path / "cut")
    weights = cut / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    (write_adapter(tmp_path / "nojson") / "adapter_config.json").write_text("{")
    notlora = write_adapter(tmp_path / "prefix")
    (notlora / "adapter_config.json").write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    (write_adapter(tmp_path / "noweights") / "adapter_model.safetensors").unlink()
    partial = write_adapter(tmp_path / "partial")
    (partial / "adapter_model.safetensors.incomplete").write_bytes(b"")
    badbin = write_adapter(tmp_path / "badbin")
    (badbin / "adapter_model.safetensors").unlink()
    (badbin / "adapter_model.bin").write_bytes(b"PK\x03\x04 half a zip")
    location = scan(tmp_path)
    assert location.adapters == []
    why = {i.name: i.reason for i in location.incomplete}
    assert "truncated" in why["cut"]
    assert "not valid JSON" in why["nojson"]
    assert "not LORA" in why["prefix"]
    assert "no adapter_model.safetensors or adapter_model.bin" in why["noweights"]
    assert "download in progress" in why["partial"]
    assert "not a whole torch.save archive" in why["badbin"]


def test_a_whole_bin_adapter_is_present(tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "bin")
    (d / "adapter_model.safetensors").unlink()
    with zipfile.ZipFile(d / "adapter_model.bin", "w") as z:
        z.writestr("archive/data.pkl", b"x")
    assert [a.name for a in scan(tmp_path).adapters] == ["bin"]


LORA = FakeConfig(
    model="base",
    load_seconds=0,
    latency_s=0,
    lora=LoraConfig(enabled=True, runtime_updates=True, max_loras=2, max_cpu_loras=4, load_s=0),
)


async def test_an_engine_is_brought_to_its_assignment(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    server = await aiohttp_server(make_app(LORA))
    url = str(server.make_url("")).rstrip("/")
    write_adapter(tmp_path / "acme" / "a")
    write_adapter(tmp_path / "acme" / "b")
    write_adapter(tmp_path / "acme" / "wide", rank=64)
    paths = local_adapters([scan(tmp_path)])
    state = AdapterState()
    async with aiohttp.ClientSession() as http:
        wanted = {"a": "acme/a", "b": "acme/b", "wide": "acme/wide", "gone": "acme/gone"}
        assert state.due(wanted)
        await sync(http, url, state, wanted, paths)
        assert state.loaded == {"a", "b"}
        assert state.failures["wide"][0] == 500
        assert "LoRA rank 64 is greater than max_lora_rank 16." in state.failures["wide"][1]
        assert state.failures["gone"][0] == 404
        assert "No adapter found for <path>" in state.failures["gone"][1]
        assert not state.due(wanted)  # refused ones are not tried again while asked for
        await sync(http, url, state, {"b": "acme/b"}, paths)
        assert state.loaded == {"b"} and state.failures == {}
        # An agent that restarts reads what the engine holds.
        fresh = AdapterState()
        await sync(http, url, fresh, {"b": "acme/b"}, paths)
        assert fresh.loaded == {"b"}
        models = await (await http.get(f"{url}/v1/models")).json()
        assert [(m["id"], m.get("parent")) for m in models["data"]] == [
            ("base", None),
            ("b", "base"),
        ]


async def test_an_engine_without_lora_says_so(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    plain = replace(LORA, lora=replace(LORA.lora, enabled=False))
    server = await aiohttp_server(make_app(plain))
    url = str(server.make_url("")).rstrip("/")
    write_adapter(tmp_path / "a")
    state = AdapterState()
    async with aiohttp.ClientSession() as http:
        await sync(http, url, state, {"a": str(tmp_path / "a")}, {})
    assert state.failures["a"] == (400, "LoRA is not enabled. Use --enable-lora to enable LoRA.")


async def test_adapters_are_loaded_with_the_engine_key(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """An engine that asks for its replica's key (issue 36): the agent's /v1 calls carry
    it; without it the engine refuses them."""
    server = await aiohttp_server(make_app(replace(LORA, api_keys=("k-1",))))
    url = str(server.make_url("")).rstrip("/")
    write_adapter(tmp_path / "acme" / "a")
    paths = local_adapters([scan(tmp_path)])
    async with aiohttp.ClientSession() as http:
        keyless = AdapterState()
        await sync(http, url, keyless, {"a": "acme/a"}, paths)
        assert not keyless.loaded and keyless.failures["a"][0] == 401
        state = AdapterState()
        await sync(http, url, state, {"a": "acme/a"}, paths, {"Authorization": "Bearer k-1"})
        assert state.loaded == {"a"} and state.failures == {}
