"""Crash reasons name the cause, not the exit noise (issue 24, finding 3)."""

from __future__ import annotations

import sys
from pathlib import Path

from llmgw import present
from llmgw.agent.exit_cause import exit_reason, looks_like_cause
from llmgw.render import clean
from llmgw.wire import ReplicaReport, ShardState

from .conftest import SupervisorFactory, assignment, wait_for

# What a vLLM engine prints when its worker is SIGKILLed (trimmed from a real run:
# the cause at line 774 of 862, then shutdown noise).
CAUSE = (
    "(EngineCore_DP0 pid=4242) ERROR 12-03 20:11:02 [multiproc_executor.py:150] "
    "Worker proc VllmWorker-0 died unexpectedly, shutting down executor."
)
CRASH = "\n".join(
    [
        *(
            f"(APIServer pid=4241) INFO 12-03 20:10:00 [loggers.py:1] throughput {i}"
            for i in range(770)
        ),
        "(APIServer pid=4241) INFO 12-03 20:11:01 [api_server.py:1] GET /v1/models 200",
        "(EngineCore_DP0 pid=4242) INFO 12-03 20:11:02 [core.py:1] step",
        "(EngineCore_DP0 pid=4242) INFO 12-03 20:11:02 [core.py:1] step",
        CAUSE,
        "(APIServer pid=4241) ERROR 12-03 20:11:02 [async_llm.py:1] AsyncLLM output_handler failed.",
        "(APIServer pid=4241) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        *(f"nanobind: leaked {i} instances of type 'xgrammar.GrammarMatcher'!" for i in range(60)),
        *(["resource_tracker.py:254: UserWarning: leaked semaphore objects"] * 20),
    ]
)


def test_the_first_cause_line_is_found_past_the_noise(tmp_path: Path) -> None:
    log = tmp_path / "r1-0.log"
    log.write_text(
        "=== 2026-12-03 20:00:00 llmgw agent n1: earlier run\nRuntimeError: an earlier crash\n"
        "=== 2026-12-03 20:10:00 llmgw agent n1: CUDA_VISIBLE_DEVICES=GPU-a vllm serve\n" + CRASH
    )
    reason = exit_reason("killed by SIGKILL", log)
    first, *excerpt = reason.splitlines()
    assert first == f"engine killed by SIGKILL: {CAUSE}"
    assert "EngineDeadError" in reason, "the lines after the cause come with it"
    assert "leaked 5 instances" not in reason and "an earlier crash" not in reason
    assert len(excerpt) <= 8


def test_cause_patterns() -> None:
    for line in (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "(EngineCore pid=1) ERROR [core.py:9] ValueError: max_model_len too large",
        "Worker proc VllmWorker-1 died unexpectedly",
    ):
        assert looks_like_cause(line), line
    for line in (
        "nanobind: leaked 3 instances of type 'xgrammar.GrammarMatcher'!",
        "UserWarning: resource_tracker: leaked semaphore objects",
        "INFO 12-03 [loggers.py:1] Avg prompt throughput: 3.1 tokens/s, errors: 0",
    ):
        assert not looks_like_cause(line), line


def test_tables_show_one_line() -> None:
    reason = "engine killed by SIGKILL: Worker proc died unexpectedly\nfrom log:\nline a\nline b"
    rep = ReplicaReport(id="r1", model="m", state=ShardState.FAILED, error=reason)
    cell = clean(present.one_line(rep.error or ""))
    assert cell == "engine killed by SIGKILL: Worker proc died unexpectedly"
    assert "\\n" not in present.short_words(f"its replicas fail: {reason}")


CRASHER = f"""
import sys, time
print({CRASH!r}, flush=True)
sys.exit(1)
"""


async def test_supervisor_reports_the_cause_of_a_crash(
    make_supervisor: SupervisorFactory, tmp_path: Path
) -> None:
    script = tmp_path / "crasher.py"
    script.write_text(CRASHER)
    sup = make_supervisor(templates={"crasher": f"{sys.executable} {script} --port {{port}}"})
    await sup.apply([assignment(engine="crasher", engine_args=[])], {})
    await wait_for(lambda: [r.state for r in sup.reports()] == [ShardState.FAILED], 15, "crash")
    (rep,) = sup.reports()
    assert rep.error is not None
    assert rep.error.splitlines()[0] == f"engine exited with code 1: {CAUSE}"
