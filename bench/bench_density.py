"""More models than GPUs (issue 32): the warm tier against stop-and-start, side by side.

Two fleets run at once on this machine, the same in all but one thing: one agent
with `--cards` fake cards, a controller, the gateway with its SMG child, and
`--cards` x `--per-card` models at zero (`min_replicas` 0, `max_replicas` 1) whose
fake engine loads for `--load-seconds` and wakes in `--wake-seconds`. In the
*sleep* fleet an idle replica sleeps after `--idle` seconds (`sleep_after_s`, level
1); in the *stop* fleet it is stopped after the same idle time
(`scale_down_after_s`), so every return is an engine start. Both get the same
requests at the same moments: open-loop Poisson arrivals at `--rate` per second for
`--minutes`, each to a model drawn with a Zipf-like popularity (weight 1/rank^s),
streamed, answered with `--tokens` tokens.

Before the window every model is asked once, so that it has been placed once (the
sleep fleet's replicas are then asleep on the cards, the stop fleet's stopped); the
window's figures exclude that warm-up.

Printed per fleet: requests answered, refused (503) and failed; time to first token
of the requests that found their model asleep (sleep fleet) or at zero (stop fleet),
split by whether another model's replica was awake on its card when sent (a wake then
waits for it to make way), and of all requests; the card-free ones over wake + 1 s by
what they waited for (their replica put to sleep just before, another model woken on
the card first, or neither: the wake's own path); wakes, switches (a model awake on a
card another was awake on under 5 s before; the busiest pairs listed) and engine
starts per minute; card-seconds awake per model (ready, starting, waking or draining, from the replicas
polled every half second).
Then the sleep fleet's figures as ratios of the stop fleet's, measured in this run.

    .venv/bin/python bench/bench_density.py [--cards 8] [--per-card 3] [--minutes 10]
        [--rate 1] [--load-seconds 30] [--wake-seconds 1] [--idle 10] [--zipf 1.0]
        [--priority-top N] [--placement together|by-popularity] [--sleep-only] [--share F]

`--placement by-popularity` warms up the most popular `--cards` models first, then the
next, each round once the last has gone asleep: the most popular models each have a card
of their own (what a placement that knew popularity would do), where `together` (every
model at once) leaves it to chance.

`--share F` gives every model `gpu_memory_share: F`: a sleeping model wakes beside the
awake ones on its card while the shares add up to at most 1 (0.45: two awake a card), and
a switch puts to sleep only as many as make room. A request "beside" another awake model
then need not wait for it.

`--priority-top N` gives the N most popular models priority 1 in both fleets (the
rest 0), and prints the asleep-model TTFT of each group: at a switch, an awake model
of lower priority makes way even while busy.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from llmgw.listen import raise_open_files
from tests.e2e.procs import Cluster
from tests.gateway.gwprocs import Gateway, model, wait_cluster_ready

AWAKE = ("ready", "starting", "waking", "draining")
POLL_S = 0.5
SWITCH_GAP_S = 5.0  # one model awake on a card this soon after another: a switch
JUST_ASLEEP_S = 3.0  # a replica polled asleep this briefly may still be falling asleep
WARM_UP_LIMIT_S = 1800.0  # the stop fleet places one model per card per round


@dataclass
class Answer:
    sent: float  # seconds into the window
    model: str
    found: str  # the model's replica when sent: asleep, awake, none (at zero), moving
    status: int  # HTTP status; 0: the connection failed
    ttft: float | None  # seconds to the first token (None: no token)
    code: str | None = None  # the error's code, if any
    beside: bool = False  # another model's replica awake on its card when sent
    asleep_for: float | None = None  # how long it had been polled asleep when sent
    woke_beside: bool = False  # another model's replica polled awake on its card while it waited


@dataclass
class Watch:
    """What the poller saw of one fleet: each model's replica state now, card-seconds
    awake per model, wakes (sleeping -> waking/ready, the same id) and engine
    starts (a replica id not seen before)."""

    state: dict[str, str] = field(default_factory=dict)  # model -> its replica's state
    awake_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    wakes: int = 0
    # (from, to) -> switches: another model awake on a card within SWITCH_GAP_S before
    switches: Counter[tuple[str, str]] = field(default_factory=Counter)
    last_awake: dict[str, tuple[str, float]] = field(default_factory=dict)  # card -> (model, when)
    starts: int = 0
    counting: bool = False
    seen: dict[str, str] = field(default_factory=dict)  # replica id -> state last poll
    cards: dict[str, set[str]] = field(default_factory=dict)  # model -> its replica's cards
    awake_on: dict[str, set[str]] = field(default_factory=dict)  # card -> models awake there
    since: dict[str, float] = field(default_factory=dict)  # model -> when its state began
    # (when polled, card -> models awake there): what happened on a card while a request waited
    history: list[tuple[float, dict[str, set[str]]]] = field(default_factory=list)


def fleet_specs(
    names: list[str],
    mode: str,
    load_s: float,
    wake_s: float,
    idle: float,
    urgent: frozenset[str] = frozenset(),
    share: float | None = None,
) -> list[dict[str, Any]]:
    out = []
    for name in names:
        spec = model(name, min_replicas=0)
        args = list(spec["engine_args"])
        args[args.index("--load-seconds") + 1] = str(load_s)
        args += ["--wake-seconds", str(wake_s)]
        spec = {**spec, "engine_args": args, "max_replicas": 1}
        if name in urgent:
            spec["priority"] = 1
        if share is not None:
            spec["gpu_memory_share"] = share
        if mode == "sleep":
            spec |= {"sleep_after_s": idle, "sleep_level": 1}
        else:
            spec |= {"scale_down_after_s": idle}
        out.append(spec)
    return out


class Fleet:
    def __init__(self, root: Path, mode: str, cards: int, trace: bool = False) -> None:
        self.mode = mode
        self.c = Cluster(root / mode)
        # trace (--keep): every event in the controller's log as it is taken, to be read
        # beside the agent's sleeps and wakes and the answers (the store folds repeats).
        debug = ["--log-level", "debug"] if trace else []
        self.c.start_controller("--reconcile-interval", "0.5", "--stop-grace", "20", *debug)
        self.c.start_agent("gpu1", gpus=f"{cards}xH100-80GB", interval=0.5)
        wait_cluster_ready(self.c, ["gpu1"])
        self.gw: Gateway | None = None
        self.watch = Watch()
        self.answers: list[Answer] = []
        self.t0_wall = 0.0  # when the window began (unix time)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def start(self, specs: list[dict[str, Any]]) -> None:
        self.c.apply(specs)
        self.gw = Gateway(self.c, name=f"gw-{self.mode}")
        self.gw.start()
        self._poller.start()

    def _poll(self) -> None:
        w, last = self.watch, time.monotonic()
        http = httpx.Client(base_url=self.c.url, timeout=10)
        while not self._stop.wait(POLL_S):
            try:
                replicas = http.get("/v1/replicas").json()
            except (httpx.HTTPError, ValueError):
                continue
            now = time.monotonic()
            dt, last = now - last, now
            state = {}
            cards: dict[str, set[str]] = {}
            awake_on: dict[str, set[str]] = defaultdict(set)
            for r in replicas:
                state[r["model"]] = r["state"]
                mine = {g for s in r["shards"] for g in s["gpus"]}
                cards[r["model"]] = mine
                if r["state"] in AWAKE:
                    for g in mine:
                        awake_on[g].add(r["model"])
                before = w.seen.get(r["id"])
                if w.counting:
                    if before is None:
                        w.starts += 1
                    elif before == "sleeping" and r["state"] in ("waking", "ready"):
                        w.wakes += 1
                    if r["state"] in AWAKE:
                        w.awake_s[r["model"]] += dt * sum(len(s["gpus"]) for s in r["shards"])
            w.seen = {r["id"]: r["state"] for r in replicas}
            w.since = {m: w.since[m] if w.state.get(m) == s else now for m, s in state.items()}
            w.state, w.cards, w.awake_on = state, cards, awake_on
            if w.counting:
                w.history.append((now, awake_on))
                for g, models in awake_on.items():
                    if len(models) != 1:
                        continue  # two at once: the poll caught a hand-over midway
                    (m,) = models
                    was = w.last_awake.get(g)
                    if was is not None and was[0] != m and now - was[1] <= SWITCH_GAP_S:
                        w.switches[(was[0], m)] += 1
                    w.last_awake[g] = (m, now)

    def found(self, name: str) -> str:
        s = self.watch.state.get(name)
        if s is None:
            return "none"
        if s == "sleeping":
            return "asleep"
        return "awake" if s == "ready" else "moving"

    def beside(self, name: str) -> bool:
        """Whether another model's replica is awake on `name`'s cards (as last polled):
        a wake there waits for it to make way."""
        w = self.watch
        return any(w.awake_on.get(g, set()) - {name} for g in w.cards.get(name, ()))

    def asleep_for(self, name: str, now: float) -> float | None:
        """How long `name`'s replica has been polled asleep (None: it is not)."""
        if self.watch.state.get(name) != "sleeping":
            return None
        return now - self.watch.since.get(name, now)

    def woke_beside(self, name: str, sent: float, until: float) -> bool:
        """Whether another model's replica was polled awake on `name`'s cards between
        `sent` and `until` (monotonic): its wake then waited for that one."""
        cards, history = self.watch.cards.get(name, ()), self.watch.history
        first = bisect.bisect_left(history, sent, key=lambda h: h[0])  # polled in order
        return any(
            any(on.get(g, set()) - {name} for g in cards)
            for t, on in itertools.takewhile(
                lambda h: h[0] <= until, itertools.islice(history, first, None)
            )
        )

    def close(self) -> None:
        self._stop.set()
        if self.gw is not None:
            self.gw.stop()
        self.c.close()


