"""Tokens metered per tenant and model, read from the answers as they pass.

A whole answer carries its `usage`; the front reads it from the body's end once
the body has passed. A stream carries it only when asked, so the front asks for
it (`ask_usage`): `stream_options.include_usage` and vLLM's
`continuous_usage_stats`, which puts the usage so far on every chunk. The last
chunk's usage is the count; a stream the client leaves mid-way counts what the
last chunk it was sent said (its prompt included: a prompt read and dropped after
the first token costs the engine as much as one answered). Whatever the client
did not ask for is taken out of what it gets (`StreamTap`): the usage member of
each chunk, and the closing usage chunk.

The work is done on bytes, not parsed JSON: a chunk without `"usage"` passes as it
is, and one with it has that member cut out by position (vLLM writes it last, with
no space; anything else is handled too, or passed whole when it cannot be read).

The `Meter` adds up what each request cost, per (tenant, model), until the
follower takes the counts to the controller (gateway/sync.py, each second).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

# The routes whose answers carry OpenAI's `usage`; streams on the first two.
STREAMED = frozenset({"/v1/chat/completions", "/v1/completions"})
METERED = STREAMED | {"/v1/embeddings"}
_USAGE = b'"usage"'
_FLAT = b',"usage":{'
_ASK = b'"stream_options":{"include_usage":true,"continuous_usage_stats":true},'
_SEP = b"\n\n"
# A count in a usage object (read by pattern: a chunk's JSON is not parsed).
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d{1,18})\b')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,18})\b')


class Keep(Enum):
    """What usage a streaming client asked for itself, and so gets."""

    NONE = 0  # none: every usage member and the usage chunk are cut out
    FINAL = 1  # include_usage: the closing usage chunk only
    ALL = 2  # include_usage and continuous_usage_stats: everything as it comes


def ask_usage(body: bytes, parsed: dict[str, Any]) -> tuple[bytes, Keep]:
    """The body of a streaming request with the usage asked of the engine, and what
    of it the client asked for itself."""
    options = parsed.get("stream_options")
    if options is None:
        start = body.index(b"{") + 1  # a JSON object: `{` comes first
        rest = body[start:].lstrip()
        if rest[:1] == b"}":  # an empty object has no member to put a comma before
            return body[:start] + _ASK[:-1] + rest, Keep.NONE
        return body[:start] + _ASK + rest, Keep.NONE
    if not isinstance(options, dict):
        return body, Keep.ALL  # the engine's to refuse
    include, continuous = options.get("include_usage"), options.get("continuous_usage_stats")
    if include is True and continuous is True:
        return body, Keep.ALL
    asked = {**options, "include_usage": True, "continuous_usage_stats": True}
    keep = Keep.FINAL if include is True else Keep.NONE
    return json.dumps({**parsed, "stream_options": asked}).encode(), keep


def _usage_span(event: bytes) -> tuple[int, int, int]:
    """Where the `"usage"` member of a JSON chunk starts (the key), where its object
    value starts, and just past the value's end; the value's start is -1 for a null,
    and all three are -1 without a usage member or one that cannot be read."""
    key = event.rfind(_USAGE)
    if key < 0:
        return -1, -1, -1
    i = key + len(_USAGE)
    n = len(event)
    while i < n and event[i] in b" \t:":
        i += 1
    if event.startswith(b"null", i):
        return key, -1, i + 4
    if i >= n or event[i] != ord("{"):
        return -1, -1, -1
    # Numbers and nested objects only, no strings: each `{` inside asks one more `}`.
    j = event.find(b"}", i)
    inner = event.find(b"{", i + 1, j)
    while inner >= 0 and j >= 0:
        j = event.find(b"}", j + 1)
        inner = event.find(b"{", inner + 1, j)
    if j < 0:
        return -1, -1, -1
    return key, i, j + 1


def _counts(usage: bytes) -> tuple[int, int]:
    """(prompt, completion) from a usage object's bytes (read by pattern)."""
    prompt = _PROMPT.search(usage)
    completion = _COMPLETION.search(usage)
    return (
        0 if prompt is None else int(prompt[1]),
        0 if completion is None else int(completion[1]),
    )


def _without(event: bytes, key: int, end: int) -> bytes:
    """`event` less its member from `key` to `end`, and the comma that joined it."""
    before = event[:key].rstrip()
    if before.endswith(b","):
        return before[:-1] + event[end:]
    after = event[end:].lstrip()
    if after.startswith(b","):
        return event[:key] + after[1:].lstrip()
    return event[:key] + after


