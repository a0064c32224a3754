"""Capacity follows demand: how many replicas each model should have now.

Who calls: the reconcile loop, once a pass (`llmgw.controller.loop.demand.scale`), for every
declared model, with the requests in flight on its serving replicas. What it may
touch: nothing but its own memory; it answers a `Decision`, which the loop
writes as a fact (`Facts.set_scaling`) and every view reads: shortfalls
place up to the desired count, rollouts roll to it, scale-downs go down to it.

The memory is the loop's across passes, owned by one leadership term's
reconciler: per model, a short window of samples and since when a lower count
would do. Nothing here is durable. A new term starts each model at the count it
has (clamped to its bounds), so a restart or a failover neither adds nor takes
away a replica by itself.

The rules (Kubernetes' HPA has the same shape: a short window up, a long one down):

- the signal is requests in flight per model, averaged over a window so that one
  burst is not load: `UP_WINDOW_S` (a few seconds) for going up, `DOWN_WINDOW_S`
  for going down. One long window for both cost about half of it before a load
  step could ask for more (the mean must climb past the boundary: 5 s of 10 for
  load from 0 to twice a boundary), while the noise a scale-up might answer is
  bounded by the slow way down;
- up: `ceil(in flight / (target x UP_AT))` over the short window, at once (bounded
  by `max_replicas`): past 110 % of the target per replica, as HPA's 10 % tolerance.
  A short window alone answered noise (an hour of in-flight counts drawn with a
  30 % spread at a replica boundary went up and down again once or more, simulated
  in bench/bench_autoscale.py); the tolerance keeps such noise inside the band;
- down: to the count that would run each replica at `DOWN_AT` of its target or
  less over the long window, one replica at a time, each step only after that lower
  count has held for the spec's `scale_down_after_s`; any rise in between (either
  window asking for the count there is) starts the wait again. The band between
  the two rules, the long window and the wait keep noise around a target from
  flapping: a burst may add a replica, and only sustained quiet takes one away.
  Equal windows and `up_at=1.0` are the rule of one 10 s window that came before.
- `min_replicas: 0` with `max_replicas >= 1` sleeps at zero replicas once its
  last one has been unused that long, and wakes at its first request: the
  gateways hold requests for a model asleep and count them with the ones in
  flight (`GatewayStatus.held`, in `model_in_flight`), so one held request asks
  for one replica.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from llmgw.wire import ModelSpec, ScalingState

__all__ = ["DOWN_AT", "DOWN_WINDOW_S", "UP_AT", "UP_WINDOW_S", "Autoscaler", "Decision"]

UP_WINDOW_S = 3.0
DOWN_WINDOW_S = 10.0
UP_AT = 1.1  # up past 110 % of the target per replica, down under 90 %: between, nothing moves
DOWN_AT = 0.9


class Decision(NamedTuple):
    desired: int
    in_flight: float  # the short (up) window's mean of model_in_flight (held included)
    why: str  # `in flight 12, target 4 -> 3`; `waking for 4s: 2 held`; `asleep: ...`
    changed: int = 0  # +1 up, -1 down, 0 the same (an event when not 0)
    woke_at: float | None = None  # woken from zero and not serving yet: since when
    held: int = 0  # requests the gateways hold for it
    reason: str = ""  # `why` without the countdown to a scale-down (what a scale-down cites)
    state: ScalingState | None = None  # what `why` says in words; None: a fixed count


def desired_count(spec: ModelSpec, scaling: Decision | None) -> int:
    """How many replicas a model should have: what demand asked for (`scaling`),
    within its spec's bounds (which may have moved since), else its minimum."""
    if scaling is None:
        return spec.min_replicas
    return min(max(scaling.desired, spec.min_replicas), spec.most_replicas)


@dataclass
class _Model:
    desired: int
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (monotonic, in flight)
    lower_since: float | None = None  # since when a lower count would do
    woke_at: float | None = None  # when a held request woke it from zero


