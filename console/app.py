"""The console app: owns the admin client and the poll loop; screens render.

Polling runs on a one-shot timer that is re-armed only when the previous
fetch has finished, so fetches never overlap; a failed fetch backs off and
keeps the last data on screen, marked stale. Nothing a request can raise
reaches Textual's worker machinery (which would end the app).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, ClassVar, cast

from pydantic import ValidationError
from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import var
from textual.screen import Screen
from textual.timer import Timer

from llmgw.api import healthz
from llmgw.client import AdminClient, ControllerError, ControllerUnreachable, describe
from llmgw.console.commands import ADMIN_ACTIONS, AdminRequested
from llmgw.console.feeds import (
    USAGE_WINDOWS,
    EventFeed,
    EventsWanted,
    ModelsView,
    ModelsWanted,
    UsageView,
    UsageWanted,
    UsageWindowChosen,
    fetch_events,
    fetch_models,
    fetch_usage,
)
from llmgw.console.keys import KeyPipeline
from llmgw.console.screens.actions import AdminActions
from llmgw.console.screens.detail import AdminNodeDetailScreen, NodeDetailScreen
from llmgw.console.screens.events import EventsScreen
from llmgw.console.screens.main import AdminMainScreen, MainScreen
from llmgw.console.screens.modals import DrainModal
from llmgw.console.screens.models import ModelsScreen
from llmgw.console.screens.usage import UsageScreen
from llmgw.console.state import Connection, FleetView, Link, NodeView, backoff, error_words
from llmgw.console.textual_private import keep_pastes_in_order
from llmgw.console.widgets.nodes import NodesTable
from llmgw.present import force_at_words
from llmgw.wire import DrainPlan, FleetSummary, NodeRow, NodesDelta

_HEAP_SETTLED = False  # gc.freeze() once per process, see ConsoleApp.settle_heap


class ConsoleApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "llmgw console"
    BINDINGS: ClassVar[list[Binding]] = [  # type: ignore[assignment]
        Binding("q", "quit", "Quit"),
        Binding("r", "retry", "Retry", show=False),
    ]

    # Short terminals give the nodes table the room (see app.tcss).
    VERTICAL_BREAKPOINTS = [(0, "-short"), (34, "-tall")]

    fleet: var[FleetView | None] = var(None)
    connection: var[Connection] = var(Connection())
    node_view: var[NodeView | None] = var(None)
    # Fetched while their screen is open (console/feeds.py). The feed is patched
    # in place by each fetch and assigned again: always_update wakes the screen.
    models_view: var[ModelsView | None] = var(None)
    usage_view: var[UsageView | None] = var(None)
    event_feed: var[EventFeed | None] = var(None, always_update=True)
    # No admin keys: --readonly, or a token that may only read (GET /v1/whoami).
    # Admin keys stay off until the controller has said the token may use them.
    readonly: var[bool] = var(True)

    def __init__(
        self,
        client: AdminClient,
        *,
        readonly: bool = False,
        refresh: float = 1.0,
        clock: Callable[[], float] = time.time,
        about: str = "",
        gateway: str = "",
    ) -> None:
        super().__init__()
        keep_pastes_in_order()
        self.client = client
        # What whoever started the console wants the operator to know (the
        # demo's gateway and curl line): the help shows it, the first frame points there.
        self.about = about
        self.gateway = gateway
        self.readonly_flag = readonly  # --readonly: the admin screens are never built
        self.role: str | None = None  # the token's role, once the controller said it
        self.role_known = readonly  # --readonly needs no answer
        self.refresh_s = max(0.2, refresh)
        self.clock = clock
        self.watched_node: str | None = None
        self.models_open = False
        self.usage_window: str | None = None  # the usage view's window while it is open
        self._usage_window_last = USAGE_WINDOWS[1]  # opened again, it shows the last one chosen
        self.polls = 0  # completed fetch cycles (tests wait on it)
        self._timer: Timer | None = None
        self._polling = False
        self._poll_again = False
        self._nodes_cursor = ""  # "": the next fetch asks for every node
        # Several controllers: the one that leads (the client follows it) and its epoch.
        self._leader: tuple[str, int | None] | None = None
        self.keys = KeyPipeline(self)

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @property
    def controller_label(self) -> str:
        """The header's controller: with several, which one leads, and its epoch."""
        if self._leader is None:
            return self.base_url
        url, epoch = self._leader
        return f"{url} (leader, epoch {epoch})" if epoch is not None else f"{url} (leader)"

    async def _note_leader(self) -> None:
        """After an answer: if it came from another controller than the last, a
        failover happened; say so once, with the new leader's epoch."""
        url = self.client.base_url
        if len(self.client.endpoints) < 2 or (self._leader and self._leader[0] == url):
            return
        epoch: int | None = None
        try:
            health = await self.client.run(healthz())
            epoch = int(health["epoch"]) if isinstance(health, dict) else None
        except (ControllerError, ControllerUnreachable, KeyError, TypeError, ValueError):
            pass
        if self._leader is not None:
            where = f"{url}, epoch {epoch}" if epoch is not None else url
            self.notify(f"leader changed to {where}", timeout=8)
        self._leader = (url, epoch)

    def get_default_screen(self) -> Screen[Any]:
        return MainScreen() if self.readonly_flag else AdminMainScreen()

    def on_mount(self) -> None:
        if self.about:
            first = self.about.splitlines()[0]
            self.notify(f"{first}\nThe help (?) says how to reach it.", timeout=20)
        self.run_worker(self.keys.run(), name="keys", exit_on_error=True)
        self._start_poll()
        if not self.readonly_flag:
            self.run_worker(self._learn_role(), name="whoami", exit_on_error=False)

    async def _learn_role(self) -> None:
        """Ask the controller what this token may do; offer admin keys only if
        it may use them (open mode, no tokens: role None, everything allowed)."""
        for attempt in itertools.count(1):
            try:
                me = await self.client.whoami()
            except ControllerError as exc:
                if exc.status == 404:  # an older controller: let it answer each request
                    self.readonly = False
                    self.role_known = True
                    return
            except (ControllerUnreachable, ValidationError):
                pass
            else:
                self.role = me.role
                self.readonly = me.role not in (None, "admin")
                self.role_known = True
                if self.readonly:
                    self.notify(
                        f"Read-only: this token ({me.name}) may look, not cordon or drain.",
                        timeout=6,
                    )
                return
            # Not answered (down, 401): ask again with the polls' backoff.
            await asyncio.sleep(backoff(attempt, self.refresh_s))

    async def on_event(self, event: events.Event) -> None:
        """Keys and pastes go to the key pipeline, which acts on each in the
        order typed once what the one before started has settled (keys.py)."""
        if isinstance(event, events.Key | events.Paste) and not event.is_forwarded:
            if isinstance(event, events.Key) and not self.app_focus:
                self.app_focus = True  # as Textual does on a key
            self.keys.put(event)
            return
        await super().on_event(event)

    def watch_readonly(self) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, AdminActions):
                screen.update_footer()

    async def on_unmount(self) -> None:
        await self.client.aclose()

    # -- polling ----------------------------------------------------------------

    def action_retry(self) -> None:
        """`r`: try the controller now instead of waiting out the backoff. The
        backoff starts over: a failed retry is retried after one refresh."""
        if not self.connection.healthy:
            self.connection = replace(self.connection, failures=0)
        self.poll_now()

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
            # What happened and what comes next; the class is for the log above.
            delay = self._failed(
                Link.ERROR, f"reading the fleet failed: {describe(exc)} (retried; r retries now)"
            )
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
            return self._failed(Link.ERROR, error_words(exc))
        now = self.clock()
        self.fleet = FleetView.merge(self.fleet, summary, delta, now)
        # Only now: a failed fetch leaves the cursor where the data on screen is.
        self._nodes_cursor = delta.cursor
        self.connection = Connection(Link.LIVE, last_ok=now)
        await self._note_leader()
        if self.watched_node is not None:
            await self._fetch_node(self.watched_node)
        if self.models_open:
            view = await fetch_models(self.client, self.models_view, summary.adapters)
            if self.models_open:  # the screen may have closed meanwhile
                self.models_view = view
        if (window := self.usage_window) is not None:
            usage = await fetch_usage(self.client, window, self.usage_view)
            if self.usage_window == window:  # closed or switched meanwhile: not these rows
                self.usage_view = usage
        if (feed := self.event_feed) is not None:
            await fetch_events(self.client, feed)
            if self.event_feed is feed:
                self.event_feed = feed
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
            self._set_node_view(NodeView(name, old.detail if old else None, error_words(exc)))
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

    def on_main_screen_detail_requested(self, message: MainScreen.DetailRequested) -> None:
        self.watched_node = message.name
        self.node_view = None
        name = message.name
        screen = NodeDetailScreen(name) if self.readonly_flag else AdminNodeDetailScreen(name)
        self.push_screen(screen, lambda _: self._close_detail())
        self.poll_now()

    def _close_detail(self) -> None:
        self.watched_node = None
        self.node_view = None

    def on_models_wanted(self, message: ModelsWanted) -> None:
        self.models_open = True
        self.push_screen(ModelsScreen(), lambda _: self._close_models())
        self.poll_now()

    def _close_models(self) -> None:
        self.models_open = False
        self.models_view = None

    def on_usage_wanted(self, message: UsageWanted) -> None:
        if isinstance(self.screen, UsageScreen):
            return
        self.usage_window = self._usage_window_last
        self.push_screen(UsageScreen(self.usage_window), lambda _: self._close_usage())
        self.poll_now()

    def on_usage_window_chosen(self, message: UsageWindowChosen) -> None:
        if self.usage_window is not None and message.window != self.usage_window:
            self.usage_window = self._usage_window_last = message.window
            self.poll_now()

    def _close_usage(self) -> None:
        self.usage_window = None
        self.usage_view = None

    def on_events_wanted(self, message: EventsWanted) -> None:
        if isinstance(self.screen, EventsScreen):
            return  # one events view at a time: its feed is the one fetched
        self.event_feed = EventFeed(message.obj)
        self.push_screen(EventsScreen(message.obj), lambda _: self._close_events())
        self.poll_now()

    def _close_events(self) -> None:
        self.event_feed = None

    def on_nodes_table_filled(self, message: NodesTable.Filled) -> None:
        self.settle_heap()

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
            yield SystemCommand(
                "Models", "Every model: ready, rollouts, spread", screen.action_models
            )
            yield SystemCommand(
                "Events", "What the controller decided by itself", screen.action_events
            )
            yield SystemCommand(
                "Usage", "Requests and tokens per tenant and model", screen.action_usage
            )
        if isinstance(screen, UsageScreen):
            yield SystemCommand(
                "Filter usage", "Show only rows matching words", screen.action_filter
            )
            yield SystemCommand(
                "Usage window", "Switch between the last 1h, 24h and 7d", screen.action_window
            )
        if isinstance(screen, NodeDetailScreen):
            yield SystemCommand(
                "Events", "What the controller did to this node", screen.action_events
            )
        if isinstance(screen, MainScreen | NodeDetailScreen):
            yield SystemCommand("Help", "Keys and what they do", screen.action_help)
        # Only admin screens have these actions; read-only screens never do.
        if isinstance(screen, AdminActions) and not self.readonly:
            for action in ADMIN_ACTIONS:
                names = screen.applicable(action)
                if not names:
                    continue
                label = names[0] if len(names) == 1 else f"{len(names)} nodes"
                yield SystemCommand(
                    f"{action.title} {label}",
                    ", ".join(names[:8]) + (" …" if len(names) > 8 else ""),
                    getattr(screen, f"action_{action.verb}"),
                )

    # -- admin requests -------------------------------------------------------------

    def on_admin_requested(self, message: AdminRequested) -> None:
        if self.readonly:  # belt and braces: read-only screens have no such keys
            return
        self.run_worker(self._send_admin(message), group="admin", exit_on_error=False)

    async def _send_admin(self, request: AdminRequested) -> None:
        action, names, form = request.action, request.nodes, request.form
        done: list[str] = []
        failed: list[str] = []
        refused: list[str] = []  # the controller refused the request as sent (400)
        deadlines: list[float] = []
        for name in names:
            try:
                answer = await action.call(self.client, name, form)
                done.append(name)
            except (ControllerError, ControllerUnreachable, ValidationError) as exc:
                failed.append(f"{name}: {error_words(exc)}")
                if isinstance(exc, ControllerError) and exc.status == 400:
                    refused.append(exc.message)
                continue
            if isinstance(answer, NodeRow) and answer.admin.force_at is not None:
                deadlines.append(answer.admin.force_at)
        if done:
            # The deadline as the controller recorded it, not as the dialog meant it.
            when = f", {force_at_words(max(deadlines), now=self.clock())}" if deadlines else ""
            self.notify(
                f"{action.past.capitalize()}: {', '.join(done[:6])}"
                + (f" and {len(done) - 6} more" if len(done) > 6 else "")
                + when
            )
        if failed:
            self.notify(
                f"{action.verb} failed on {len(failed)} node(s):\n"
                + "\n".join(failed[:5])
                + "\nNothing else was changed on those nodes."
                + (f"\nYour reason, to use again: {form.reason}" if form.reason else ""),
                severity="error",
                timeout=10,
            )
        if refused and not done and request.again is not None:
            # Nothing done and the request itself refused: its dialog again,
            # as it was filled in, with the controller's words.
            request.again(
                f"Refused by the controller: {refused[0]}. Nothing was changed:"
                " edit and confirm again, or Cancel."
            )
        self.poll_now()

    def on_drain_modal_plan_wanted(self, message: DrainModal.PlanWanted) -> None:
        self.run_worker(self._drain_plan(message.modal), group="drain-plan", exit_on_error=False)

    async def _drain_plan(self, modal: DrainModal) -> None:
        """The drain pre-check, handed to the modal (which does no I/O)."""
        try:
            plan = DrainPlan.model_validate(await self.client.drain_plan(modal.names))
        except (ControllerError, ControllerUnreachable, ValidationError) as exc:
            message = error_words(exc)
        else:
            if modal.is_attached:
                modal.show_plan(plan)
            return
        if modal.is_attached:
            modal.plan_failed(message)
