"""console/keys.py on its own: the pipeline waits for what a key started, but
never forever (the burst tests in test_console_keys and test_console_tmux
show the ordering with the real app)."""

from __future__ import annotations

import logging
import time

import pytest
from textual import events
from textual.message_pump import MessagePump

from console import keys


async def test_a_wedged_pump_delays_the_next_key_but_does_not_swallow_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(keys, "SETTLE_TIMEOUT_S", 0.05)
    wedged = MessagePump()  # never started: nothing sent to it is ever handled
    wedged.post_message(events.Idle())
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="console.keys"):
        await keys._round_trip(wedged)
    assert time.monotonic() - t0 < 1.0
    assert "going on" in caplog.text
