"""Client keys at the controller: made by an admin and shown once, listed without the
key, revoked; the gateways' feed of digests, long-polled; who may do what. Hashing and
model patterns (llmgw.tenant_keys); `ctl keys` against a real controller."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.store.sqlite import Store
from llmgw.tenant_keys import Models, digest
from tests.e2e.procs import ControllerProcess

GATEWAY, ADMIN, READ = "gateway-secret", "admin-secret", "read-secret"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def client(aiohttp_client: AiohttpClient, tmp_path: Path) -> TestClient:
    tokens = Tokens(
        ((GATEWAY, "gw", Role.GATEWAY), (ADMIN, "alice", Role.ADMIN), (READ, "reader", Role.READ))
    )
    settings = ControllerSettings(state_dir=tmp_path, tokens=tokens)
    return await aiohttp_client(create_app(settings))


# -- hashing and patterns ----------------------------------------------------------------


def test_the_digest_is_the_keys_sha256() -> None:
    assert digest("sk-llmgw-abc-xyz") == hashlib.sha256(b"sk-llmgw-abc-xyz").hexdigest()
    assert digest("sk-llmgw-abc-xyz") != digest("sk-llmgw-abc-xyZ")


@pytest.mark.parametrize(
    ("patterns", "allowed", "refused"),
    [
        (["*"], ["chat", "org/llama-8b", ""], []),
        ([], ["chat", "anything"], []),
        (["llama-*"], ["llama-8b", "llama-"], ["chat", "xllama-8b", "Llama-8b"]),
        (["chat", "org/*"], ["chat", "org/m", "org/a/b"], ["chat2", "org", "other/m"]),
        (["m?"], ["m1", "mx"], ["m", "m12"]),
        (["m[12]"], ["m1", "m2"], ["m3", "m[12]"]),
        (["a.b"], ["a.b"], ["axb"]),  # a dot is a dot, not any character
    ],
)
def test_model_patterns_match_whole_names(
    patterns: list[str], allowed: list[str], refused: list[str]
) -> None:
    models = Models(patterns)
    assert [m for m in allowed if models.allows(m)] == allowed
    assert [m for m in refused if models.allows(m)] == []


# -- the API -------------------------------------------------------------------------------


async def test_a_key_is_shown_once_kept_hashed_and_listed_without_it(
    client: TestClient, tmp_path: Path
) -> None:
    resp = await client.post(
        "/v1/keys",
        json={"tenant": "acme", "models": ["llama-*", "chat"], "expires_s": 3600},
        headers=auth(ADMIN),
    )
    assert resp.status == 201, await resp.text()
    made = await resp.json()
    key = made["key"]
    assert key.startswith(f"sk-llmgw-{made['id']}-") and len(key) > 40
    assert made["tenant"] == "acme" and made["models"] == ["llama-*", "chat"]
    assert made["expires_at"] == pytest.approx(made["created_at"] + 3600)
    assert made["by"] == "alice" and made["state"] == "valid"

    listed = await (await client.get("/v1/keys", headers=auth(READ))).json()
    assert [k["id"] for k in listed] == [made["id"]]
    assert listed[0]["key"] is None and "digest" not in listed[0]
    assert key not in json.dumps(listed)

    # The store holds its SHA-256, and nothing of the key itself.
    (stored,) = Store(tmp_path).client_keys()
    assert stored.digest == hashlib.sha256(key.encode()).hexdigest()
    assert key.encode() not in (tmp_path / "controller.sqlite3").read_bytes()

    feed = await (await client.get("/v1/keys/feed", headers=auth(GATEWAY))).json()
    assert feed["keys"] == [
        {
            "id": made["id"],
            "tenant": "acme",
            "digest": stored.digest,
            "models": ["llama-*", "chat"],
            "expires_at": made["expires_at"],
        }
    ]

    resp = await client.delete(f"/v1/keys/{made['id']}", headers=auth(ADMIN))
    assert resp.status == 200
    assert await (await client.get("/v1/keys", headers=auth(READ))).json() == []
    assert (await client.delete(f"/v1/keys/{made['id']}", headers=auth(ADMIN))).status == 404
    assert Store(tmp_path).client_keys() == []


async def test_only_an_admin_makes_or_revokes_and_only_gateways_read_the_feed(
    client: TestClient,
) -> None:
    body = {"tenant": "acme"}
    for token in (READ, GATEWAY):
        assert (await client.post("/v1/keys", json=body, headers=auth(token))).status == 403
        assert (await client.delete("/v1/keys/abc", headers=auth(token))).status == 403
    assert (await client.post("/v1/keys", json=body)).status == 401
    assert (await client.get("/v1/keys", headers=auth(GATEWAY))).status == 403
    for token in (READ, ADMIN):
        assert (await client.get("/v1/keys/feed", headers=auth(token))).status == 403
    made = await (await client.post("/v1/keys", json=body, headers=auth(ADMIN))).json()
    assert made["models"] == ["*"], "no pattern: every model"
    assert made["expires_at"] is None


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"tenant": "a b"},
        {"tenant": ""},
        {"tenant": "x" * 65},
        {"tenant": "acme", "models": ["bad\nname"]},
        {"tenant": "acme", "models": "chat"},
        {"tenant": "acme", "expires_s": 0},
        {"tenant": "acme", "expires_s": "1h"},
        {"tenant": "acme", "key": "chosen-by-the-client"},
    ],
)
async def test_a_bad_request_is_a_400_and_makes_nothing(
    client: TestClient, body: dict[str, object]
) -> None:
    resp = await client.post("/v1/keys", json=body, headers=auth(ADMIN))
    assert resp.status == 400, body
    assert await (await client.get("/v1/keys", headers=auth(READ))).json() == []


async def test_the_feed_long_poll_wakes_on_a_new_key_and_on_a_revoke(client: TestClient) -> None:
    first = await (await client.get("/v1/keys/feed", headers=auth(GATEWAY))).json()
    assert first["keys"] == []

    def poll(cursor: str) -> asyncio.Task[object]:
        url = f"/v1/keys/feed?since={cursor}&wait=20"
        return asyncio.create_task(client.get(url, headers=auth(GATEWAY)))

    waiting = poll(first["cursor"])
    await asyncio.sleep(0.2)
    assert not waiting.done()
    made = await (
        await client.post("/v1/keys", json={"tenant": "acme"}, headers=auth(ADMIN))
    ).json()
    second = await (await asyncio.wait_for(waiting, 5)).json()  # type: ignore[attr-defined]
    assert [k["id"] for k in second["keys"]] == [made["id"]]
    assert second["cursor"] != first["cursor"]

    waiting = poll(second["cursor"])
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await client.delete(f"/v1/keys/{made['id']}", headers=auth(ADMIN))
    third = await (await asyncio.wait_for(waiting, 5)).json()  # type: ignore[attr-defined]
    assert third["keys"] == []
    # A cursor the controller did not issue (another term's) is answered at once.
    resp = await asyncio.wait_for(
        client.get("/v1/keys/feed?since=old.3&wait=20", headers=auth(GATEWAY)), 5
    )
    assert resp.status == 200
    assert (await client.get("/v1/keys/feed?wait=99", headers=auth(GATEWAY))).status == 400


async def test_last_use_comes_from_gateway_statuses(client: TestClient) -> None:
    made = await (
        await client.post("/v1/keys", json={"tenant": "acme"}, headers=auth(ADMIN))
    ).json()
    status = {"name": "gw-1", "keys_used": {made["id"]: 1_900_000_000.0}}
    resp = await client.post("/v1/gateways/status", json=status, headers=auth(GATEWAY))
    assert resp.status == 200
    (listed,) = await (await client.get("/v1/keys", headers=auth(READ))).json()
    assert listed["last_used"] == 1_900_000_000.0


# -- ctl keys --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("keys-state")
    proc = ControllerProcess(
        state.with_name(f"{state.name}-controller.log"),
        state_dir=state,
        env={"LLMGW_ADMIN_TOKEN": ADMIN, "LLMGW_READ_TOKEN": READ},
    )
    proc.start()
    try:
        yield proc.url
    finally:
        proc.stop()
        proc.close()


def ctl(url: str, *args: str, token: str = ADMIN) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLMGW_TOKEN": token, "LLMGW_CONTROLLER": url}
    env.pop("LLMGW_CONTEXT", None)
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def test_ctl_keys_create_list_revoke(controller: str) -> None:
    made = ctl(controller, "keys", "create", "--tenant", "acme", "--models", "llama-*", "chat")
    assert made.returncode == 0, made.stderr
    key = made.stdout.splitlines()[0]
    assert made.stdout == f"{key}\n", "the key alone on stdout: KEY=$(llmgw ctl keys create ...)"
    assert key.startswith("sk-llmgw-")
    assert "shown only now" in made.stderr and key not in made.stderr

    listed = ctl(controller, "keys", "list", "-o", "json", token=READ)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["tenant"] == "acme" and row["models"] == ["llama-*", "chat"]
    assert row["expires_at"] is None and row["last_used"] is None
    assert key not in listed.stdout
    table = ctl(controller, "keys", "list", token=READ)
    assert row["id"] in table.stdout and "llama-* chat" in table.stdout and "never" in table.stdout

    refused = ctl(controller, "keys", "create", "--tenant", "acme", token=READ)
    assert refused.returncode == 1 and "read" in refused.stderr
    assert ctl(controller, "keys", "revoke", row["id"], token=READ).returncode == 1

    timed = ctl(controller, "keys", "create", "--tenant", "beta", "--expires", "1h")
    assert timed.returncode == 0, timed.stderr
    assert "expires" in timed.stderr

    revoked = ctl(controller, "keys", "revoke", row["id"])
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout == f"{row['id']} revoked\n"
    left = json.loads(ctl(controller, "keys", "list", "-o", "json").stdout)
    assert [k["tenant"] for k in left] == ["beta"]
    assert ctl(controller, "keys", "revoke", row["id"]).returncode == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["keys", "create"], "needs --tenant"),
        (["keys", "revoke"], "needs the ID"),
        (["keys", "list", "--tenant", "a"], "go with `keys create`"),
        (["keys", "create", "--tenant", "a", "--expires", "0"], "positive duration"),
    ],
)
def test_ctl_keys_usage_errors(controller: str, args: list[str], words: str) -> None:
    done = ctl(controller, *args)
    assert done.returncode == 2 and words in done.stderr, done.stderr
