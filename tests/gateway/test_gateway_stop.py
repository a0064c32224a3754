"""A gateway's SIGTERM (systemd's stop, a restart for an upgrade): its port closes at
once, a stream in flight ends whole, and the process is gone soon after it, without
waiting out SMG's 5 s window for load balancers (the front is SMG's only client)."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import model, one_card_serving

pytestmark = pytest.mark.timeout(120)

TOKENS = 20  # 0.1 s apart (gwprocs.ENGINE_ARGS): a stream of about 2 s


def test_a_stopped_gateway_ends_the_stream_in_flight_and_takes_no_new_one(
    cluster: Cluster,
) -> None:
    gw = one_card_serving(cluster, [model("m")])
    try:
        events: list[str] = []
        began = threading.Event()
        ended: list[float] = []

        def stream() -> None:
            body = {"model": "m", "prompt": "hi", "max_tokens": TOKENS, "stream": True}
            with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=30) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        began.set()
            ended.append(time.monotonic())

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert began.wait(20), gw.logs()
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)

        def refused() -> bool:
            try:
                httpx.get(f"{gw.url}/health", timeout=2)
            except httpx.ConnectError:
                return True
            return False

        wait_until(refused, timeout=5, what="the gateway's port closed", diagnose=gw.logs)
        assert reader.is_alive(), "the stream ended before the port closed: make it longer"
        reader.join(30)
        assert events[-1] == "[DONE]", events
        text = [json.loads(e)["choices"][0] for e in events[:-1]]
        assert sum(1 for t in text if t.get("text")) == TOKENS, events
        assert gw.proc.wait(timeout=20) == 0, gw.logs()
        gone = time.monotonic()
        assert gone - ended[0] < 4, f"exited {gone - ended[0]:.1f} s after its last stream"
    finally:
        gw.stop()
