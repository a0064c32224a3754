"""The presentation vocabulary shared by `ctl` and the console.

Pure functions and tables, no rendering library: durations, timestamps, the
words for a node's state, and what each colour means. `llmgw/render.py` turns
them into rich tables, `console/format.py` into Textual cells, so the two
front ends say the same thing the same way for the same node.

Colours are rich style names chosen by *meaning*, k9s-like: green fine,
yellow needs attention, red broken, magenta in motion, cyan starting.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time states are compared as words (they are StrEnums):
    # `ctl` renders through this module and must not pay for pydantic's import.
    from collections.abc import Mapping
    from datetime import datetime

    from llmgw.wire import NodeRow


class Meaning(StrEnum):
    """What a colour says; each has one style (`STYLE`)."""

    FINE = "fine"
    ATTENTION = "attention"
    BROKEN = "broken"
    MOVING = "moving"
    STARTING = "starting"
    MUTED = "muted"


STYLE: dict[Meaning, str] = {
    Meaning.FINE: "green",
    Meaning.ATTENTION: "yellow",
    Meaning.BROKEN: "bold red",
    Meaning.MOVING: "magenta",
    Meaning.STARTING: "cyan",
    Meaning.MUTED: "dim",
}

# Every state word either front end shows (node, replica, shard, GPU health,
# drain-plan verdict) and what it means.
STATE_MEANING: dict[str, Meaning] = {
    "ready": Meaning.FINE,
    "cordoned": Meaning.ATTENTION,
    "draining": Meaning.MOVING,
    "unreachable": Meaning.BROKEN,
    "starting": Meaning.STARTING,
    "stopping": Meaning.MOVING,
    "failed": Meaning.BROKEN,
    "healthy": Meaning.FINE,
    "unhealthy": Meaning.BROKEN,
    "unknown": Meaning.MOVING,
    "ok": Meaning.FINE,
    "below_minimum": Meaning.ATTENTION,
    "unplaceable": Meaning.BROKEN,
    # Cordon / drain history actions.
    "cordon": Meaning.ATTENTION,
    "drain": Meaning.MOVING,
    "drained": Meaning.ATTENTION,
    "uncordon": Meaning.FINE,
    "satisfied": Meaning.FINE,
    "short": Meaning.BROKEN,
}


def style_of(word: str) -> str:
    """The style for a state word; "" for a word with no colour."""
    meaning = STATE_MEANING.get(word)
    return STYLE[meaning] if meaning else ""


def load_meaning(fraction: float) -> Meaning:
    """nvitop's colouring of GPU load: light fine, moderate attention, heavy broken."""
    if fraction < 0.5:
        return Meaning.FINE
    if fraction < 0.85:
        return Meaning.ATTENTION
    return Meaning.BROKEN


# -- durations and times -------------------------------------------------------


def duration(seconds: float | None) -> str:
    """A compact duration: 45s, 7m05s, 2h13m, 3d04h. None is unknown: '-'."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def repeats(event: Any) -> str:
    """`x12 over 2h13m` for an event counted 12 times (an EventView), as kubectl's
    LAST SEEN says it; "" for an event that happened once."""
    if event.count <= 1:
        return ""
    span = event.at - (event.first_at if event.first_at is not None else event.at)
    return f"x{event.count} over {duration(span)}"


def latency(seconds: float | None) -> str:
    """A request latency: 850ms, 2.4s; '-' when none finished."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.1f}s"


def last_wakes(last_s: Mapping[str, float]) -> str:
    """`L1 0.6s, L2 2.4s`: the last wake per sleep level (`ModelStarts.last_s`'s `hot-N`
    keys), as `ctl models -o wide` and the console's model detail say it; "" for none."""
    wakes = sorted((k.removeprefix("hot-"), v) for k, v in last_s.items() if k.startswith("hot-"))
    return ", ".join(f"L{level} {v:.1f}s" for level, v in wakes)


def one_line(text: str) -> str:
    """The first line of a reason: what a table cell shows (the rest is the excerpt)."""
    return text.strip().split("\n", 1)[0]


def p50(traffic: Any) -> str:
    """A traffic figure's median with its metric: `33ms ttft`; `<300ms e2e` when it is only
    the first bucket's bound (the engine's histogram says no more)."""
    text = latency(traffic.p50_latency_s)
    if traffic.p50_latency_s is None:
        return text
    if getattr(traffic, "p50_upper_bound", False):
        text = "<" + text
    metric = getattr(traffic, "p50_metric", None)  # absent from older controllers
    return f"{text} {metric}" if metric else text