class Autoscaler:
    def __init__(
        self,
        up_window_s: float = UP_WINDOW_S,
        down_window_s: float = DOWN_WINDOW_S,
        up_at: float = UP_AT,
    ) -> None:
        """The defaults are the rules; `Autoscaler(DOWN_WINDOW_S, up_at=1.0)` is the one
        window for both ways that came before (bench/bench_autoscale.py compares them)."""
        if not 0 < up_window_s <= down_window_s:
            raise ValueError("the scale-up window must be positive and at most the down one")
        if up_at < 1.0:
            raise ValueError("scaling up below the target would flap against scaling down")
        self.up_window_s = up_window_s
        self.down_window_s = down_window_s
        self.up_at = up_at
        self._models: dict[str, _Model] = {}

    def decide(
        self,
        spec: ModelSpec,
        in_flight: float,
        current: int,
        now: float,
        *,
        held: int = 0,
        serving: int = 0,
    ) -> Decision:
        """The desired count of `spec`'s replicas at `now` (monotonic), given the
        requests in flight on its serving replicas and held for it
        (`replicas.model_in_flight`), how many of those the gateways hold (`held`:
        one wakes a model at zero), how many replicas it has (`current`: live
        ones, used once, when the model is first seen) and how many serve."""
        low, high = spec.min_replicas, spec.most_replicas
        if not spec.autoscaled:
            self._models.pop(spec.name, None)
            return Decision(spec.min_replicas, in_flight, "fixed count")
        m = self._models.get(spec.name)
        if m is None:
            m = self._models[spec.name] = _Model(desired=min(max(current, low), high))
        m.desired = min(max(m.desired, low), high)  # the spec's bounds may have moved
        m.samples.append((now, in_flight))
        while m.samples[0][0] < now - self.down_window_s:
            m.samples.popleft()
        mean = _mean(m.samples, now - self.up_window_s)
        slow = _mean(m.samples, now - self.down_window_s)
        target = spec.target_in_flight
        up = min(max(math.ceil(mean / (target * self.up_at)), low), high)
        down = min(max(math.ceil(slow / (target * DOWN_AT)), low), high)
        if held and up < 1 <= high:
            up = 1  # a held request wakes the model whatever the window says
        changed = 0
        if up > m.desired:
            if m.desired == 0:
                m.woke_at = now
            m.desired, m.lower_since, changed = up, None, 1
        elif down < m.desired and up < m.desired:  # the short window asking for as many
            if m.lower_since is None:  # is a rise too: a burst starts the wait again
                m.lower_since = now
            elif now - m.lower_since >= spec.scale_down_after_s:
                m.desired, m.lower_since, changed = m.desired - 1, now, -1
        else:
            m.lower_since = None
        if serving or m.desired == 0:
            m.woke_at = None
        # What a change cites: the long window's mean once a lower count is what it waits for.
        cited = slow if m.lower_since is not None or changed < 0 else mean
        reason = f"in flight {cited:.3g}, target {target} -> {m.desired}"
        why, state = reason, ScalingState.FOLLOWING
        if m.woke_at is not None:
            why = f"waking for {now - m.woke_at:.0f}s: {held} request(s) held"
            state = ScalingState.WAKING
        elif m.desired == 0:
            why, state = "asleep: woken by its first request", ScalingState.ASLEEP
        elif m.lower_since is not None and changed == 0:
            left = spec.scale_down_after_s - (now - m.lower_since)
            why += f" (down to {m.desired - 1} in {max(left, 0):.0f}s if it stays low)"
        return Decision(m.desired, mean, why, changed, m.woke_at, held, reason, state)

    def forget(self, keep: set[str]) -> None:
        """Drop the memory of models no longer declared."""
        for name in self._models.keys() - keep:
            del self._models[name]


def _mean(samples: deque[tuple[float, float]], since: float) -> float:
    """The mean of the samples taken at `since` or later (the newest always counts)."""
    recent = [n for at, n in samples if at >= since] or [samples[-1][1]]
    return sum(recent) / len(recent)
