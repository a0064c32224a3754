"""Start to /health 200 and resident memory: a real vLLM (CPU build) against the fake engine.

    .venv/bin/python bench/bench_engine_start.py [--vllm-python PATH] [--runs 3] [--core 1]

Each engine is started as the agent starts it (the built-in templates' arguments, in a
session of its own), timed until `/health` answers 200, then its resident memory is
summed over its process group (vLLM runs an API server, an engine core and a worker),
and one request is timed. The fake engine is the baseline, measured in the same run:
the figures print as ratios to it. The vLLM engine is pinned to `--core` and uses the
real-engine test's settings (1 GiB of KV cache, float32, --enforce-eager).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmgw.agent.engine_templates import BUILTIN_TEMPLATES, render  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_rss_mib(pgid: int) -> float:
    total = 0
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            total += int((entry / "statm").read_text().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total / 2**20


def one_run(
    argv: list[str], env: dict[str, str], port: int, model: str
) -> tuple[float, float, float]:
    """(seconds to /health 200, RSS MiB once ready, one request's seconds)."""
    with tempfile.TemporaryFile() as log:
        return _timed(argv, env, port, model, log)


def _timed(
    argv: list[str], env: dict[str, str], port: int, model: str, log: Any
) -> tuple[float, float, float]:
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if proc.poll() is not None:
                log.seek(0)
                sys.exit(f"{argv[0]} exited {proc.returncode}:\n{log.read()[-3000:].decode()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        ready = time.monotonic() - started
        time.sleep(1.0)  # let it settle after its first answer
        rss = group_rss_mib(proc.pid)
        sent = time.monotonic()
        body = {"model": model, "prompt": "The quick brown fox", "max_tokens": 16}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        r.raise_for_status()
        return ready, rss, time.monotonic() - sent
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def command(name: str, executable: str | None, values: dict[str, str]) -> list[str]:
    template = BUILTIN_TEMPLATES[name]
    if executable is not None:
        template = template.model_copy(update={"executable": executable})
    return render(template.command_for(0, 1), values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--vllm-python", default=os.environ.get("LLMGW_TEST_VLLM_PYTHON"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--core", default="1", help="the core the vLLM engine is pinned to")
    args = p.parse_args()
    if not args.vllm_python:
        sys.exit("give --vllm-python (or LLMGW_TEST_VLLM_PYTHON): see .ci/vllm-env")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny-llama"
        subprocess.run(
            [args.vllm_python, str(ROOT / "tests/real_engine/make_model.py"), str(model_dir)],
            check=True,
            capture_output=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        figures: dict[str, list[tuple[float, float, float]]] = {"fake": [], "vllm": []}
        for _ in range(args.runs):
            for name in ("fake", "vllm"):
                port = free_port()
                values = {
                    "python": sys.executable,
                    "source": str(model_dir),
                    "model": "tiny",
                    "host": "127.0.0.1",
                    "port": str(port),
                    "gpus": "1",
                }
                env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
                if name == "fake":
                    argv = command("fake", None, values)
                else:
                    exe = f"{args.vllm_python} -m vllm.entrypoints.openai.api_server"
                    argv = command("vllm", exe, values)
                    argv += ["--enforce-eager", "--dtype", "float32", "--max-model-len", "512"]
                    env.update(VLLM_CPU_OMP_THREADS_BIND=args.core, VLLM_CPU_KVCACHE_SPACE="1")
                figures[name].append(one_run(argv, env, port, "tiny"))
                print(
                    f"{name}: start {figures[name][-1][0]:.1f} s, RSS {figures[name][-1][1]:.0f} MiB"
                )
    fake = [statistics.median(x) for x in zip(*figures["fake"], strict=True)]
    vllm = [statistics.median(x) for x in zip(*figures["vllm"], strict=True)]
    print(f"\nmedian of {args.runs} runs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'':8} {'start to /health 200':>22} {'RSS':>10} {'one request (16 tokens)':>25}")
    for name, (start, rss, req) in (("fake", fake), ("vllm", vllm)):
        print(f"{name:8} {start:>20.2f} s {rss:>6.0f} MiB {req * 1000:>22.0f} ms")
    print(
        f"{'vllm/fake':8} {vllm[0] / fake[0]:>20.1f} x {vllm[1] / fake[1]:>6.1f} x {vllm[2] / fake[2]:>22.1f} x"
    )


if __name__ == "__main__":
    main()
