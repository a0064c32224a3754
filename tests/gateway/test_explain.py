"""The gateway's 503 for a declared model nothing serves: `code` is a string, as
in OpenAI's errors, and a model that cannot be placed is not promised a replica
"yet" (issue 23 item 12)."""

from __future__ import annotations

import httpx
import pytest

from llmgw.gateway.explain import Explainer


@pytest.mark.parametrize(
    ("why", "code", "says", "never"),
    [
        ("2 replicas starting", "model_not_ready", "no replica serves it yet: 2 replicas", ""),
        (
            "cannot be placed: needs 1 node x 8 H100",
            "model_unplaceable",
            "is declared but cannot be placed: needs",
            "yet",
        ),
    ],
)
async def test_the_503_says_what_holds_the_model(
    why: str, code: str, says: str, never: str
) -> None:
    e = Explainer()
    await e.start()
    try:
        (url,) = e.set_unserved({"m": why})
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{url}/v1/chat/completions", json={"model": "m"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "5"
        error = r.json()["error"]
        assert error["code"] == code and isinstance(error["code"], str)
        assert says in error["message"]
        assert not never or never not in error["message"]
    finally:
        await e.stop()