async def ask(http: httpx.AsyncClient, fleet: Fleet, name: str, t0: float, tokens: int) -> Answer:
    assert fleet.gw is not None
    sent = time.monotonic()
    found, beside = fleet.found(name), fleet.beside(name)
    asleep_for = fleet.asleep_for(name, sent)
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": True,
    }
    ttft = None
    try:
        async with http.stream("POST", f"{fleet.gw.url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raw = await r.aread()
                code = None
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    code = json.loads(raw)["error"]["code"]
                return Answer(sent - t0, name, found, r.status_code, None, code, beside)
            async for line in r.aiter_lines():
                if ttft is None and line.startswith("data:") and '"content"' in line:
                    ttft = time.monotonic() - sent
            woke_beside = ttft is not None and fleet.woke_beside(name, sent, sent + ttft)
            return Answer(sent - t0, name, found, 200, ttft, None, beside, asleep_for, woke_beside)
    except httpx.HTTPError as exc:
        return Answer(sent - t0, name, found, 0, None, type(exc).__name__, beside)


def sleep_cards(fleet: Fleet) -> dict[str, list[str]]:
    """Card -> the models whose replica holds it (as last polled)."""
    out: dict[str, list[str]] = defaultdict(list)
    for name, gpus in fleet.watch.cards.items():
        for g in gpus:
            out[g].append(name)
    return out


async def warm_up(fleets: list[Fleet], names: list[str], tokens: int) -> float:
    """Every model in `names` asked once in each fleet (again after a 503) until answered."""
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=len(names) * 2 + 10)
    async with httpx.AsyncClient(timeout=400, limits=limits) as http:

        async def once(fleet: Fleet, name: str) -> None:
            while time.monotonic() - t0 < WARM_UP_LIMIT_S:
                if (await ask(http, fleet, name, t0, tokens)).status == 200:
                    return
                await asyncio.sleep(2)
            raise RuntimeError(f"{name} was never answered in the {fleet.mode} fleet")

        await asyncio.gather(*(once(f, n) for f in fleets for n in names))
    return time.monotonic() - t0