class StreamTap:
    """An SSE answer passing through: the usage kept, what the client did not ask
    for cut out. `feed` each piece as it comes, send what it returns.

    Every chunk carries the usage so far, so each is only cut and its usage object
    kept as bytes; the counts are read once, from the last ones (`tokens`)."""

    __slots__ = ("_final", "_keep", "_last", "_rest", "_usage", "error")

    def __init__(self, keep: Keep) -> None:
        self._keep = keep
        self._rest = b""
        self._usage: dict[int, bytes] = {}  # choice -> its last usage object (continuous)
        self._last = b""  # the last usage object of any choice, for the prompt's count
        self._final: bytes | None = None  # the closing chunk's usage object
        self.error = False  # an error event came

    def feed(self, piece: bytes) -> bytes:
        data = self._rest + piece if self._rest else piece
        end = data.rfind(_SEP)
        if end < 0:  # no whole event yet
            self._rest = data
            return b""
        end += len(_SEP)
        whole, self._rest = (data, b"") if end == len(data) else (data[:end], data[end:])
        if b'"error":' in whole:
            self.error = True
        if _USAGE not in whole:
            return whole
        if whole.find(_SEP) == end - len(_SEP):  # one event (as engines write them)
            one = self._event(whole[: -len(_SEP)])
            return b"" if one is None else one + _SEP
        events = whole.split(_SEP)
        out = [self._event(e) for e in events[:-1]]
        return b"".join(e + _SEP for e in out if e is not None)

    def close(self) -> bytes:
        """What is left unsent (an event cut short by the stream's end)."""
        rest, self._rest = self._rest, b""
        return rest

    def _event(self, event: bytes) -> bytes | None:
        # vLLM's shape, compact with `usage` last and flat: `…,"usage":{…}}`.
        key = event.rfind(_FLAT)
        flat = key >= 0 and event.endswith(b"}}") and event.find(b"{", key + len(_FLAT)) < 0
        if flat:
            start, end = key + len(_FLAT) - 1, len(event) - 1
        else:
            key, start, end = _usage_span(event)
            if key < 0:
                return event
        choices = event.find(b'"choices":')
        final = choices >= 0 and event[choices + 10 : choices + 13].lstrip()[:2] == b"[]"
        if start >= 0:
            usage = event[start:end]
            if final:
                self._final = usage
            else:
                self._usage[_choice_of(event, choices)] = self._last = usage
        if self._keep is Keep.ALL or (final and self._keep is Keep.FINAL):
            return event
        if final:
            return None  # the usage chunk the client did not ask for
        return event[:key] + b"}" if flat else _without(event, key, end)

    @property
    def tokens(self) -> tuple[int, int]:
        """(prompt, completion): the closing chunk's, else the last ones sent."""
        if self._final is not None:
            return _counts(self._final)
        prompt = _counts(self._last)[0]
        return prompt, sum(_counts(u)[1] for u in self._usage.values())


def _choice_of(event: bytes, after: int) -> int:
    """The choice a chunk belongs to (vLLM's continuous usage counts per choice):
    the first `index` after `after` (where its `choices` begin)."""
    at = event.find(b'"index":', max(after, 0))
    if at < 0:
        return 0
    at += 8
    if event[at : at + 1] == b" ":
        at = len(event) - len(event[at:].lstrip())
    n = 0
    for c in event[at : at + 12]:
        if not 48 <= c <= 57:
            break
        n = n * 10 + c - 48
    return n


def usage_of(body: bytes) -> tuple[int, int] | None:
    """(prompt, completion) from a whole answer's `usage`; None without one."""
    _, start, end = _usage_span(body)
    if start < 0:
        return None
    return _counts(body[start:end])


@dataclass(slots=True)
class Tally:
    """One (tenant, model)'s counts over a stretch of time."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    rate_limited: int = 0

    def add(self, other: Tally) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.errors += other.errors
        self.rate_limited += other.rate_limited


class Meter:
    """What requests cost per (tenant, model) since the last `cut`."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], Tally] = {}

    def _tally(self, tenant: str, model: str) -> Tally:
        found = self._open.get((tenant, model))
        if found is None:
            found = self._open[(tenant, model)] = Tally()
        return found

    def served(self, tenant: str, model: str, prompt: int, completion: int, error: bool) -> None:
        t = self._tally(tenant, model)
        t.requests += 1
        t.prompt_tokens += prompt
        t.completion_tokens += completion
        t.errors += error

    def refused(self, tenant: str, model: str) -> None:
        """A request over a limit: answered 429 here, never sent on."""
        self._tally(tenant, model).rate_limited += 1

    def cut(self, most: int) -> dict[tuple[str, str], Tally]:
        """The counts so far (at most `most` of them: the rest wait for the next)."""
        if len(self._open) <= most:
            taken, self._open = self._open, {}
            return taken
        keys = list(self._open)[:most]
        return {k: self._open.pop(k) for k in keys}

    def __bool__(self) -> bool:
        return bool(self._open)