def percent(fraction: float | None) -> str:
    """A rate in [0, 1] as a percentage: 74%; '-' when unknown."""
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


def _zoned(at: float, local: bool) -> datetime:
    from datetime import UTC, datetime  # on first use: `ctl nodes` shows no moments

    return datetime.fromtimestamp(at).astimezone() if local else datetime.fromtimestamp(at, UTC)


def _zone(moment: datetime) -> str:
    return moment.tzname() or time.strftime("%Z")


def timestamp(at: float | None, *, local: bool = False) -> str:
    """A moment to the second, always with its zone: 2026-12-02 14:05:07 UTC."""
    if at is None:
        return "-"
    moment = _zoned(at, local)
    return f"{moment:%Y-%m-%d %H:%M:%S} {_zone(moment)}"


def clock_time(at: float, *, local: bool = False, seconds: bool = False) -> str:
    """A moment later today, for deadlines: 14:05 UTC (14:05:20 UTC with seconds)."""
    moment = _zoned(at, local)
    clock = f"{moment:%H:%M:%S}" if seconds else f"{moment:%H:%M}"
    return f"{clock} {_zone(moment)}"


def force_at_words(at: float | None, *, local: bool = False, now: float | None = None) -> str:
    """A drain's deadline as both front ends show it: 'force at 14:05 UTC', to
    the second when it is under an hour from `now`: 'force at 14:05:20 UTC'."""
    if at is None:
        return ""
    close = now is not None and at - now < 3600
    return f"force at {clock_time(at, local=local, seconds=close)}"


# -- models ---------------------------------------------------------------------

# A short model with nothing starting and no reason from the controller (an
# older controller): both front ends say so in these words.
NO_REASON = "no reason given by the controller"


def short_words(reason: str | None, starting: int = 0) -> str:
    """Why a model is short, the same in `ctl models`, `ctl status` and the console:
    one line (an engine's failure reason is its cause, then an excerpt of its log)."""
    if reason:
        return one_line(reason)
    if starting:
        return f"{starting} replica(s) starting"
    return NO_REASON


def rollout_words(rollout: Any) -> tuple[str, Meaning] | None:
    """A rollout in progress, the same in `ctl models` and `ctl rollout status`:
    `updating 1/2`, `rollout waiting: <why>`, `rollout stalled: <error tail>`;
    None when there is none (complete, or a controller from before rollouts)."""
    if rollout is None or rollout.state == "complete":
        return None
    if rollout.state == "progressing" and not rollout.outdated:
        return None  # every replica is current: a model short of ready ones, not a rollout
    if rollout.state == "stalled":
        return f"rollout stalled: {one_line(rollout.message or '')}", Meaning.BROKEN
    progress = f"updating {rollout.updated}/{rollout.desired}"
    if rollout.state == "waiting":
        return f"{progress}, waiting: {one_line(rollout.message or '')}", Meaning.ATTENTION
    return progress, Meaning.MOVING


def all_on_one_node(m: Any) -> bool:
    """Every serving replica of a model (two or more) on one node: that node's failure,
    reboot or drain takes the whole model (`ctl models` and the console flag it)."""
    return bool(m.ready >= 2 and getattr(m, "nodes", 0) == 1)


def model_words(m: Any) -> tuple[str, Meaning]:
    """A model's one-word state and why (a `ModelView`, or ctl's view of one); after
    a controller's restart, how many replicas it counts as last known, how long."""
    words, meaning = _model_words(m)
    unconfirmed = getattr(m, "unconfirmed", 0)
    if unconfirmed:
        words += f" ({unconfirmed} {unconfirmed_words(getattr(m, 'unconfirmed_s', None))})"
    return words, meaning


def unconfirmed_words(seconds: float | None) -> str:
    """A state kept from before a controller's restart, not yet confirmed by its nodes."""
    within = f"; its nodes report or turn unreachable within {seconds:.0f}s" if seconds else ""
    return f"as last known, unconfirmed since the controller restarted{within}"


