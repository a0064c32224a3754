"""The gateway's keyring: digests from the controller, keys from the file, expiry,
and which keys were used (for the status)."""

from __future__ import annotations

import time

from llmgw.gateway.keyring import Keyring
from llmgw.gateway.keys import ApiKey
from llmgw.tenant_keys import digest
from llmgw.wire import ClientKeyEntry


def entry(
    key_id: str, key: str, models: list[str], expires_at: float | None = None
) -> ClientKeyEntry:
    return ClientKeyEntry(
        id=key_id, tenant=f"t-{key_id}", digest=digest(key), models=models, expires_at=expires_at
    )


def test_nothing_is_served_before_the_controllers_keys_are_known() -> None:
    ring = Keyring()
    assert not ring.known and ring.required
    ring.set_controller_keys([])
    assert ring.known and not ring.required, "no key anywhere: open (loopback only)"
    ring.set_controller_keys([entry("k1", "sk-one", ["*"])])
    assert ring.required


def test_a_key_is_found_by_its_digest_and_never_kept() -> None:
    ring = Keyring([ApiKey("filed", "sk-from-file-1")])
    ring.set_controller_keys(
        [entry("k1", "sk-one", ["llama-*"]), entry("k2", "sk-gone", ["*"], time.time() - 1)]
    )
    one = ring.grant("sk-one")
    assert one is not None and one.tenant == "t-k1" and not one.from_file
    assert one.models.allows("llama-8b") and not one.models.allows("chat")
    assert ring.grant("sk-gone") is None, "expired"
    assert ring.grant("sk-onE") is None and ring.grant("") is None
    filed = ring.grant("sk-from-file-1")
    assert filed is not None and filed.from_file and filed.models.every
    assert "sk-one" not in repr(vars(ring)), "only digests are held"
    assert ring.take_used().keys() == {"k1"}, "controller keys used, for last_used"
    assert ring.take_used() == {}


def test_a_revoked_key_goes_and_the_file_keys_stay() -> None:
    ring = Keyring([ApiKey("filed", "sk-from-file-1")])
    ring.set_controller_keys([entry("k1", "sk-one", ["*"])])
    ring.set_controller_keys([])
    assert ring.grant("sk-one") is None
    assert ring.grant("sk-from-file-1") is not None and ring.required
    assert ring.counts == (0, 1)


def test_keys_used_go_to_the_status_a_bounded_number_at_a_time() -> None:
    ring = Keyring()
    ring.set_controller_keys([entry(f"k{i}", f"sk-key-{i}", ["*"]) for i in range(7)])
    for i in range(7):
        assert ring.grant(f"sk-key-{i}") is not None
    first = ring.take_used(most=5)
    second = ring.take_used(most=5)
    assert len(first) == 5 and len(second) == 2
    assert first.keys() | second.keys() == {f"k{i}" for i in range(7)}
    assert ring.take_used() == {}
