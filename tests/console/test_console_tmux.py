"""Keystrokes through a real terminal: tmux runs `llmgw console` against a real
controller process, keys arrive as a terminal delivers them (a burst in one
write, a paste), and the reason the controller recorded must be exactly what
was typed (issue 11, defect 1: a reason typed 0.15 s after `c` came out `b`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.ctl.ctl_support import ADMIN, Controller, controller_process

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("tmux") is None, reason="tmux is not installed: apt-get install tmux"
    ),
]

NODES = [f"gpu-a{i:02d}" for i in range(1, 14)]
# Every letter that is also a console key (c u d s r q j k g G / ? space),
# punctuation, digits: any of them taken as a key instead of text shows here.
REASON = "xid 79: GPU 3 fell off the bus (ticket OPS-1234) q/d/u/c/s/r/j/k/g/G ?!"


class Tmux:
    """One private tmux server (its own socket) holding one pane."""

    def __init__(self, tmp: Path) -> None:
        self.socket = str(tmp / "tmux.sock")

    def __call__(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-S", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "t")

    def wait_for(self, what: Callable[[str], bool], label: str, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.screen()
            if what(text):
                return text
            assert time.monotonic() < deadline, f"{label}; the screen:\n{text}"
            time.sleep(0.1)

    def pane_dead(self) -> bool:
        return self("display-message", "-p", "-t", "t", "#{pane_dead}").strip() == "1"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("tmux-state")) as c:
        for node in NODES:
            c.report(node, n_gpus=2)
        yield c


@pytest.fixture(scope="module")
def console(fleet: Controller, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tmux]:
    """One console for the module; each test acts on its own node."""
    tmp_path = tmp_path_factory.mktemp("tmux")
    tmux = Tmux(tmp_path)
    env = {
        "LLMGW_CONTROLLER": fleet.url,
        "LLMGW_TOKEN": ADMIN,
        "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
    }
    argv = [sys.executable, "-m", "llmgw", "console", "--refresh", "0.5"]
    command = shlex.join(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv])
    tmux("new-session", "-d", "-s", "t", "-x", "120", "-y", "40", "-c", os.getcwd(), command)
    tmux("set-option", "-t", "t", "remain-on-exit", "on")  # a crash stays readable
    try:
        # Admin keys are offered once the controller has said the token may use them.
        tmux.wait_for(lambda s: "gpu-a13" in s and "Cordon" in s, "the console did not load")
        yield tmux
    finally:
        subprocess.run(["tmux", "-S", tmux.socket, "kill-server"], capture_output=True, timeout=10)


def recorded(
    fleet: Controller, tmux: Tmux, node: str, timeout_s: float = 15
) -> tuple[str, str | None]:
    """(flag, reason) the controller holds for `node`, once it is no longer `none`."""
    deadline = time.monotonic() + timeout_s
    while True:
        admin = fleet.admin("GET", f"/v1/nodes/{node}")["row"]["admin"]
        if admin["flag"] != "none":
            return admin["flag"], admin["reason"]
        assert time.monotonic() < deadline, f"{node} was not changed; the screen:\n{tmux.screen()}"
        time.sleep(0.1)


def burst(tmux: Tmux, *steps: tuple[str, ...]) -> None:
    """Several send-keys in ONE tmux command: the keys reach the console's
    terminal together, with no pause between them."""
    args: list[str] = []
    for step in steps:
        if args:
            args.append(";")
        args += ["send-keys", "-t", "t", *step]
    tmux(*args)


def on_node(tmux: Tmux, node: str) -> None:
    """The cursor on `node` (rows sorted by name). Keys are handled in order,
    so the next key already finds it there. (No Escape first: a terminal
    cannot tell Escape then `g` from alt+g.)"""
    tmux("send-keys", "-t", "t", "g", *(["j"] * NODES.index(node)))


def test_a_reason_typed_with_no_pause_after_c_is_recorded_exactly(
    fleet: Controller, console: Tmux
) -> None:
    for i, node in enumerate(NODES[:3]):  # three times out of three
        on_node(console, node)
        burst(console, ("c",), ("-l", f"burst reason number {i + 1}"), ("Enter",))
        assert recorded(fleet, console, node) == ("cordoned", f"burst reason number {i + 1}")


def test_every_console_key_inside_a_reason_is_text(fleet: Controller, console: Tmux) -> None:
    # Moving there in the same burst: `c` acts on the node the j's moved to.
    burst(console, ("g",), *[("j",)] * 3, ("c",), ("-l", REASON), ("Enter",))
    assert recorded(fleet, console, "gpu-a04") == ("cordoned", REASON)
    assert not console.pane_dead()  # the q in the reason did not quit


def test_a_pasted_reason_is_recorded_exactly(fleet: Controller, console: Tmux) -> None:
    on_node(console, "gpu-a05")
    # A real paste: tmux sends it bracketed (-p) when the application asked
    # for bracketed paste, as Textual does; lines are joined with a space.
    console("set-buffer", "-b", "r", "pasted: PSU swap\nrack 7, slot 3")
    burst(console, ("c",))
    console("paste-buffer", "-p", "-b", "r", "-t", "t")
    console("send-keys", "-t", "t", "Enter")
    assert recorded(fleet, console, "gpu-a05") == ("cordoned", "pasted: PSU swap rack 7, slot 3")


def test_a_paste_holding_an_escape_and_a_tab_is_kept_in_order(
    fleet: Controller, console: Tmux
) -> None:
    """Textual ended the paste at the ESC and typed the rest first: recorded
    `^[31mbeta…alpha`; a tab was refused by the controller and the text lost
    (issue 23 item 8). In order now, the tab a space, the ESC shown as text."""
    on_node(console, "gpu-a13")
    console("set-buffer", "-b", "e", "alpha\x1b[31mbeta\tgamma")
    burst(console, ("c",))
    console("paste-buffer", "-p", "-b", "e", "-t", "t")
    console("send-keys", "-t", "t", "Enter")
    assert recorded(fleet, console, "gpu-a13") == ("cordoned", "alpha\\x1b[31mbeta gamma")


def test_tab_tab_enter_confirms_the_typed_reason(fleet: Controller, console: Tmux) -> None:
    on_node(console, "gpu-a06")
    # reason box -> Cancel -> Cordon, then Enter presses Cordon.
    burst(console, ("c",), ("-l", "ux tab test"), ("Tab",), ("Tab",), ("Enter",))
    assert recorded(fleet, console, "gpu-a06") == ("cordoned", "ux tab test")


def test_escape_after_a_burst_changes_nothing(fleet: Controller, console: Tmux) -> None:
    on_node(console, "gpu-a07")
    burst(console, ("c",), ("-l", "never mind"), ("Escape",))
    console.wait_for(lambda s: "Cordon gpu-a07" not in s, "the modal closed")
    time.sleep(1.0)  # had it been sent, the controller would have it by now
    assert fleet.admin("GET", "/v1/nodes/gpu-a07")["row"]["admin"]["flag"] == "none"


def test_drain_takes_a_burst_reason_too(fleet: Controller, console: Tmux) -> None:
    on_node(console, "gpu-a08")
    burst(console, ("d",), ("-l", "drain burst: kernel 6.8"), ("Enter",))
    flag, reason = recorded(fleet, console, "gpu-a08")
    assert flag in ("draining", "cordoned") and reason == "drain burst: kernel 6.8"


def test_a_command_typed_right_after_the_filters_enter_is_a_command(
    fleet: Controller, console: Tmux
) -> None:
    # Enter leaves the filter box; the `c` behind it in the same burst opens
    # cordon on the one node the filter left (it once landed in the filter).
    burst(console, ("/",), ("-l", "gpu-a09"), ("Enter",), ("c",), ("-l", "filtered"), ("Enter",))
    assert recorded(fleet, console, "gpu-a09") == ("cordoned", "filtered")
    console.wait_for(lambda s: "Cordon gpu-a09" not in s, "the modal closed")
    console("send-keys", "-t", "t", "Escape")  # the filter goes: every node again
    console.wait_for(lambda s: "gpu-a01" in s and "filter:" not in s, "the filter cleared")
    time.sleep(0.3)  # the next test starts with `g`: Escape then g would read as alt+g


def test_commands_typed_behind_a_confirmation_are_acted_on(
    fleet: Controller, console: Tmux
) -> None:
    # Confirm one cordon, move, cordon the next: all in one write.
    on_node(console, "gpu-a10")
    burst(
        console,
        ("c",), ("-l", "first of two"), ("Enter",),
        ("j",), ("c",), ("-l", "second of two"), ("Enter",),
    )  # fmt: skip
    assert recorded(fleet, console, "gpu-a10") == ("cordoned", "first of two")
    assert recorded(fleet, console, "gpu-a11") == ("cordoned", "second of two")
    # Uncordon confirms with Cancel focused: Tab to Uncordon, Enter; twice.
    on_node(console, "gpu-a10")
    burst(console, ("u",), ("Tab",), ("Enter",), ("j",), ("u",), ("Tab",), ("Enter",))
    for node in ("gpu-a10", "gpu-a11"):
        deadline = time.monotonic() + 15
        while fleet.admin("GET", f"/v1/nodes/{node}")["row"]["admin"]["flag"] != "none":
            assert time.monotonic() < deadline, f"{node} stayed cordoned:\n{console.screen()}"
            time.sleep(0.1)


def test_keys_typed_behind_enter_go_to_the_detail_it_opens(
    fleet: Controller, console: Tmux
) -> None:
    on_node(console, "gpu-a12")
    burst(console, ("Enter",), ("c",), ("-l", "from the detail"), ("Enter",))
    assert recorded(fleet, console, "gpu-a12") == ("cordoned", "from the detail")
    screen = console.wait_for(lambda s: "Cordon gpu-a12" not in s, "the modal closed")
    assert "gpu-a12" in screen  # still on the detail screen
    console("send-keys", "-t", "t", "Escape")
    console.wait_for(lambda s: "gpu-a01" in s, "back on the main screen")
    time.sleep(0.3)


def test_keys_typed_behind_e_go_to_the_events_view_it_opens(
    fleet: Controller, console: Tmux
) -> None:
    # `e` then a filter in one write: the filter is the events view's, not the nodes'.
    burst(console, ("e",), ("/",), ("-l", "gpu-a07 xid"), ("Enter",))
    screen = console.wait_for(lambda s: "filter: gpu-a07 xid" in s, "the events filter")
    assert "Events" in screen and "NAME" not in screen  # the nodes table is not on screen
    console("send-keys", "-t", "t", "Escape")  # the filter goes
    console.wait_for(lambda s: "filter:" not in s, "the filter cleared")
    time.sleep(0.3)  # Escape Escape in one read is alt+Escape
    console("send-keys", "-t", "t", "Escape")  # back to the nodes
    console.wait_for(lambda s: "gpu-a01" in s and "MESSAGE" not in s, "back on the main screen")
    time.sleep(0.3)


def test_q_in_the_demos_console_takes_every_engine_with_it(tmp_path: Path) -> None:
    """`llmgw demo` in a terminal: quitting its console (q) stops its engines."""
    from tests.test_demo import _alive, _descendants

    tmux = Tmux(tmp_path)
    argv = [sys.executable, "-m", "llmgw", "demo", "--port", "0", "--nodes", "3"]
    env = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "PATH": os.environ.get("PATH", "")}
    command = shlex.join(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv])
    tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "50", "-c", os.getcwd(), command)
    tmux("set-option", "-t", "t", "remain-on-exit", "on")
    try:
        pid = int(tmux("display-message", "-p", "-t", "t", "#{pane_pid}"))
        # Engines up (the demo's models placed and started): its process tree grows.
        deadline = time.monotonic() + 90
        engines: set[int] = set()
        while time.monotonic() < deadline and len(engines) < 4:
            time.sleep(0.5)
            engines = {p for p in _descendants(pid) if "fake_engine" in _cmdline(p)}
        assert engines, f"no engine started; the screen:\n{tmux.screen()}"
        tmux.wait_for(lambda s: "Quit" in s, "the demo's console")
        # Its banner, hidden behind the console, is in the help (issue 23 item 13).
        tmux("send-keys", "-t", "t", "?")
        tmux.wait_for(lambda s: "curl -s http://127.0.0.1:" in s, "the gateway in the help")
        tmux("send-keys", "-t", "t", "?")
        tmux.wait_for(lambda s: "This fleet" not in s, "the help closed")
        tmux("send-keys", "-t", "t", "q")
        tmux.wait_for(lambda s: tmux.pane_dead(), "the demo did not end on q", timeout_s=30)
    finally:
        subprocess.run(["tmux", "-S", tmux.socket, "kill-server"], capture_output=True, timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in engines if _alive(p)], "engine processes outlived the demo"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