def _model_words(m: Any) -> tuple[str, Meaning]:
    rolling = rollout_words(getattr(m, "rollout", None))
    if rolling is not None:
        return rolling
    if not m.satisfied:
        return f"short: {short_words(m.unplaceable_reason, m.starting)}", Meaning.BROKEN
    waking, sleeping = getattr(m, "waking", 0), getattr(m, "sleeping", 0)
    held = held_words(getattr(m, "held", 0), getattr(m, "held_s", None))
    if waking:
        return f"waking: {waking} asleep replica(s) woken for its requests{held}", Meaning.ATTENTION
    if sleeping and m.ready == 0 and held:  # its wake waits (for its card, as a rule)
        return f"asleep: {sleeping} replica(s) sleeping{held}, waiting to wake", Meaning.ATTENTION
    if sleeping and m.ready == 0:
        return f"asleep: {sleeping} replica(s) sleeping, woken by a request", Meaning.MUTED
    if all_on_one_node(m):
        return "satisfied, all on one node", Meaning.ATTENTION
    scaling = getattr(m, "scaling", None)
    state = getattr(m, "scaling_state", None)  # a ScalingState, compared as its word
    if scaling and state == "waking":
        return scaling, Meaning.ATTENTION
    if scaling and state == "asleep" and m.ready == 0:
        return scaling, Meaning.MUTED
    if scaling:  # autoscaled: where demand puts it, and why
        desired = getattr(m, "desired", m.ready)
        if m.ready < desired:
            return f"scaling up {m.ready} -> {desired}: {scaling}", Meaning.ATTENTION
        if m.ready > desired:
            return f"scaling down {m.ready} -> {desired}: {scaling}", Meaning.FINE
        return f"satisfied: {scaling}", Meaning.FINE
    return "satisfied", Meaning.FINE


def held_words(held: int, held_s: float | None) -> str:
    """`; 3 request(s) held for 2.4s`: what the gateways hold for a model that has no
    replica awake to take them (empty when none)."""
    if not held:
        return ""
    return f"; {held} request(s) held" + (f" for {held_s:.1f}s" if held_s is not None else "")


def adapter_words(a: Any, *, failure: bool = True) -> tuple[str, Meaning]:
    """A LoRA adapter's line (an `AdapterView`), for `ctl models` and the console:
    where it is loaded and on its way, what it serves, when last used; `failure`:
    and its last failed load (the console shows that in the detail instead)."""
    loaded = len(a.loaded_on)
    words = [f"adapter, loaded on {loaded}"]
    if a.loading_on:
        words.append(f"loading on {len(a.loading_on)}")
    if a.held:
        words.append(f"{a.held} held")
    words.append(f"{a.in_flight} in flight, {a.requests} requests")
    if a.last_used_s is not None:
        words.append(f"last used {a.last_used_s:.0f}s ago")
    if failure and a.last_failure:
        words.append(f"last failure: {a.last_failure}")
    if loaded:
        meaning = Meaning.FINE
    elif a.loading_on or a.held:
        meaning = Meaning.STARTING  # asked for: on its way to a replica
    elif a.last_failure:
        meaning = Meaning.BROKEN
    else:
        meaning = Meaning.MUTED  # idle and unloaded, as it should be
    return "; ".join(words), meaning


# -- node state ------------------------------------------------------------------


UNHEARD = " (no report)"
AGE_OF_ROW: object = object()  # "use row.report_age_s"


def node_state_parts(
    row: NodeRow, age: float | object | None = AGE_OF_ROW
) -> list[tuple[str, str]]:
    """The displayed state as (words, style) pieces.

    Liveness wins over the admin flag, which is kept beside it:
    `unreachable (cordoned)`; a finished drain reads `cordoned (drained)`.
    A node not heard from since the controller started (`age` None: a
    restart, and the node may well be dead) is not shown as plainly
    `cordoned` or `ready` for its grace period: `cordoned (no report)`.
    `age`: the node's report age now, where it is newer than the row's.
    """
    unheard = (row.report_age_s if age is AGE_OF_ROW else age) is None
    return state_parts(str(row.state), str(row.admin.flag), row.admin.drained, unheard)


def state_parts(state: str, flag: str, drained: bool, unheard: bool) -> list[tuple[str, str]]:
    """`node_state_parts` from the four things it reads."""
    parts = [(state, style_of(state))]
    if state == "unreachable" and flag != "none":
        parts.append((f" ({flag})", STYLE[Meaning.ATTENTION]))
    elif unheard and state != "unreachable":
        parts.append((UNHEARD, STYLE[Meaning.ATTENTION]))
    elif drained and state == "cordoned":
        parts.append((" (drained)", STYLE[Meaning.MUTED]))
    return parts


def node_state_words(row: NodeRow, age: float | object | None = AGE_OF_ROW) -> str:
    return "".join(words for words, _ in node_state_parts(row, age))


# The widest node_state_words can be: `unreachable (cordoned)`.
NODE_STATE_WIDTH = len("unreachable (cordoned)")
