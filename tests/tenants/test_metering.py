"""Metering at the gateway, in process: the usage asked of the engine, read from
whole answers and streams, and cut out of what a client did not ask for."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.gateway.metering import Keep, Meter, StreamTap, ask_usage, usage_of


def chunk(content: str | None, usage: dict[str, int] | None, index: int = 0) -> bytes:
    """A chunk as vLLM writes it: compact, `usage` last and absent when not asked."""
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [] if content is None else [{"index": index, "delta": {"content": content}}],
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def used(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def stream(n: int, prompt: int = 5) -> list[bytes]:
    """A stream with continuous usage: n tokens, then the usage chunk and [DONE]."""
    out = [chunk(" x", used(prompt, i + 1)) for i in range(n)]
    return [*out, chunk(None, used(prompt, n)), b"data: [DONE]\n\n"]


def events(data: bytes) -> list[Any]:
    return [
        json.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]" for e in data.split(b"\n\n") if e
    ]


def test_the_usage_is_asked_and_what_the_client_asked_is_kept() -> None:
    body = b'{"model":"m","stream":true}'
    asked, keep = ask_usage(body, json.loads(body))
    assert keep is Keep.NONE
    assert json.loads(asked) == {
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "model": "m",
        "stream": True,
    }
    mine = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    asked, keep = ask_usage(json.dumps(mine).encode(), mine)
    assert keep is Keep.FINAL and json.loads(asked)["stream_options"]["continuous_usage_stats"]
    both = {**mine, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    raw = json.dumps(both).encode()
    assert ask_usage(raw, both) == (raw, Keep.ALL)  # passed as it came
    spaced = b'  {\n "model": "m", "stream": true}'
    assert json.loads(ask_usage(spaced, json.loads(spaced))[0])["model"] == "m"


@pytest.mark.parametrize("keep", list(Keep))
def test_a_stream_is_counted_and_gets_only_what_was_asked(keep: Keep) -> None:
    tap = StreamTap(keep)
    got = b"".join(tap.feed(piece) for piece in stream(3)) + tap.close()
    assert tap.tokens == (5, 3) and not tap.error
    out = events(got)
    assert out[-1] == "[DONE]"
    texts = [e for e in out[:-1] if e["choices"]]
    assert len(texts) == 3
    if keep is Keep.ALL:
        assert got == b"".join(stream(3))
    else:
        assert all("usage" not in e for e in texts)
        closing = [e for e in out[:-1] if not e["choices"]]
        assert closing == ([] if keep is Keep.NONE else [json.loads(stream(3)[3][6:])])


def test_pieces_split_anywhere_pass_whole_events() -> None:
    whole = b"".join(stream(4))
    tap = StreamTap(Keep.NONE)
    got = b"".join(tap.feed(whole[i : i + 7]) for i in range(0, len(whole), 7)) + tap.close()
    assert tap.tokens == (5, 4)
    assert [e for e in events(got) if e != "[DONE]"] == [
        json.loads(chunk(" x", None)[6:]) for _ in range(4)
    ]


def test_a_stream_cut_short_counts_what_was_sent() -> None:
    tap = StreamTap(Keep.NONE)
    for piece in stream(5)[:2]:  # the client left after two tokens
        tap.feed(piece)
    assert tap.tokens == (5, 2)
    n_choices = StreamTap(Keep.NONE)
    for i in range(3):
        for index in (0, 1):
            n_choices.feed(chunk(" x", used(4, i + 1), index))
    assert n_choices.tokens == (4, 6)  # vLLM counts per choice: the choices' sum
    spaced = StreamTap(Keep.NONE)
    for index in (0, 1, 12):
        spaced.feed(
            b'data: {"choices": [{"index": %d, "delta": {}}], "usage": {"prompt_tokens": 4, '
            b'"completion_tokens": 2}}\n\n' % index
        )
    assert spaced.tokens == (4, 6)


def test_other_shapes_of_usage_are_cut_out_or_passed_whole() -> None:
    spaced = b'data: {"usage": {"prompt_tokens": 2, "completion_tokens": 1}, "choices": [{"index": 0}]}\n\n'
    tap = StreamTap(Keep.NONE)
    assert json.loads(tap.feed(spaced)[6:]) == {"choices": [{"index": 0}]}
    assert tap.tokens == (2, 1)
    nulls = b'data: {"choices":[{"index":0}],"usage":null}\n\n'  # OpenAI's shape
    assert json.loads(StreamTap(Keep.NONE).feed(nulls)[6:]) == {"choices": [{"index": 0}]}
    broken = b'data: {"choices":[{"index":0}],"usage":{"prompt_tokens":\n\n'
    assert StreamTap(Keep.NONE).feed(broken) == broken  # unreadable: passed as it is
    tap = StreamTap(Keep.NONE)
    tap.feed(b'data: {"error":{"message":"upstream cut"}}\n\n')
    assert tap.error


def test_a_whole_answer_s_usage() -> None:
    answer = {"id": "x", "choices": [{"message": {"content": '"usage": {}'}}], "usage": used(7, 3)}
    assert usage_of(json.dumps(answer).encode()) == (7, 3)
    details = {**used(7, 3), "prompt_tokens_details": {"cached_tokens": 4}}
    assert usage_of(json.dumps({"usage": details, "x": 1}).encode()) == (7, 3)
    assert usage_of(b'{"error": {"message": "no"}}') is None


def test_the_meter_adds_up_per_tenant_and_model_and_cuts_in_bounded_batches() -> None:
    meter = Meter()
    meter.served("acme", "m", 5, 3, error=False)
    meter.served("acme", "m", 2, 0, error=True)
    meter.refused("acme", "m")
    meter.served("beta", "m", 1, 1, error=False)
    first = meter.cut(1)
    assert list(first) == [("acme", "m")]
    t = first[("acme", "m")]
    assert (t.requests, t.prompt_tokens, t.completion_tokens, t.errors, t.rate_limited) == (
        2,
        7,
        3,
        1,
        1,
    )
    assert meter and list(meter.cut(10)) == [("beta", "m")] and not meter
