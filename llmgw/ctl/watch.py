"""The commands that keep running: `-w` redraws what fits on the screen (or,
piped, appends what changed) until Ctrl-C; `drain --wait` follows a drain until it is done;
`rollout status --wait` a rollout until it is done or stalls."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from llmgw import api, render
from llmgw.ctl.output import Output
from llmgw.errors import EXIT_FAILED, EXIT_OK, NotFound, UnknownModel

if TYPE_CHECKING:
    from llmgw.sync_client import SyncAdminClient
    from llmgw.wire import NodeRow

CLEAR = "\x1b[H\x1b[2J"
# The alternate screen, cursor hidden: as watch(1) and k9s, a redraw there leaves no
# copy in the terminal's scrollback (many push a cleared screen into it), and the
# shell's screen comes back as it was when the watch ends.
ENTER_SCREEN, LEAVE_SCREEN = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def fit(text: str, width: int, height: int) -> str:
    """What fits on one screen, as watch(1) shows it: a redraw taller than the
    terminal would scroll, and leave a copy in the scrollback at every refresh.
    The last line says how many did not fit; wrapped lines count as the rows they take."""
    lines = text.splitlines(keepends=True)
    room = max(height - 1, 1)  # the cursor ends on the last row: nothing scrolls
    rows = [max(1, -(-len(_ANSI.sub("", line.rstrip("\n"))) // width)) for line in lines]
    if sum(rows) <= room:
        return text
    kept, used = 0, 0
    while kept < len(lines) and used + rows[kept] <= room - 1:
        used += rows[kept]
        kept += 1
    return "".join(lines[:kept]) + f"… {len(lines) - kept} more lines (a taller terminal, or pipe)"


def redraw(out: Output, text: str) -> None:
    """One refresh on a terminal: the screen cleared, then what fits on it."""
    width, height = out.term.width() or 80, out.term.height() or 24
    out.term.write(CLEAR + fit(text, width, height))


@contextlib.contextmanager
def redrawn(out: Output) -> Iterator[None]:
    """On a terminal, the redraws inside happen on the alternate screen, left however
    the watch ends (Ctrl-C, or an error whose one line must show on the shell's screen)."""
    if not out.term.tty:
        yield
        return
    out.term.write(ENTER_SCREEN)
    try:
        yield
    finally:
        out.term.write(LEAVE_SCREEN)


def watch(out: Output, interval_s: float, draw: Callable[[], str]) -> int:
    """Redraw in place on a terminal; when piped, print again only what changed."""
    last = ""
    try:
        with redrawn(out):
            while True:
                text = draw()
                if out.term.tty:
                    redraw(out, text)
                elif text != last:
                    out.term.write(("\n" if last else "") + text)
                last = text
                time.sleep(interval_s)
    except KeyboardInterrupt:
        return EXIT_OK


def watch_nodes(
    client: SyncAdminClient,
    out: Output,
    table: Callable[[list[Any]], render.Table],
    interval_s: float,
) -> int:
    """`nodes -w` over `GET /v1/nodes?since=`: only changed rows cross the wire.

    On a terminal the table is redrawn (ages tick); when piped, the first
    table is printed whole and then each changed row on its own line, as
    `kubectl get -w` does.
    """
    rows: dict[str, Any] = {}  # name -> api.View of a NodeRow
    cursor = ""
    first = True
    try:
        with redrawn(out):
            while True:
                delta = client(api.nodes_since(cursor))
                cursor = delta.cursor
                if delta.full:
                    rows = {}
                for row in delta.nodes:
                    rows[row.name] = row
                for name in delta.removed:
                    rows.pop(name, None)
                for name, age in delta.report_ages.items():
                    if name in rows:
                        rows[name] = api.View({**rows[name], "report_age_s": age})
                ordered = [rows[n] for n in sorted(rows)]
                if out.term.tty:
                    redraw(out, out.table(table(ordered)))
                elif first or delta.full:
                    out.term.write(out.table(table(ordered)))
                elif delta.nodes:
                    changed = [rows[r.name] for r in delta.nodes]
                    out.term.write(out.table(table(changed), headers=False))
                first = False
                time.sleep(interval_s)
    except KeyboardInterrupt:
        return EXIT_OK


def wait_drained(
    client: SyncAdminClient, out: Output, nodes: list[str], limit_s: float, interval_s: float
) -> int:
    """One progress line (rewritten on a terminal), then one summary."""
    from llmgw.drain_progress import DrainProgress

    term = out.term
    progress = DrainProgress(nodes)
    started = time.monotonic()
    cursor = ""
    rows: dict[str, NodeRow] = {}
    last = ""
    while True:
        delta = client(api.nodes_since(cursor))
        cursor = delta.cursor
        rows.update({r.name: r for r in delta.nodes if r.name in progress.wanted})
        line = progress.line(rows)
        if term.tty:  # rewritten in place: a line that wrapped could not be
            width = term.width() or 80
            term.write("\r\x1b[K" + (line if len(line) < width else line[: width - 2] + "…"))
        elif line != last:
            term.write(line + "\n")
        last = line
        elapsed = time.monotonic() - started
        if progress.done(rows):
            term.write(("\n" if term.tty else "") + progress.summary(rows, elapsed))
            return EXIT_OK
        if elapsed >= limit_s:
            term.write(("\n" if term.tty else "") + progress.timed_out(rows, limit_s))
            return EXIT_FAILED
        time.sleep(min(interval_s, max(limit_s - elapsed, 0.05)))


def model_view(client: SyncAdminClient, name: str) -> Any:
    """One model's view (an api.View of a ModelView); NotFound in the controller's
    own words when no model has that name."""
    for view in client(api.models()):
        if view.spec.name == name:
            return view
    raise NotFound(404, UnknownModel(name).message, client.base_url)


def rollout_done(view: Any) -> bool:
    rollout = getattr(view, "rollout", None)
    return rollout is None or rollout.state == "complete"


def wait_rollout(
    client: SyncAdminClient, out: Output, name: str, limit_s: float, interval_s: float
) -> int:
    """A line each time the rollout moves, as `kubectl rollout status`; exit 0 once
    every replica runs the current revision and is ready, 1 when it stalls or the
    time is up."""
    term = out.term
    started = time.monotonic()
    last = ""
    while True:
        view = model_view(client, name)
        line = render.rollout_line(view)
        if line != last:
            term.write(line + "\n")
        last = line
        if rollout_done(view):
            return EXIT_OK
        if view.rollout.state == "stalled":
            return EXIT_FAILED
        elapsed = time.monotonic() - started
        if elapsed >= limit_s:
            term.write(f"timed out after {render.duration(limit_s)}: {line}\n")
            return EXIT_FAILED
        time.sleep(min(interval_s, max(limit_s - elapsed, 0.05)))


def watch_events(
    client: SyncAdminClient, out: Output, obj: str | None, interval_s: float, *, wide: bool
) -> int:
    """`events -w`, as `kubectl get events -w`: the events kept, then each new one
    as it comes (only new ones cross the wire: `since=` the last id seen)."""
    cursor, first = 0, True
    try:
        while True:
            if out.args.output in ("json", "yaml"):
                found = client.json(api.events(cursor, obj))
                for event in found["events"]:
                    out.data(event)
                cursor = found["cursor"]
            else:
                got = client(api.events(cursor, obj))
                if got.events or first:
                    table = render.events_table(got.events, wide=wide)
                    out.term.write(out.table(table, headers=first))
                cursor = got.cursor
            first = False
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return EXIT_OK
