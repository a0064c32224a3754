"""The console app: owns the admin client and the poll loop; screens render.

Polling runs on a one-shot timer that is re-armed only when the previous
fetch has finished, so fetches never overlap; a failed fetch backs off and
keeps the last data on screen, marked stale. Nothing a request can raise
reaches Textual's worker machinery (which would end the app).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, cast

from pydantic import ValidationError
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import var
from textual.screen import Screen
from textual.timer import Timer

from console.screens.actions import ADMIN_ACTIONS, AdminActions
from console.screens.detail import AdminNodeDetailScreen, NodeDetailScreen
from console.screens.main import AdminMainScreen, MainScreen
from console.screens.modals import HelpScreen
from console.state import Connection, Fleet, Link, NodeView, backoff
from llmgw.client import AdminClient, ControllerError, ControllerUnreachable, describe
from llmgw.wire import FleetSummary, NodesDelta

# The help lists view keys, then (unless read-only) admin keys, then app keys.
VIEW_KEYS = [
    ("↑↓ j k g G", "move (pgup / pgdn: a page)"),
    ("enter", "node detail (escape goes back)"),
    ("/", "filter nodes (escape clears)"),
    ("s / S", "cycle sort column / reverse"),
    ("space", "mark nodes for one action (escape clears marks)"),
]
APP_KEYS = [
    ("?", "this help"),
    ("q", "quit"),
]
ADMIN_KEYS = [
    ("c", "cordon: no new replicas here (asks for a reason)"),
    ("u", "uncordon (only shown for cordoned or draining nodes)"),
    ("d", "drain: move replicas off (reason, force, pre-check)"),
]

_HEAP_SETTLED = False  # gc.freeze() once per process, see ConsoleApp.settle_heap

PAST = {"cordon": "cordoned", "uncordon": "uncordoned", "drain": "draining"}


class ConsoleApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "llmgw console"
    BINDINGS: ClassVar[list[Binding]] = [  # type: ignore[assignment]
        Binding("q", "quit", "Quit"),
    ]

    # Short terminals give the nodes table the room (see app.tcss).
    VERTICAL_BREAKPOINTS = [(0, "-short"), (34, "-tall")]

    fleet: var[Fleet | None] = var(None)
    connection: var[Connection] = var(Connection())
    node_view: var[NodeView | None] = var(None)

    def __init__(
        self,
        client: AdminClient,
        *,
        readonly: bool = False,
        refresh: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.client = client
        self.readonly = readonly
        self.refresh_s = max(0.2, refresh)
        self.clock = clock
        self.watched_node: str | None = None
        self.polls = 0  # completed fetch cycles (tests wait on it)
        self._timer: Timer | None = None
        self._polling = False
        self._poll_again = False
        self._nodes_cursor = ""  # "": the next fetch asks for every node

    def get_default_screen(self) -> Screen[Any]:
        return MainScreen() if self.readonly else AdminMainScreen()

    def on_mount(self) -> None:
        self._start_poll()

    async def on_unmount(self) -> None:
        await self.client.aclose()

    # -- polling ----------------------------------------------------------------

    def poll_now(self) -> None:
        """Fetch as soon as possible, without ever running two fetches at once."""
        if self._polling:
            self._poll_again = True
            return
        if self._timer is not None:
            self._timer.stop()
        self._start_poll()

    def _start_poll(self) -> None:
        self._timer = None
        if self._polling:  # defensive: one fetch at a time, always
            self._poll_again = True
            return
        self._polling = True
        self.run_worker(self._poll_cycle(), name="poll", group="poll", exit_on_error=False)

    async def _poll_cycle(self) -> None:
        delay = self.refresh_s
        try:
            delay = await self._fetch()
        except asyncio.CancelledError:
            self._polling = False
            raise
        except Exception as exc:  # a bug here must not end the console
            self.log.error("poll failed", exc)
            delay = self._failed(Link.ERROR, f"unexpected {type(exc).__name__}: {describe(exc)}")
        self._polling = False
        self.polls += 1
        if self._poll_again:
            self._poll_again, delay = False, 0.0
        if self.is_running:
            # Never a zero delay: Textual's timer divides by its interval.
            self._timer = self.set_timer(max(delay, 0.01), self._start_poll, name="poll")

    async def _fetch(self) -> float:
        try:
            # Both at once; return_exceptions so a failure of one never leaves
            # the other's exception unretrieved.
            results = await asyncio.gather(
                self.client.summary(),
                self.client.nodes_since(self._nodes_cursor),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            summary, delta = cast(tuple[FleetSummary, NodesDelta], results)
        except ControllerUnreachable as exc:
            return self._failed(Link.LOST, describe(exc.cause) + f" ({exc.url})")
        except ControllerError as exc:
            return self._failed(Link.ERROR, f"{exc.status} {exc.message}", exc.status)
        except ValidationError as exc:
            return self._failed(Link.ERROR, f"answer not understood: {describe(exc)}")
        now = self.clock()
        self.fleet = Fleet.merge(self.fleet, summary, delta, now)
        # Only now: a failed fetch leaves the cursor where the data on screen is.
        self._nodes_cursor = delta.cursor
        self.connection = Connection(Link.LIVE, last_ok=now)
        if self.watched_node is not None:
            await self._fetch_node(self.watched_node)
        return self.refresh_s

    async def _fetch_node(self, name: str) -> None:
        try:
            detail = await self.client.node(name)
        except ControllerError as exc:
            message = f"{exc.status} {exc.message}"
            if exc.status == 404:
                message = f"{name} is no longer known to the controller (404)"
            self._set_node_view(NodeView(name, None, message))
            return
        except (ControllerUnreachable, ValidationError) as exc:
            old = self.node_view
            self._set_node_view(NodeView(name, old.detail if old else None, describe(exc)))
            return
        self._set_node_view(NodeView(name, detail))

    def _set_node_view(self, view: NodeView) -> None:
        # The screen may have closed while we were fetching.
        if self.watched_node == view.name:
            self.node_view = view

    def _failed(self, link: Link, message: str, status: int | None = None) -> float:
        old = self.connection
        failures = old.failures + 1
        delay = backoff(failures, self.refresh_s)
        self.connection = Connection(
            link,
            message,
            failures,
            retry_at=self.clock() + delay,
            last_ok=old.last_ok,
            status=status,
        )
        return delay

    def settle_heap(self) -> None:
        """Once the first big load is in, move what exists now (Textual's
        widgets and styles, the table's rows) out of the garbage collector's
        way. Otherwise every full collection re-scans a quarter of a million
        long-lived objects, a 100-300 ms stall in the middle of a refresh
        (see bench/bench_console.py). Objects frozen here are still freed by
        reference counting when they go; only a cycle among them would stay.
        """
        global _HEAP_SETTLED
        if not _HEAP_SETTLED:
            _HEAP_SETTLED = True
            gc.freeze()

    # -- screens ------------------------------------------------------------------

    def open_detail(self, name: str) -> None:
        self.watched_node = name
        self.node_view = None
        screen = NodeDetailScreen(name) if self.readonly else AdminNodeDetailScreen(name)
        self.push_screen(screen, lambda _: self._close_detail())
        self.poll_now()

    def _close_detail(self) -> None:
        self.watched_node = None
        self.node_view = None

    def show_help(self, screen: Screen[Any]) -> None:
        admin = [] if self.readonly else ADMIN_KEYS
        keys = [*VIEW_KEYS, *admin, *APP_KEYS]
        self.push_screen(HelpScreen(keys, self.readonly))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(screen, MainScreen):
            yield SystemCommand(
                "Filter nodes", "Show only nodes matching words", screen.action_filter
            )
            yield SystemCommand(
                "Sort nodes", "Cycle the nodes table's sort column", screen.action_sort
            )
            yield SystemCommand(
                "Node detail", "Open the node under the cursor", screen.action_open_detail
            )
        if isinstance(screen, MainScreen | NodeDetailScreen):
            yield SystemCommand("Help", "Keys and what they do", screen.action_help)
        # Only admin screens have these actions; read-only screens never do.
        if isinstance(screen, AdminActions):
            for action in ADMIN_ACTIONS:
                names = screen.applicable(action)
                if not names:
                    continue
                label = names[0] if len(names) == 1 else f"{len(names)} nodes"
                yield SystemCommand(
                    f"{action.capitalize()} {label}",
                    ", ".join(names[:8]) + (" …" if len(names) > 8 else ""),
                    getattr(screen, f"action_{action}"),
                )

    # -- admin requests -------------------------------------------------------------

    def send_admin(
        self,
        action: str,
        names: list[str],
        *,
        reason: str | None = None,
        force: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        if self.readonly:  # belt and braces: read-only screens have no such keys
            return
        self.run_worker(
            self._send_admin(action, names, reason, force, timeout_s),
            group="admin",
            exit_on_error=False,
        )

    async def _send_admin(
        self,
        action: str,
        names: list[str],
        reason: str | None,
        force: bool,
        timeout_s: float | None,
    ) -> None:
        done: list[str] = []
        failed: list[str] = []
        for name in names:
            try:
                if action == "cordon":
                    await self.client.cordon(name, reason or "")
                elif action == "uncordon":
                    await self.client.uncordon(name)
                elif action == "drain":
                    await self.client.drain(name, reason or "", force=force)
                done.append(name)
            except (ControllerError, ControllerUnreachable, ValidationError) as exc:
                failed.append(f"{name}: {describe(exc)}")
        if done:
            self.notify(
                f"{PAST[action].capitalize()}: {', '.join(done[:6])}"
                + (f" and {len(done) - 6} more" if len(done) > 6 else "")
            )
        if failed:
            self.notify(
                f"{action} failed on {len(failed)} node(s):\n"
                + "\n".join(failed[:5])
                + "\nNothing else was changed on those nodes.",
                severity="error",
                timeout=10,
            )
        if action == "drain" and done and timeout_s:
            self.set_timer(timeout_s, lambda: self._drain_deadline(done, reason or ""))
        self.poll_now()

    def _drain_deadline(self, names: list[str], reason: str) -> None:
        """A drain with a timeout: nodes still draining now are drained by force."""
        fleet = self.fleet
        if fleet is None:
            return
        late = [n for n in names if (row := fleet.nodes.get(n)) and row.state == "draining"]
        if late:
            self.notify(
                f"Drain timeout reached, forcing: {', '.join(late[:6])}", severity="warning"
            )
            self.send_admin("drain", late, reason=reason, force=True)
