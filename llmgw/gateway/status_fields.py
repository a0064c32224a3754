"""Which optional fields of a gateway's status the controller takes.

A controller refuses a body with a field it does not know (`Inbound`: unknown fields
are an error), so a controller older than its gateways would refuse every status
that carries a field added since: the gateway's in-flight counts stop reaching it,
and every stop waits out its grace. Its 400 names each such field (`detail`: `loc`
the field, `type` `extra_forbidden`, as every controller has answered since the
first). The gateway then sends its status without them, as an older gateway would,
and offers them again after `OFFER_AGAIN_S`: the controller may have been upgraded.
"""

from __future__ import annotations

import json

# What a gateway's status may leave out: everything but who it is, where it is, and
# its figures (`name`, `cursor`, `in_flight`, `requests`, and the figures' own
# negotiation, which the controller's answer settles: llmgw.gateway.status_figures).
OPTIONAL = frozenset(
    {
        "routed",
        "rejected",
        "released",
        "held",
        "held_age",
        "max_in_flight",
        "adapter_in_flight",
        "adapter_requests",
        "adapters_at",
        "adapter_busy",
        "keys_used",
    }
)
OFFER_AGAIN_S = 300.0


class StatusFields:
    """The optional fields the controller refused lately, and when."""

    def __init__(self) -> None:
        self._refused: dict[str, float] = {}  # field -> when refused (monotonic)

    @property
    def refused(self) -> frozenset[str]:
        return frozenset(self._refused)

    def strip(self, body: dict[str, object], now: float) -> None:
        """Leave out of `body` what the controller refused under `OFFER_AGAIN_S` ago."""
        for name, at in list(self._refused.items()):
            if now - at >= OFFER_AGAIN_S:
                del self._refused[name]  # offered again
            else:
                body.pop(name, None)

    def take_refusal(
        self, status: int, answer: bytes, body: dict[str, object], now: float
    ) -> list[str]:
        """The optional fields of `body` that a 400 `answer` refuses as unknown, kept
        to be left out from now on; none when it refuses anything else (the status is
        then not sent again without them: that refusal is the gateway's bug, or the
        controller's, and is reported as it is)."""
        if status != 400:
            return []
        try:
            detail = json.loads(answer).get("detail")
        except (ValueError, AttributeError):
            return []
        if not isinstance(detail, list):
            return []
        refused = {(d.get("loc"), d.get("type")) for d in detail if isinstance(d, dict)}
        names = sorted({loc for loc, _ in refused if loc in OPTIONAL and loc in body})
        if not names or refused != {(n, "extra_forbidden") for n in names}:
            return []  # not only optional fields refused as unknown
        for name in names:
            self._refused[name] = now
        return names
