"""Template `env`, `executable` and `probes` (issue 24, findings 6 and 7)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from llmgw.agent.engine_templates import TemplateError, coerce_templates, merged_templates
from llmgw.agent.engines import EngineSupervisor
from llmgw.wire import ShardState

from .conftest import SupervisorFactory, assignment, wait_for


def pid_of(sup: EngineSupervisor) -> int:
    (entry,) = sup.debug_state().values()
    pid = entry["pid"]
    assert isinstance(pid, int)
    return pid


def state_of(sup: EngineSupervisor) -> ShardState | None:
    reps = sup.reports()
    return reps[0].state if reps else None


async def test_template_env_reaches_the_engine_with_substitution(
    make_supervisor: SupervisorFactory, state_dir: Path
) -> None:
    env = {"VLLM_CPU_OMP_THREADS_BIND": "{rank}-{gpus}", "NCCL_DEBUG": "WARN"}
    sup = make_supervisor(templates={"fake": {"env": env}})
    await sup.apply([assignment(rank=0)], {})
    environ = _environ(pid_of(sup))
    assert b"VLLM_CPU_OMP_THREADS_BIND=0-2" in environ  # rank 0, two GPUs
    assert b"NCCL_DEBUG=WARN" in environ
    header = (state_dir / "logs" / "r1-0.log").read_text().splitlines()[0]
    assert "VLLM_CPU_OMP_THREADS_BIND=0-2" in header  # the log says what the engine got


def test_env_names_and_variables_are_checked() -> None:
    with pytest.raises(TemplateError, match="unknown variable"):
        coerce_templates({"x": {"command": "e {port}", "env": {"A": "{nope}"}}})
    with pytest.raises(TemplateError, match="env"):
        coerce_templates({"x": {"command": "e {port}", "env": {"1BAD": "v"}}})


def test_a_table_without_command_changes_only_what_it_gives() -> None:
    exe = "/opt/vllm-cpu/bin/python -m vllm.entrypoints.openai.api_server"
    (tpl,) = coerce_templates({"vllm": {"executable": exe, "hung_after_s": 90}}).values()
    builtin = merged_templates()["vllm"]
    assert tpl.command == builtin.command and tpl.hung_after_s == 90
    # Only the program (`vllm serve`) is replaced; every argument stays.
    assert tpl.command_for(0, 1) == (
        f"{exe} --model '{{source}}' --host '{{host}}' --port '{{port}}' "
        "--tensor-parallel-size '{gpus}' --served-model-name '{model}' "
        "--enable-server-load-tracking --disable-access-log-for-endpoints /health,/metrics,/load"
    )


def test_logged_probes_add_nothing() -> None:
    (tpl,) = coerce_templates({"vllm": {"probes": "logged"}}).values()
    assert "--disable-access-log" not in tpl.command_for(0, 1)
    assert "--disable-access-log" in merged_templates()["vllm"].command_for(0, 1)


async def test_probes_stay_out_of_the_engines_access_log(
    make_supervisor: SupervisorFactory, state_dir: Path
) -> None:
    sup = make_supervisor()
    await sup.apply([assignment(engine_args=["--load-seconds", "0"])], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    await asyncio.sleep(1.0)  # ten health checks and scrapes
    port = sup.reports()[0].port
    async with aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{port}/v1/completions"
        async with s.post(url, json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200
    await wait_for(lambda: "POST /v1/completions" in _read(state_dir), what="the access line")
    log = _read(state_dir)
    assert '"POST /v1/completions HTTP/1.1" 200' in log, "requests are logged"
    assert "GET /health" not in log and "GET /metrics" not in log, "probes are not"
    assert "GET /load" not in log


def _read(state_dir: Path) -> str:
    return (state_dir / "logs" / "r1-0.log").read_text()


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
