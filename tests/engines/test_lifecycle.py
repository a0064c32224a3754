"""The engines' lifecycle without engine processes: adoption from a state file, starts
that fail before a process, kills and their words, the state dir's lock. (Starting,
stopping and exits of real processes: test_supervisor.py.)"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.agent.engine_lifecycle import EngineLifecycle, StateDirBusy
from llmgw.agent.engine_proc import ref_for
from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engine_shard import Kill, KillReason
from llmgw.agent.engine_state import EngineRecord, load_state, save_state
from llmgw.agent.engine_templates import EngineTemplate
from llmgw.wire import ShardAssignment, ShardState


def assignment(replica: str = "r1", **kw: object) -> ShardAssignment:
    base: dict[str, object] = {
        "replica_id": replica,
        "model": "org/m",
        "source": "org/m",
        "engine": "fake",
        "gpus": ["GPU-a"],
    }
    return ShardAssignment.model_validate({**base, **kw})


def record(
    a: ShardAssignment, pid: int, ticks: int, boot: str, state: str, **kw: object
) -> EngineRecord:
    return EngineRecord.model_validate(
        {
            "replica_id": a.replica_id,
            "rank": a.rank,
            "pid": pid,
            "start_ticks": ticks,
            "boot_id": boot,
            "port": 8000,
            "state": state,
            "assignment": a.model_dump(mode="json"),
            "log_path": "",
            "started_at": 1.0,
            **kw,
        }
    )


@pytest.fixture
def settings(tmp_path: Path) -> SupervisorSettings:
    return SupervisorSettings(state_dir=tmp_path / "state", node="n1", address="10.0.0.1")


@pytest.fixture
def lifecycles() -> Iterator[list[EngineLifecycle]]:
    made: list[EngineLifecycle] = []
    yield made
    for life in made:
        life.release()


def test_adoption_keeps_the_living_and_reports_the_dead_once(
    settings: SupervisorSettings, lifecycles: list[EngineLifecycle]
) -> None:
    me = ref_for(os.getpid())  # a live process stands in for an engine left running
    assert me is not None
    dead = (2**22 + 1, 1, me.boot_id)  # no such process
    waking = assignment("waking", sleep_level=2)
    save_state(
        settings.state_path,
        [
            record(waking, me.pid, me.start_ticks, me.boot_id, "waking"),
            record(assignment("newer"), me.pid, me.start_ticks, me.boot_id, "paused"),
            record(assignment("died"), *dead, "ready"),
            record(assignment("stopped"), *dead, "stopping", stop_requested=True),
        ],
    )
    life = EngineLifecycle(settings)
    lifecycles.append(life)
    states = {k[0]: e.state for k, e in life.engines.items()}
    assert states == {
        "waking": ShardState.SLEEPING,  # the wake is asked again
        "newer": ShardState.STARTING,  # a state this version does not know: health decides
        "died": ShardState.FAILED,
    }, "a stop that finished while no agent ran is gone"
    assert life.engines[("waking", 0)].slept_level == 2
    died = life.engines[("died", 0)]
    assert died.ref is None and died.error is not None
    assert "exited while the agent was not running" in died.error
    saved = {r.replica_id for r in load_state(settings.state_path)}
    assert saved == {"waking", "newer"}, "a failure is reported, never saved"
    (failed,) = [r for r in life.reports() if r.state is ShardState.FAILED]
    assert failed.id == "died" and died.reported


def test_a_start_that_cannot_be_built_fails_without_a_process(
    tmp_path: Path, lifecycles: list[EngineLifecycle]
) -> None:
    life = EngineLifecycle(SupervisorSettings(state_dir=tmp_path, node="n1"))  # no address
    lifecycles.append(life)
    worker = assignment("multi", rank=1, nnodes=2)  # no leader address to join
    leader = assignment("leader", nnodes=2)  # rank 0, and the node has no address
    life.converge([assignment("ghost", engine="ghost"), worker, leader], {})
    errors = {r.id: r.error for r in life.reports()}
    assert all(e.ref is None and e.state is ShardState.FAILED for e in life.engines.values())
    assert errors["ghost"] is not None
    assert errors["ghost"].startswith("no engine template named 'ghost' on this node; known: ")
    assert (
        errors["multi"]
        == "cannot build the engine command: rank 1 of 2 has no leader address to join"
    )
    assert (
        errors["leader"]
        == "cannot build the engine command: rank 0 of 2 has no leader address to join"
    )
    assert load_state(tmp_path / "engines.json") == []
    life.converge([worker], {})  # reported, and no longer assigned: dropped
    assert set(life.engines) == {("multi", 1)}, "still assigned: kept failed for the backoff"
    assert life.kills == dict.fromkeys(life.kills, 0), "a failed start is no kill"


def test_a_share_of_the_card_for_a_template_without_its_option_fails_the_start(
    tmp_path: Path, lifecycles: list[EngineLifecycle]
) -> None:
    plain = EngineTemplate(command="plain-engine --port {port}")  # no memory_share_arg
    settings = SupervisorSettings(state_dir=tmp_path, node="n1", templates={"plain": plain})
    life = EngineLifecycle(settings)
    lifecycles.append(life)
    life.converge([assignment("r1", engine="plain", gpu_memory_share=0.45)], {})
    (report,) = life.reports()
    assert report.state is ShardState.FAILED and report.error == (
        "cannot build the engine command: the model asks for gpu_memory_share 0.45, and "
        "template 'plain' has no memory_share_arg to give it to the engine: set one (vLLM: "
        "--gpu-memory-utilization), or leave gpu_memory_share out"
    )


def test_a_kill_is_counted_by_reason_and_quotes_the_log(
    settings: SupervisorSettings, lifecycles: list[EngineLifecycle], tmp_path: Path
) -> None:
    life = EngineLifecycle(settings)
    lifecycles.append(life)
    life.converge([assignment(engine="ghost")], {})
    (eng,) = life.engines.values()
    eng.log_path = tmp_path / "engine.log"
    eng.log_path.write_text("loading shard 1 of 2\nloading shard 2 of 2\n")
    life.kill_failed(eng, Kill(KillReason.HUNG, "hung: 1 request(s) in it"))
    assert eng.state is ShardState.FAILED and eng.exit_code is None
    assert eng.error == (
        f"engine hung: 1 request(s) in it; killed\nlast lines of {eng.log_path}:\n"
        "loading shard 1 of 2\nloading shard 2 of 2"
    )
    assert life.kills["hung"] == 1 and sum(life.kills.values()) == 1
    assert sorted(life.kills) == sorted(r.value for r in KillReason)


def test_one_lifecycle_per_state_dir_until_it_lets_go(
    settings: SupervisorSettings, lifecycles: list[EngineLifecycle]
) -> None:
    first = EngineLifecycle(settings)
    with pytest.raises(StateDirBusy, match=rf"another agent \(pid {os.getpid()}\)"):
        EngineLifecycle(settings)
    first.release()
    first.release()  # twice is once
    lifecycles.append(EngineLifecycle(settings))


@pytest.fixture
def stand_in() -> Iterator[int]:
    """A live process of its own (a session leader: a stop signals only it) standing in
    for an engine left running; its pid."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_followers_engine_outlives_a_reply_that_knows_no_leader_address(
    settings: SupervisorSettings, lifecycles: list[EngineLifecycle], stand_in: int
) -> None:
    """A new controller (a restart, a takeover) answers a follower node that reports
    before its leader's node with no address for the leader: the follower's engine
    keeps running (it restarted, once per failover, before). A different leader
    node is still a restart."""
    me = ref_for(stand_in)
    assert me is not None
    running = assignment("multi", rank=1, nnodes=2, leader_node="g1", leader_address="10.0.0.9")
    save_state(settings.state_path, [record(running, me.pid, me.start_ticks, me.boot_id, "ready")])
    life = EngineLifecycle(settings)
    lifecycles.append(life)
    unknown = running.model_copy(update={"leader_address": None})
    life.converge([unknown], {})
    eng = life.engines[("multi", 1)]
    assert eng.state is ShardState.READY and eng.ref is not None, "kept, not stopped"
    assert eng.assignment.leader_address == "10.0.0.9", "the address it joined, kept"
    moved = running.model_copy(update={"leader_node": "g2", "leader_address": None})
    life.converge([moved], {})
    assert life.engines[("multi", 1)].state is ShardState.STOPPING
