"""A gateway status's per-replica figures: whole, or what changed since the status
the controller last took.

A gateway posts its requests in flight and forwarded per replica every second. Whole,
that is about 40 bytes a replica a second per gateway, and the controller parses and
compares every entry (bench/README.md, "The gateway status as changes"). Once the
controller's answer says it takes changes (GatewayStatusReply.deltas), each status
carries only the entries that changed since the one it last took (`base`) and the
replicas dropped (`gone`); when the controller cannot apply them (it restarted, took
over, or an answer was lost) it says `full` and the next status is whole again, as
the nodes feed resyncs a console.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.wire import GatewayStatusReply


@dataclass(frozen=True)
class _Figures:
    seq: int
    in_flight: Mapping[str, int]
    requests: Mapping[str, int]


def _changed(before: Mapping[str, int], now: Mapping[str, int], gone: set[str]) -> dict[str, int]:
    return {k: n for k, n in now.items() if before.get(k) != n or k in gone}


class StatusFigures:
    """The figures part of each status, and what the controller took of it.

    One per gateway run: `stream` tells the controller that a restarted gateway's
    `seq` starts again."""

    def __init__(self, stream: str | None = None) -> None:
        self.stream = stream or secrets.token_hex(8)
        self.deltas = False  # the controller said it takes changes
        self._seq = 0
        self._sent: _Figures | None = None  # in the status being posted
        self._taken: _Figures | None = None  # in the last status the controller took

    def body(self, in_flight: dict[str, int], requests: dict[str, int]) -> dict[str, object]:
        """The figures' fields of the next status (the maps are not changed later)."""
        if not self.deltas:
            self._sent = None
            return {"in_flight": in_flight, "requests": requests}
        self._seq += 1
        self._sent = _Figures(self._seq, in_flight, requests)
        out: dict[str, object] = {"stream": self.stream, "seq": self._seq}
        base = self._taken
        if base is None:
            return out | {"in_flight": in_flight, "requests": requests}
        # `gone` drops a replica from both maps: one still in either is sent again there.
        gone = (base.in_flight.keys() | base.requests.keys()) - (in_flight.keys() & requests.keys())
        out |= {
            "base": base.seq,
            "in_flight": _changed(base.in_flight, in_flight, gone),
            "requests": _changed(base.requests, requests, gone),
        }
        if gone:
            out["gone"] = sorted(gone)
        return out

    def answered(self, answer: bytes) -> bool:
        """The controller answered the status `body` made last; `answer` is its body
        (empty from a controller before changes: whole figures from then on). True
        when it could not take the changes sent: the whole figures are due at once."""
        try:
            reply = GatewayStatusReply.model_validate(json.loads(answer)) if answer else None
        except ValueError:
            reply = None
        self.deltas = reply is not None and reply.deltas
        if reply is None or reply.full or not reply.deltas:
            self._taken = None
        elif self._sent is not None:
            self._taken = self._sent
        return reply is not None and reply.full
