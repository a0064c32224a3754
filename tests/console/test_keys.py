"""console/keys.py on its own: the pipeline waits for what a key started, but
never forever (the burst tests in test_console_keys and test_console_tmux
show the ordering with the real app)."""

from __future__ import annotations

import time

import pytest
from textual import events
from textual.message_pump import MessagePump

from console import keys


async def test_a_wedged_pump_delays_the_next_key_but_does_not_swallow_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keys, "SETTLE_TIMEOUT_S", 0.05)
    wedged = MessagePump()  # never started: nothing sent to it is ever handled
    wedged.post_message(events.Idle())
    t0 = time.monotonic()
    assert await keys._round_trip(wedged) is False  # gave up waiting …
    assert time.monotonic() - t0 < 1.0  # … after the timeout, not forever


async def test_a_closed_pump_is_not_waited_for() -> None:
    closed = MessagePump()
    closed._closed = True
    assert await keys._round_trip(closed) is True
