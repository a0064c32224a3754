"""The fake engine asks for a key as vLLM does (issue 36 item 1): with VLLM_API_KEY in
its environment (or --api-key), every /v1 path but an OPTIONS needs `Authorization:
Bearer KEY`, else 401 `{"error": "Unauthorized"}`; /health, /metrics, /load and the
sleep endpoints answer without (vLLM guards only its API prefixes). A real process
whose key is in its environment, never on its command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.procs import free_port

KEY = "engine-key-7f3a9c1e"


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    argv = [sys.executable, "-m", "llmgw.agent.fake_engine", "--port", str(port)]
    argv += ["--model", "org/m", "--load-seconds", "0", "--latency", "0.01"]
    env = {**os.environ, "VLLM_API_KEY": KEY, "VLLM_SERVER_DEV_MODE": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_api_needs_the_key_and_the_rest_does_not(
    engine: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = engine
    body = {"model": "org/m", "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
        refused = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
        assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 401
    good = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=good).status_code == 200
    assert httpx.options(f"{url}/v1/models").status_code != 401  # as vLLM: OPTIONS passes
    for path in ("/health", "/metrics", "/load", "/is_sleeping"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    # The key came through the environment: nothing on the command line shows it.
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline


def test_the_openai_client_meets_a_wrong_key_as_openai_says(
    engine: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = engine
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.models.list()
    assert refused.value.status_code == 401
    right = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in right.models.list()] == ["org/m"]


def test_without_a_key_nothing_is_asked() -> None:
    from llmgw.agent.fake_engine import FakeConfig, make_app

    app = make_app(FakeConfig(api_keys=()))
    assert len(app.middlewares) == 1  # the access log alone