async def window(fleets: list[Fleet], schedule: list[tuple[float, str]], tokens: int) -> None:
    t0 = time.monotonic()
    for f in fleets:
        f.watch.counting = True
        f.t0_wall = time.time()  # the answers' `sent` is from here, the logs' time is wall
    limits = httpx.Limits(max_connections=4000)
    async with httpx.AsyncClient(timeout=400, limits=limits) as http:
        tasks = []
        for at, name in schedule:
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            for f in fleets:
                tasks.append(asyncio.create_task(_keep(f, ask(http, f, name, t0, tokens))))
        await asyncio.gather(*tasks)
    for f in fleets:
        f.watch.counting = False


async def _keep(fleet: Fleet, answer: Any) -> None:
    fleet.answers.append(await answer)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def summary(
    f: Fleet, minutes: float, names: list[str], urgent: frozenset[str], target_s: float
) -> dict[str, float]:
    a = f.answers
    ok = [x for x in a if x.status == 200]
    cold = "asleep" if f.mode == "sleep" else "none"
    waited = [x.ttft for x in ok if x.found == cold and x.ttft is not None]
    alone = [x.ttft for x in ok if x.found == cold and x.ttft is not None and not x.beside]
    crowded = [x.ttft for x in ok if x.found == cold and x.ttft is not None and x.beside]
    first = [x.ttft for x in ok if x.found == cold and x.ttft is not None and x.model in urgent]
    rest = [x.ttft for x in ok if x.found == cold and x.ttft is not None and x.model not in urgent]
    every = [x.ttft for x in ok if x.ttft is not None]
    # The card-free requests over the target, by what they waited for: a replica put
    # to sleep just before (its sleep ends before the wake begins), another model
    # woken on the card first (a switch), or neither (the wake's own path).
    late = [x for x in ok if x.found == cold and not x.beside and (x.ttft or 0) > target_s]
    just = [x for x in late if x.asleep_for is not None and x.asleep_for < JUST_ASLEEP_S]
    switched = [x for x in late if x not in just and x.woke_beside]
    awake = [f.watch.awake_s.get(n, 0.0) for n in names]
    return {
        "sent": len(a),
        "answered": len(ok),
        "refused": sum(1 for x in a if x.status == 503),
        "failed": sum(1 for x in a if x.status not in (200, 503)),
        "found_cold": sum(1 for x in a if x.found == cold),
        "ttft_cold_p50": pct(waited, 0.5),
        "ttft_cold_p99": pct(waited, 0.99),
        "found_cold_alone": len(alone),
        "ttft_cold_alone_p50": pct(alone, 0.5),
        "ttft_cold_alone_p99": pct(alone, 0.99),
        "found_cold_crowded": len(crowded),
        "ttft_cold_crowded_p50": pct(crowded, 0.5),
        "ttft_cold_crowded_p99": pct(crowded, 0.99),
        "found_cold_urgent": len(first),
        "ttft_cold_urgent_p50": pct(first, 0.5),
        "ttft_cold_urgent_p99": pct(first, 0.99),
        "ttft_cold_rest_p50": pct(rest, 0.5),
        "ttft_cold_rest_p99": pct(rest, 0.99),
        "late_alone": len(late),
        "late_just_asleep": len(just),
        "late_switched": len(switched),
        "late_neither": len(late) - len(just) - len(switched),
        "ttft_p50": pct(every, 0.5),
        "ttft_p99": pct(every, 0.99),
        "wakes_per_min": f.watch.wakes / minutes,
        "switches_per_min": sum(f.watch.switches.values()) / minutes,
        "starts_per_min": f.watch.starts / minutes,
        "awake_s_mean": statistics.fmean(awake),
        "awake_s_max": max(awake),
        "awake_s_sum": sum(awake),
    }


