"""The fake engine as the official `openai` client meets it (issue 35 item 6): a
newcomer's first client talks to it, so it answers as an OpenAI server does. Two
real fake-engine processes, so ids are seen to be unique across engines."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk, ChatCompletionStreamOptionsParam

from tests.e2e.procs import free_port


def _start(port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "llmgw.agent.fake_engine", "--port", str(port)]
    argv += ["--model", "org/m", "--load-seconds", "0", "--latency", "0.01"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ready(port: int) -> None:
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the fake engine on {port} never got ready")


@contextlib.contextmanager
def _engines() -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    """Two fresh fake engines, and a client for each (retries off)."""
    ports = [free_port(), free_port()]
    procs = [_start(p) for p in ports]
    try:
        for p in ports:
            _wait_ready(p)
        one, two = (
            openai.OpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key="none", max_retries=0)
            for p in ports
        )
        yield one, two
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    with _engines() as both:
        yield both


def test_chat_and_completion_with_usage(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    one, _ = clients
    chat = one.chat.completions.create(
        model="org/m", messages=[{"role": "user", "content": "a b c"}], max_tokens=4
    )
    assert chat.choices[0].message.content == " lorem" * 4
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    text = one.completions.create(model="org/m", prompt="a b", max_tokens=3)
    assert text.choices[0].text == " lorem" * 3 and text.usage is not None


@pytest.mark.parametrize("chat", [True, False])
def test_a_stream_with_include_usage_ends_with_a_usage_chunk(
    clients: tuple[openai.OpenAI, openai.OpenAI], chat: bool
) -> None:
    one, _ = clients
    options: ChatCompletionStreamOptionsParam = {"include_usage": True}
    chunks: list[ChatCompletionChunk] | list[Completion]
    if chat:
        chunks = list(
            one.chat.completions.create(
                model="org/m",
                messages=[{"role": "user", "content": "a b c"}],
                max_tokens=3,
                stream=True,
                stream_options=options,
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        chunks = list(
            one.completions.create(
                model="org/m", prompt="a b c", max_tokens=3, stream=True, stream_options=options
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == " lorem" * 3
    *body, last = chunks
    assert last.choices == [] and last.usage is not None, last  # as OpenAI and vLLM send it
    prompt = 4 if chat else 3  # the chat template adds the role: "user: a b c"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt, 3)
    assert last.usage.total_tokens == prompt + 3
    assert all(c.usage is None for c in body)
    # Not asked for: no usage chunk.
    plain = one.chat.completions.create(
        model="org/m", messages=[{"role": "user", "content": "a"}], max_tokens=2, stream=True
    )
    assert all(c.choices and c.usage is None for c in plain)


def test_n_choices_are_served(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    one, _ = clients
    chat = one.chat.completions.create(
        model="org/m", messages=[{"role": "user", "content": "a"}], max_tokens=2, n=2
    )
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    text = one.completions.create(model="org/m", prompt="a", max_tokens=2, n=3)
    assert [c.index for c in text.choices] == [0, 1, 2]
    stream = one.chat.completions.create(
        model="org/m",
        messages=[{"role": "user", "content": "a"}],
        max_tokens=2,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    got: dict[int, str] = {}
    finished: set[int] = set()
    chunks = list(stream)
    for c in chunks:
        for choice in c.choices:
            got[choice.index] = got.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason is not None:
                finished.add(choice.index)
    assert got == {0: " lorem" * 2, 1: " lorem" * 2} and finished == {0, 1}
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 4


def test_bad_requests_raise_the_clients_exceptions_with_string_codes(
    clients: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    one, _ = clients
    with pytest.raises(openai.BadRequestError) as bad:
        one.chat.completions.create(
            model="org/m", messages=[{"role": "user", "content": "a"}], max_tokens=-1
        )
    assert bad.value.type == "invalid_request_error" and bad.value.param == "max_tokens"
    assert bad.value.code is None or isinstance(bad.value.code, str)
    with pytest.raises(openai.BadRequestError) as many:
        one.chat.completions.create(model="org/m", messages=[{"role": "user", "content": "a"}], n=0)
    assert many.value.param == "n" and many.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as missing:
        one.completions.create(model="nope", prompt="a")
    assert missing.value.code == "model_not_found"
    assert missing.value.type == "invalid_request_error"
    assert "nope" in missing.value.message


def test_ids_are_unique_across_engines() -> None:
    with _engines() as fresh:  # fresh: a counter per engine starts both at the same id
        ids = [
            c.chat.completions.create(
                model="org/m", messages=[{"role": "user", "content": "a"}], max_tokens=1
            ).id
            for c in fresh
            for _ in range(3)
        ]
    assert len(set(ids)) == 6 and all(i.startswith("chatcmpl-") for i in ids), ids


def test_continuous_usage_stats_as_vllm_and_stream_options_only_with_a_stream(
    clients: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    """vLLM's `continuous_usage_stats` (what the gateway asks for, to meter a stream
    cut short): every chunk carries the usage so far, its choice's tokens; vLLM
    refuses stream_options on a request that does not stream."""
    one, _ = clients
    base = str(one.base_url).rstrip("/")
    body = {
        "model": "org/m",
        "prompt": "a b c",
        "max_tokens": 3,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with httpx.stream("POST", f"{base}/completions", json=body, timeout=10) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    tokens = [e for e in events if e["choices"] and e["choices"][0]["text"]]
    assert [(e["choices"][0]["index"], e["usage"]["completion_tokens"]) for e in tokens] == [
        (0, 1),
        (1, 1),
        (0, 2),
        (1, 2),
        (0, 3),
        (1, 3),
    ]
    assert all(e["usage"]["prompt_tokens"] == 3 for e in events)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6
    plain = {k: v for k, v in body.items() if k != "stream"}
    r = httpx.post(f"{base}/completions", json=plain, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
