"""The agent sleeps and wakes the engines its assignments say (issue 32 item 1), with
real fake-engine processes: it is the only caller of their sleep endpoints, reports
`sleeping` and `waking`, and an engine that cannot sleep is found out at its first
try, said in its report, and never tried again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.agent import fake_process_memory, sleep_level
from llmgw.agent.engine_templates import BUILTIN_TEMPLATES
from llmgw.agent.engines import EngineSupervisor
from llmgw.agent.sleep_check import judge, judgeable
from llmgw.wire import ShardAssignment, ShardState, SleepFailure

from .conftest import SupervisorFactory, assignment, wait_for
from .test_supervisor import only, pid_of, proc_file

FAST = ["--load-seconds", "0", "--sleep-seconds", "0", "--wake-seconds", "0", "--latency", "0"]


def sleepy(args: list[str] = FAST, **kw: Any) -> ShardAssignment:
    return assignment(engine_args=args, sleep_mode=True, **kw)


async def _complete(sup: EngineSupervisor) -> int:
    port = only(sup).port
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "x"}) as r,
    ):
        return r.status


def _complete_count(state_dir: Path) -> int:
    return next((state_dir / "logs").glob("r1-0.log")).read_text().count("POST /v1/completions")


async def ready(sup: EngineSupervisor) -> None:
    await wait_for(lambda: only(sup).state is ShardState.READY, what="ready")


async def test_sleeps_and_wakes_the_same_process(make_supervisor: SupervisorFactory) -> None:
    sup = make_supervisor()
    args = [*FAST, "--wake-seconds", "0.5"]  # long enough for the report to say waking
    await sup.apply([sleepy(args)], {})
    await ready(sup)
    pid = pid_of(sup)
    environ = proc_file(pid, "environ").split(b"\0")
    assert b"VLLM_SERVER_DEV_MODE=1" in environ
    assert b"--enable-sleep-mode" in proc_file(pid, "cmdline").split(b"\0")

    await sup.apply([sleepy(args, sleep_level=1)], {})
    await wait_for(lambda: only(sup).state is ShardState.SLEEPING, what="asleep")
    assert only(sup).idle_seconds is None and only(sup).sleep_error is None
    assert await _complete(sup) == 503  # the engine itself says it sleeps

    await sup.apply([sleepy(args)], {})
    states: set[ShardState] = set()
    await wait_for(lambda: states.add(only(sup).state) or only(sup).state is ShardState.READY)
    assert ShardState.WAKING in states
    assert pid_of(sup) == pid  # woken, not restarted
    assert await _complete(sup) == 200


async def test_a_level_2_wake_reloads_the_weights(
    make_supervisor: SupervisorFactory, state_dir: Path
) -> None:
    sup = make_supervisor()
    await sup.apply([sleepy()], {})
    await ready(sup)
    await sup.apply([sleepy(sleep_level=2)], {})
    await wait_for(lambda: only(sup).state is ShardState.SLEEPING, what="asleep")
    await sup.apply([sleepy()], {})
    await ready(sup)
    log = next((state_dir / "logs").glob("r1-0.log")).read_text()
    assert '"POST /sleep?level=2 HTTP/1.1" 200' in log
    wake, reload, reset = (
        log.index(f'"POST {path} HTTP/1.1" 200')
        for path in ("/wake_up", "/collective_rpc", "/reset_prefix_cache")
    )
    assert wake < reload < reset


async def test_an_engine_without_dev_mode_cannot_sleep_and_says_so_once_tried(
    make_supervisor: SupervisorFactory, state_dir: Path
) -> None:
    # A template whose sleep mode sets no development mode: /sleep is 404, as an
    # old vLLM or one started without VLLM_SERVER_DEV_MODE answers.
    sleep = BUILTIN_TEMPLATES["fake"].sleep
    assert sleep is not None
    tpl = BUILTIN_TEMPLATES["fake"].model_copy(
        update={"sleep": sleep.model_copy(update={"env": {}})}
    )
    sup = make_supervisor(templates={"fake": tpl})
    await sup.apply([sleepy()], {})
    await ready(sup)
    await sup.apply([sleepy(sleep_level=1)], {})
    await wait_for(lambda: only(sup).sleep_error is not None, what="the sleep error")
    rep = only(sup)
    assert rep.state is ShardState.READY
    assert rep.sleep_error is not None and "answered 404" in rep.sleep_error
    assert await _complete(sup) == 200  # still serving
    # Awake again, then asked again: said in every report, never tried again.
    await sup.apply([sleepy()], {})
    await sup.apply([sleepy(sleep_level=1)], {})
    await _complete(sup)  # a request after the monitor's next ticks, logged after any try
    await wait_for(lambda: _complete_count(state_dir) >= 2, what="the second request logged")
    assert only(sup).sleep_error == rep.sleep_error and only(sup).state is ShardState.READY
    log = next((state_dir / "logs").glob("r1-0.log")).read_text()
    assert log.count("POST /sleep") == 1, "found out at the first try, not tried again"


async def test_a_template_without_sleep_never_calls_the_engine(
    make_supervisor: SupervisorFactory, state_dir: Path
) -> None:
    tpl = BUILTIN_TEMPLATES["fake"].model_copy(update={"sleep": None})
    sup = make_supervisor(templates={"fake": tpl})
    await sup.apply([sleepy()], {})
    await ready(sup)
    assert b"--enable-sleep-mode" not in proc_file(pid_of(sup), "cmdline").split(b"\0")
    await sup.apply([sleepy(sleep_level=1)], {})
    await wait_for(lambda: only(sup).sleep_error is not None, what="the sleep error")
    assert "has no sleep mode" in (only(sup).sleep_error or "")
    log = next((state_dir / "logs").glob("r1-0.log")).read_text()
    assert "/sleep" not in log


async def test_a_model_that_does_not_ask_starts_as_before(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor()
    await sup.apply([assignment(engine_args=FAST)], {})
    await ready(sup)
    pid = pid_of(sup)
    assert b"VLLM_SERVER_DEV_MODE=1" not in proc_file(pid, "environ").split(b"\0")
    assert b"--enable-sleep-mode" not in proc_file(pid, "cmdline").split(b"\0")


async def test_a_restarted_agent_adopts_a_sleeping_engine_and_wakes_it(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor()
    await sup.apply([sleepy()], {})
    await ready(sup)
    await sup.apply([sleepy(sleep_level=2)], {})
    await wait_for(lambda: only(sup).state is ShardState.SLEEPING, what="asleep")
    pid = pid_of(sup)
    await sup.close()  # the agent goes; its engine stays, asleep

    again = make_supervisor()
    assert only(again).state is ShardState.SLEEPING and pid_of(again) == pid
    await again.apply([sleepy()], {})
    await ready(again)
    assert pid_of(again) == pid
    assert await _complete(again) == 200


def _measured(make_supervisor: SupervisorFactory, tmp_path: Path) -> EngineSupervisor:
    """A supervisor whose fake engines say what they hold, read as NVML would be."""
    memory = tmp_path / "fake-gpu-memory"
    return make_supervisor(
        extra_env={fake_process_memory.ENV_DIR: str(memory)},
        card_memory=lambda: fake_process_memory.read(memory),
        sleep_settle_s=0.3,
    )


async def test_a_sleep_that_frees_its_memory_is_measured_and_kept(
    make_supervisor: SupervisorFactory, tmp_path: Path
) -> None:
    sup = _measured(make_supervisor, tmp_path)
    await sup.apply([sleepy()], {})
    await ready(sup)
    await sup.apply([sleepy(sleep_level=1)], {})
    await wait_for(lambda: only(sup).state is ShardState.SLEEPING, what="asleep")
    rep = only(sup)
    assert rep.sleep_error is None and rep.sleep_failure is None
    held = (
        {p.gpu_uuid: p.used_mib for p in sup.sleep_wake.card_memory()}
        if sup.sleep_wake.card_memory
        else {}
    )
    assert held == {"GPU-aaaa": 512, "GPU-bbbb": 512}  # 16 GiB each awake: 97 % freed


async def test_a_sleep_that_keeps_its_memory_is_woken_and_said_with_the_figures(
    make_supervisor: SupervisorFactory, tmp_path: Path, state_dir: Path
) -> None:
    # vLLM #47654: /sleep answers 200 and the memory stays held.
    sup = _measured(make_supervisor, tmp_path)
    await sup.apply([sleepy([*FAST, "--sleep-keeps-memory"])], {})
    await ready(sup)
    pid = pid_of(sup)
    await sup.apply([sleepy([*FAST, "--sleep-keeps-memory"], sleep_level=1)], {})
    await wait_for(lambda: only(sup).sleep_error is not None, what="the sleep error")
    await ready(sup)
    rep = only(sup)
    assert rep.sleep_failure is SleepFailure.MEMORY_KEPT
    assert rep.sleep_error is not None
    assert "still hold 16384 MiB of 16384 MiB on GPU-aaaa (0% freed" in rep.sleep_error
    assert pid_of(sup) == pid  # woken, the same process, serving
    assert await _complete(sup) == 200
    log = next((state_dir / "logs").glob("r1-0.log")).read_text()
    assert log.index('"POST /sleep?level=1 HTTP/1.1" 200') < log.index('"POST /wake_up')


async def test_a_sleep_not_measurable_is_taken_at_its_word(
    make_supervisor: SupervisorFactory,
) -> None:
    # NVML lists no process of the engine (another PID namespace): nothing to judge.
    sup = make_supervisor(card_memory=list, sleep_settle_s=0.3)
    await sup.apply([sleepy([*FAST, "--sleep-keeps-memory"])], {})
    await ready(sup)
    await sup.apply([sleepy([*FAST, "--sleep-keeps-memory"], sleep_level=1)], {})
    await wait_for(lambda: only(sup).state is ShardState.SLEEPING, what="asleep")
    assert only(sup).sleep_error is None


def test_the_rule_is_per_card_and_unknown_is_not_judged() -> None:
    awake = {"a": 16384, "b": 16384, "c": 0}
    assert judge(awake, {"a": 512, "b": 1638, "c": 9999}, 0.9) is None
    kept = judge(awake, {"a": 512, "b": 1700}, 0.9)
    assert kept is not None and (kept.gpu_uuid, kept.asleep_mib) == ("b", 1700)
    assert "90%" in kept.message and "b" in kept.message
    assert not judgeable({"a": 0}) and judgeable(awake)


async def test_an_engine_never_wakes_beside_an_awake_one_on_its_card(
    make_supervisor: SupervisorFactory,
) -> None:
    # The controller placed r2 on r1's card while r1 slept; asked to wake r1 while r2 is
    # still awake (a controller that lost its memory, say), the agent waits for r2.
    sup = make_supervisor()
    r1 = sleepy(gpus=["GPU-shared"])
    r2 = sleepy(replica_id="r2", gpus=["GPU-shared"])

    def state(rid: str) -> ShardState:
        return next(r.state for r in sup.reports() if r.id == rid)

    await sup.apply([r1], {})
    await wait_for(lambda: state("r1") is ShardState.READY, what="r1 ready")
    await sup.apply([sleepy(gpus=["GPU-shared"], sleep_level=1)], {})
    await wait_for(lambda: state("r1") is ShardState.SLEEPING, what="r1 asleep")
    await sup.apply([sleepy(gpus=["GPU-shared"], sleep_level=1), r2], {})
    await wait_for(lambda: state("r2") is ShardState.READY, what="r2 ready")

    await sup.apply([r1, r2], {})  # wake r1: not while r2 is awake there
    await asyncio.sleep(0.5)  # ten monitor ticks
    assert state("r1") is ShardState.SLEEPING
    await sup.apply([r1, sleepy(replica_id="r2", gpus=["GPU-shared"], sleep_level=1)], {})
    await wait_for(lambda: state("r1") is ShardState.READY, what="r1 awake once r2 sleeps")
    assert state("r2") is ShardState.SLEEPING


def test_auto_level_is_1_when_this_nodes_share_of_the_weights_fits(tmp_path: Path) -> None:
    model = tmp_path / "org" / "m"
    model.mkdir(parents=True)
    (model / "model-00001-of-00002.safetensors").write_bytes(b"x" * 3000)
    (model / "model-00002-of-00002.safetensors").write_bytes(b"x" * 1000)
    (model / "config.json").write_text("{}")  # not weights
    assert sleep_level.weights_bytes(str(model)) == 4000
    assert sleep_level.weights_bytes(str(tmp_path / "absent")) is None
    assert sleep_level.choose(4000, 1, 5000)[0] == 1  # 4000 <= 0.8 x 5000
    assert sleep_level.choose(4000, 1, 4999)[0] == 2
    assert sleep_level.choose(4000, 2, 2500)[0] == 1  # two nodes: half each
    level, why = sleep_level.choose(None, 1, 10**12)
    assert level == 2 and "not known" in why
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:   2048 kB\n")
    assert sleep_level.available_bytes(meminfo) == 2048 * 1024
    assert sleep_level.available_bytes(tmp_path / "none") is None


@pytest.mark.parametrize(("available", "level"), [(10_000, 1), (1_000, 2)])
async def test_auto_level_is_chosen_where_it_sleeps(
    make_supervisor: SupervisorFactory, state_dir: Path, tmp_path: Path, available: int, level: int
) -> None:
    model = tmp_path / "weights"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 4000)
    sup = make_supervisor(host_memory=lambda: available)
    await sup.apply([sleepy()], {"org/m": str(model)})
    await ready(sup)
    # The controller says 2 (what an older agent uses) and auto: this agent chooses.
    await sup.apply([sleepy(sleep_level=2, sleep_auto=True)], {"org/m": str(model)})
    await wait_for(lambda: only(sup).state is ShardState.SLEEPING, what="asleep")
    log = next((state_dir / "logs").glob("r1-0.log")).read_text()
    assert f'"POST /sleep?level={level} HTTP/1.1" 200' in log, log


async def test_an_engine_that_refuses_to_start_able_to_sleep_starts_without(
    make_supervisor: SupervisorFactory, state_dir: Path
) -> None:
    # vLLM's CPU build: --enable-sleep-mode ends its start with "Sleep mode is not
    # supported on current platform." (config/model.py). Here the fake engine refuses
    # an option without its value, with the words its template says to look for.
    sleep = BUILTIN_TEMPLATES["fake"].sleep
    assert sleep is not None
    refusing = sleep.model_copy(
        update={"args": "--latency", "unsupported": "argument --latency: expected one argument"}
    )
    tpl = BUILTIN_TEMPLATES["fake"].model_copy(update={"sleep": refusing})
    sup = make_supervisor(templates={"fake": tpl})
    await sup.apply([sleepy()], {})
    await ready(sup)
    assert b"--enable-sleep-mode" not in proc_file(pid_of(sup), "cmdline")
    assert only(sup).sleep_error is None  # said once asked to sleep, as any refusal
    await sup.apply([sleepy(sleep_level=1)], {})
    await wait_for(lambda: only(sup).sleep_error is not None, what="the sleep error")
    rep = only(sup)
    assert rep.sleep_failure is SleepFailure.NO_SLEEP_MODE and rep.state is ShardState.READY
    assert rep.sleep_error is not None and "refused to start able to" in rep.sleep_error
    assert "argument --latency: expected one argument" in rep.sleep_error
    # The next engine of that template starts without it at once: no failed start.
    await sup.apply([sleepy(replica_id="r2")], {})
    await wait_for(
        lambda: any(r.id == "r2" and r.state is ShardState.READY for r in sup.reports()),
        what="r2 ready",
    )
    assert "expected one argument" not in next((state_dir / "logs").glob("r2-0.log")).read_text()