def show(
    rows: dict[str, dict[str, float]], per_card: int, cards: int, wake_s: float, urgent: int
) -> None:
    s = rows["sleep"]
    o = rows.get("stop") or dict.fromkeys(s, float("nan"))  # --sleep-only
    by_priority = [
        (f"  of the {urgent} at priority 1", "found_cold_urgent", "{:.0f}"),
        ("    their TTFT p50 (s)", "ttft_cold_urgent_p50", "{:.2f}"),
        ("    their TTFT p99 (s)", "ttft_cold_urgent_p99", "{:.2f}"),
        ("  the rest's TTFT p50 (s)", "ttft_cold_rest_p50", "{:.2f}"),
        ("  the rest's TTFT p99 (s)", "ttft_cold_rest_p99", "{:.2f}"),
    ]
    lines = [
        ("requests sent", "sent", "{:.0f}"),
        ("answered (200)", "answered", "{:.0f}"),
        ("refused (503)", "refused", "{:.0f}"),
        ("failed otherwise", "failed", "{:.0f}"),
        ("found their model asleep / at zero", "found_cold", "{:.0f}"),
        ("  their TTFT p50 (s)", "ttft_cold_p50", "{:.2f}"),
        ("  their TTFT p99 (s)", "ttft_cold_p99", "{:.2f}"),
        ("  with their card free when sent", "found_cold_alone", "{:.0f}"),
        ("    their TTFT p50 (s)", "ttft_cold_alone_p50", "{:.2f}"),
        ("    their TTFT p99 (s)", "ttft_cold_alone_p99", "{:.2f}"),
        ("    of them over wake + 1 s", "late_alone", "{:.0f}"),
        (f"      put to sleep < {JUST_ASLEEP_S:g} s before", "late_just_asleep", "{:.0f}"),
        ("      another model woke there first", "late_switched", "{:.0f}"),
        ("      neither (the wake's own path)", "late_neither", "{:.0f}"),
        ("  with another model awake on it", "found_cold_crowded", "{:.0f}"),
        ("    their TTFT p50 (s)", "ttft_cold_crowded_p50", "{:.2f}"),
        ("    their TTFT p99 (s)", "ttft_cold_crowded_p99", "{:.2f}"),
        *(by_priority if urgent else []),
        ("TTFT of all answered, p50 (s)", "ttft_p50", "{:.2f}"),
        ("TTFT of all answered, p99 (s)", "ttft_p99", "{:.2f}"),
        ("wakes per minute", "wakes_per_min", "{:.1f}"),
        ("  switches per minute", "switches_per_min", "{:.1f}"),
        ("engine starts per minute", "starts_per_min", "{:.1f}"),
        ("card-seconds awake per model, mean", "awake_s_mean", "{:.0f}"),
        ("card-seconds awake per model, max", "awake_s_max", "{:.0f}"),
        ("card-seconds awake, all models", "awake_s_sum", "{:.0f}"),
    ]
    print(f"\n{cards * per_card} models on {cards} cards ({per_card} per card)")
    print(f"{'':40} {'sleep':>9} {'stop':>9} {'sleep/stop':>11}")
    for label, key, fmt in lines:
        ratio = s[key] / o[key] if o[key] else float("nan")
        print(f"{label:40} {fmt.format(s[key]):>9} {fmt.format(o[key]):>9} {ratio:>11.2f}")
    target = wake_s + 1
    p99 = s["ttft_cold_p99"]
    print(
        f"sleep fleet: {'every' if s['refused'] + s['failed'] == 0 else 'NOT every'} request "
        f"answered; asleep-model TTFT p99 {p99:.2f} s against the target wake + 1 s = {target:.1f} s"
    )


