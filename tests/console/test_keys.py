"""console/keys.py on its own: the pipeline waits for what a key started, but
never forever (the burst tests in test_console_keys and test_console_tmux
show the ordering with the real app)."""

from __future__ import annotations

import time

import pytest
from textual import events
from textual.message_pump import MessagePump

from llmgw.console import keys
from llmgw.console.textual_private import OrderedPasteParser


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


PASTED = "x\x1b[200~alpha\x1b[31mbeta\tgamma\x1b[201~y"


def _parse(chunks: list[str]) -> list[tuple[str, str]]:
    parser = OrderedPasteParser()
    got = [event for chunk in chunks if chunk for event in parser.feed(chunk)]
    got += parser.feed("")
    return [
        (type(e).__name__, e.text if isinstance(e, events.Paste) else e.key)  # type: ignore[attr-defined]
        for e in got
    ]


def test_a_paste_holding_an_escape_stays_one_paste_in_order() -> None:
    """Textual's parser ended the paste at the ESC and sent the rest as keys
    first (`^[31mbeta…` before `alpha`: issue 23 item 8). However the reads
    split it, the paste arrives whole and in order, the ESC shown as text."""
    want = [("Key", "x"), ("Paste", "alpha\\x1b[31mbeta\tgamma"), ("Key", "y")]
    for i in range(len(PASTED) + 1):
        for j in range(i, len(PASTED) + 1):
            assert _parse([PASTED[:i], PASTED[i:j], PASTED[j:]]) == want, (i, j)


def test_escape_and_keys_outside_a_paste_are_untouched() -> None:
    assert _parse(["\x1b"]) == [("Key", "escape")]
    assert _parse(["\x1b[A", "q"]) == [("Key", "up"), ("Key", "q")]


def test_pasted_lines_and_tabs_become_spaces() -> None:
    assert keys.pasted_line("a\tb\nc\r\nd\x1be") == "a b c d\\x1be"
