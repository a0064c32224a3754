"""A real agent (fake GPUs, real storage scan, real controller) serves its own /metrics."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.cli import make_builder, parser, run_agent
from llmgw.agent.sample_models import write_model
from llmgw.agent.telemetry import reason_kind
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        return samples(await r.text())


async def test_agent_metrics(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path, unused_tcp_port: int
) -> None:
    server = await aiohttp_server(create_app(ControllerSettings(state_dir=tmp_path / "c")))
    models = tmp_path / "models"
    write_model(models / "tiny")
    write_model(models / "big", shards=3)
    (models / "big" / "model-00002-of-00003.safetensors").unlink()  # a half-finished copy
    (models / "empty").mkdir()
    (models / "empty" / "config.json").write_text("{}")
    args = parser().parse_args(
        [
            "--controller", str(server.make_url("")),
            "--node", "n1",
            "--fake-gpus", "4xH100-80GB",
            "--interval", "0.2",
            "--storage", f"{models}:local",
            "--state-dir", str(tmp_path / "a"),
            "--metrics-listen", f"127.0.0.1:{unused_tcp_port}",
        ]
    )  # fmt: skip
    task = asyncio.create_task(run_agent(args, make_builder(args)))
    url = f"http://127.0.0.1:{unused_tcp_port}/metrics"
    try:
        m: Samples = {}
        for _ in range(100):
            await asyncio.sleep(0.1)
            with contextlib.suppress(aiohttp.ClientError):
                m = await scrape(url)
                if (m.get(("llmgw_agent_reports_sent_total", frozenset())) or 0) >= 2:
                    break
        assert m[("llmgw_agent_reports_sent_total", frozenset())] >= 2
        assert m[("llmgw_agent_models_present", frozenset({("scope", "local")}))] == 1
        incomplete = {
            dict(k)["reason"]: v for (n, k), v in m.items() if n == "llmgw_agent_models_incomplete"
        }
        assert incomplete.get("missing shard") == 1, incomplete
        assert m[("llmgw_agent_storage_scan_seconds_count", frozenset())] >= 1
        assert m[("llmgw_agent_storage_files_scanned_sum", frozenset())] >= 4
        assert m[("llmgw_agent_report_send_seconds_count", frozenset())] >= 2
        assert 0 <= m[("llmgw_agent_seconds_since_last_report", frozenset())] < 5
        assert m[("llmgw_agent_report_failures_total", frozenset({("kind", "unreachable")}))] == 0
        assert m[("llmgw_agent_engine_kills_total", frozenset({("reason", "hung")}))] == 0
        assert m[("llmgw_agent_loop_late_seconds", frozenset())] >= 0
        # The controller goes away: failures count up, the age grows.
        await server.close()
        await asyncio.sleep(1.0)
        m = await scrape(url)
        assert m[("llmgw_agent_report_failures_total", frozenset({("kind", "unreachable")}))] >= 1
        assert m[("llmgw_agent_seconds_since_last_report", frozenset())] >= 0.5
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_reason_labels_are_bounded() -> None:
    assert reason_kind("download in progress: 3 .incomplete blob(s)") == "download in progress"
    assert reason_kind("missing shard m-2.safetensors: index names 3 shard(s), 1 absent") == (
        "missing shard"
    )
    assert reason_kind("m-1.safetensors: truncated (10 of 99 bytes)") == "truncated"
    assert reason_kind("x.safetensors: header is not valid JSON") == "bad header"
    assert reason_kind("something new") == "other"