def run(args: argparse.Namespace, per_card: int) -> None:
    names = [f"m{i:02d}" for i in range(args.cards * per_card)]
    rng = random.Random(args.seed)
    popularity = names[:]
    rng.shuffle(popularity)
    urgent = frozenset(popularity[: args.priority_top])
    weights = [1 / (rank + 1) ** args.zipf for rank in range(len(names))]
    schedule, at = [], 0.0
    while True:
        at += rng.expovariate(args.rate)
        if at >= args.minutes * 60:
            break
        schedule.append((at, rng.choices(popularity, weights)[0]))
    with tempfile.TemporaryDirectory(prefix="bench-density-") as tmp:
        fleets: list[Fleet] = []
        try:
            for mode in ("sleep",) if args.sleep_only else ("sleep", "stop"):
                fleets.append(Fleet(Path(tmp), mode, args.cards, trace=args.keep is not None))
            for f in fleets:
                f.start(
                    fleet_specs(
                        names,
                        f.mode,
                        args.load_seconds,
                        args.wake_seconds,
                        args.idle,
                        urgent,
                        args.share,
                    )
                )
            # --placement together: every model asked at once, so the cards each lands on
            # are the placement's, whatever their popularity. by-popularity: a round per
            # `--cards` models, the most popular first, each after the last round's have
            # gone asleep (or stopped): the most popular `--cards` each land on an empty
            # card, and no two of them share one (what a placement that knew popularity
            # would do).
            if args.placement == "together":
                rounds = [names]
            else:
                rounds = [
                    popularity[i : i + args.cards] for i in range(0, len(popularity), args.cards)
                ]
            took = 0.0
            for batch in rounds:
                took += asyncio.run(warm_up(fleets, batch, args.tokens))
                # Let the warm-up's replicas go idle, then asleep (or stopped), first.
                time.sleep(args.idle + 5)
            print(
                f"warm-up ({args.placement}): every model answered once in both fleets "
                f"in {took:.0f} s"
            )
            if args.placement == "by-popularity":
                cards = sleep_cards(fleets[0])
                print(
                    "cards (most popular first): "
                    + "; ".join(
                        " ".join(
                            f"{m} (#{popularity.index(m) + 1})"
                            for m in sorted(cards.get(c, []), key=popularity.index)
                        )
                        for c in sorted(cards, key=lambda c: min(map(popularity.index, cards[c])))
                    )
                )
            asyncio.run(window(fleets, schedule, args.tokens))
            target = args.wake_seconds + 1
            rows = {f.mode: summary(f, args.minutes, names, urgent, target) for f in fleets}
            show(rows, per_card, args.cards, args.wake_seconds, len(urgent))
            per_model = defaultdict(list)
            for f in fleets:
                for x in f.answers:
                    if x.status != 200:
                        per_model[f.mode].append((x.found, x.status, x.code))
            for mode, bad in per_model.items():
                print(f"{mode}: not answered (found, status, code): {dict(Counter(bad))}")
            pairs = fleets[0].watch.switches
            if pairs:  # both ways of a pair together: which neighbours trade a card most
                both = Counter({tuple(sorted(k)): pairs[k] + pairs[k[::-1]] for k in pairs})
                print(
                    "sleep fleet, switches by pair (both ways): "
                    + ", ".join(f"{a}<->{b} {n}" for (a, b), n in both.most_common(8))
                )
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                for f in fleets:
                    (args.keep / f"events-{f.mode}-{per_card}.txt").write_text(
                        f.c.ctl("events", "-o", "wide")
                    )
                    rows_out = [vars(x) for x in f.answers]
                    (args.keep / f"answers-{f.mode}-{per_card}.json").write_text(
                        json.dumps(rows_out)
                    )
                    (args.keep / f"window-{f.mode}-{per_card}.txt").write_text(f"{f.t0_wall}\n")
                    for log in f.c.root.glob("*.log"):  # controller, agent, gateway
                        shutil.copy(log, args.keep / f"{f.mode}-{per_card}-{log.name}")
        finally:
            for f in fleets:
                f.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cards", type=int, default=8)
    p.add_argument("--per-card", type=int, nargs="+", default=[3, 8])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=1.0, help="requests per second (Poisson)")
    p.add_argument("--load-seconds", type=float, default=30.0)
    p.add_argument("--wake-seconds", type=float, default=1.0)
    p.add_argument("--idle", type=float, default=10.0, help="sleep_after_s / scale_down_after_s")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity exponent s")
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--seed", type=int, default=32)
    p.add_argument(
        "--priority-top",
        type=int,
        default=0,
        help="the N most popular models get priority 1 (a busy lower one makes way for them)",
    )
    p.add_argument(
        "--placement",
        choices=["together", "by-popularity"],
        default="together",
        help="the warm-up: every model at once, or the most popular first, a card each",
    )
    p.add_argument(
        "--share",
        type=float,
        help="every model's gpu_memory_share: models whose shares add up to at most 1 are "
        "awake on a card at once (0.45: two), where without it a card holds one awake",
    )
    p.add_argument(
        "--sleep-only",
        action="store_true",
        help="run the sleep fleet alone (no stop fleet beside it): what the machine's load adds",
    )
    p.add_argument(
        "--keep",
        type=Path,
        help="write each fleet's events, answers, window start and logs here (the "
        "controller then logs every event at debug)",
    )
    args = p.parse_args()
    raise_open_files()
    for per_card in args.per_card:
        run(args, per_card)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
