"""The gateway's work dir: a run without --work-dir leaves nothing behind (issue 23 item 13)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.e2e.procs import _stop, clean_env, free_port, llmgw


def test_a_gateway_without_work_dir_removes_its_temp_dir_at_exit(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "gateway.log"
    argv = llmgw(
        "gateway",
        "--controller",
        "http://127.0.0.1:1",  # nobody there: the gateway waits for it, SMG still runs
        "--listen",
        f"127.0.0.1:{free_port()}",
    )
    with out.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**clean_env(), "TMPDIR": str(tmp)},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text()
            time.sleep(0.1)
        (work,) = tmp.glob("llmgw-gateway-*")
        assert f"SMG log in {work}/smg.log" in out.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, out.read_text()
    finally:
        _stop(proc, signal.SIGKILL, timeout=5)
    assert list(tmp.iterdir()) == [], out.read_text()
