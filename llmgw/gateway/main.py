"""`llmgw gateway`: parse options, check they are safe, run SMG and the follower."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from llmgw.common import HelpWithExamples, examples
from llmgw.controller.core.settings import is_loopback, split_listen
from llmgw.durations import duration_arg, format_duration
from llmgw.gateway.explain import WAKE_TIMEOUT_S
from llmgw.gateway.front import MAX_BODY, Front
from llmgw.gateway.keyring import Keyring
from llmgw.gateway.keys import ENV_KEY, load_keys
from llmgw.gateway.limits import Limiter
from llmgw.gateway.metering import Meter
from llmgw.gateway.sizes import format_size, size_arg
from llmgw.gateway.smg import Smg, SmgOptions, default_max_in_flight, free_loopback_port
from llmgw.gateway.sync import Follower
from llmgw.listen import PortInUse, check_free, raise_open_files
from llmgw.wire import GATEWAY_IN_FLIGHT_BOUND

POLICIES = ("cache_aware", "round_robin", "power_of_two", "random", "prefix_hash")
TOKEN_ENV = "LLMGW_GATEWAY_TOKEN"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw gateway",
        description="The OpenAI-compatible endpoint for every model: SMG, its workers kept "
        "equal to the controller's serving endpoints.",
        epilog=examples(
            "llmgw gateway --controller http://ctl:7460 --token-file /etc/llmgw/gateway.token "
            "--listen 0.0.0.0:8080 --api-key-file /etc/llmgw/client-keys"
        ),
        formatter_class=HelpWithExamples,
    )
    p.add_argument(
        "--controller",
        default=os.environ.get("LLMGW_CONTROLLER"),
        required="LLMGW_CONTROLLER" not in os.environ,
        metavar="URL[,URL]",
        help="the controller's URL, or several (the gateway follows the one that leads); "
        "env LLMGW_CONTROLLER",
    )
    p.add_argument(
        "--token-file", type=Path, help=f"the controller's gateway token (else {TOKEN_ENV})"
    )
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (default %(default)s)")
    p.add_argument(
        "--api-key-file",
        type=Path,
        help=f"client keys, `KEY` or `TENANT KEY` per line (else {ENV_KEY})",
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="cache_aware",
        metavar="POLICY",
        help="SMG's routing policy: " + ", ".join(POLICIES) + " (default: cache_aware)",
    )
    p.add_argument(
        "--wake-timeout",
        type=duration_arg,
        default=None,
        metavar="DURATION",
        help="how long a request for a model asleep at zero replicas is held while it wakes; "
        f"past it, 503 with Retry-After and the reason (default: {format_duration(WAKE_TIMEOUT_S)}, "
        "or --request-timeout when that is shorter)",
    )
    p.add_argument(
        "--request-timeout",
        type=duration_arg,
        default=1800.0,
        metavar="DURATION",
        help="the longest a request may take, reading its body and streaming its answer "
        "included: a body still arriving after it gets a 408; whole seconds, at most 1d "
        "(default 30m, SMG's; SMG has no bound on reading a body alone)",
    )
    p.add_argument(
        "--max-body",
        type=size_arg,
        default=MAX_BODY,
        metavar="SIZE",
        help="the largest request body taken (e.g. 64MiB, 512KiB, 1GiB); a larger one gets "
        f"a 413 in OpenAI's error shape (default {format_size(MAX_BODY)}: a long-context "
        "prompt and OpenAI's 50 MB of images per request fit)",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        metavar="N",
        help="requests admitted at once (given to SMG as --max-concurrent-requests; more "
        "wait in its queue); the controller counts no more than this of this gateway's "
        "requests as demand (default: SMG's own bound, 1024 per core, at least 4096)",
    )
    p.add_argument("--name", default=socket.gethostname(), help="default: the hostname")
    p.add_argument("--work-dir", type=Path, help="SMG's log and secrets file (default: a temp dir)")
    p.add_argument("--log-level", default="info", help="default: info")
    return p


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's where it is installed: the front door proxies every request, and
    uvloop takes about a third off what that costs (bench/README.md)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _whole_seconds(option: str, seconds: float) -> int:
    """Whole seconds, 1 to a day (SMG takes whole seconds)."""
    if not seconds.is_integer() or not 1 <= seconds <= 86_400:
        raise ValueError(
            f"{option} must be whole seconds from 1s to 1d (SMG takes whole seconds), "
            f"got {seconds:g}s"
        )
    return int(seconds)


def _token(path: Path | None) -> str | None:
    if path is not None:
        try:
            lines = [x.split("#", 1)[0].strip() for x in path.read_text().splitlines()]
        except OSError as exc:
            raise ValueError(f"cannot read --token-file: {exc}") from exc
        tokens = [x.rpartition(" ")[2] for x in lines if x]
        if not tokens:
            raise ValueError(f"--token-file {path} holds no token")
        return tokens[0]
    return os.environ.get(TOKEN_ENV, "").strip() or None


async def _serve(
    follower: Follower, smg: Smg, front: Front, host: str, port: int, banner: str
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await front.start(host, port)
    # Said once it is true: the port is open and a SIGTERM from now on stops it cleanly.
    print(banner, flush=True)
    tasks = [asyncio.create_task(smg.run()), asyncio.create_task(follower.run())]
    waiter = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        # A stop: the front closes its port and lets the requests in flight end (aiohttp's
        # shutdown bound, 60 s, within systemd's 90 s), with SMG and the follower still
        # there for them (a held request waits for its wake); then those two go.
        await front.stop()
        for t in [*tasks, waiter]:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
    for t in done:
        if t is not waiter and not t.cancelled() and t.exception():
            raise t.exception()  # type: ignore[misc]


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        args.request_timeout = _whole_seconds("--request-timeout", args.request_timeout)
        if args.wake_timeout is None:
            args.wake_timeout = min(WAKE_TIMEOUT_S, args.request_timeout)
        if not 0 < args.wake_timeout <= args.request_timeout:
            raise ValueError(
                "--wake-timeout must be more than 0 and at most --request-timeout "
                f"({args.request_timeout} s: SMG ends a held request then), "
                f"got {args.wake_timeout:g}"
            )
        if args.max_body < 1:
            raise ValueError("--max-body must be at least 1 byte")
        given = args.max_in_flight is not None
        if args.max_in_flight is None:
            args.max_in_flight = default_max_in_flight()
        if not 1 <= args.max_in_flight <= GATEWAY_IN_FLIGHT_BOUND:
            raise ValueError(
                f"--max-in-flight must be from 1 to {GATEWAY_IN_FLIGHT_BOUND:,}, "
                f"got {args.max_in_flight}"
            )
        host, port = split_listen(args.listen)
        keys = load_keys(args.api_key_file)
        token = _token(args.token_file)
        # SMG binds it; a taken port would otherwise be an SMG restart loop.
        check_free(host, port, "the gateway")
    except (ValueError, PortInUse) as exc:
        print(f"llmgw gateway: {exc}", file=sys.stderr)
        return 2
    public = not is_loopback(host)
    if not keys and not token and public:
        # Without a gateway token it cannot read the controller's keys either.
        print(
            f"llmgw gateway: refusing to listen on {host} without client keys: anyone on the "
            f"network could use every model. Give --api-key-file (or {ENV_KEY}), or the "
            "gateway token (--token-file) of a controller that holds keys (llmgw ctl keys "
            "create), or listen on 127.0.0.1.",
            file=sys.stderr,
        )
        return 2
    raise_open_files()  # every held client is a descriptor
    with contextlib.ExitStack() as cleanup:
        workdir = args.work_dir
        if workdir is None:  # ours alone: removed at exit, however the gateway stops
            temp = cleanup.enter_context(
                tempfile.TemporaryDirectory(prefix="llmgw-gateway-", ignore_cleanup_errors=True)
            )
            workdir = Path(temp)
        # SMG behind the front (front.py), on a loopback port, checking no client key
        # (the front checks them all) so that it sends each engine its own (smg.py).
        options = SmgOptions(
            host="127.0.0.1",
            port=free_loopback_port(),
            policy=args.policy,
            keys=[],
            workdir=workdir,
            request_timeout_s=args.request_timeout,
            max_body=args.max_body,
            max_in_flight=args.max_in_flight,
            max_in_flight_given=given,
        )
        smg = Smg(options)
        keyring = Keyring(keys)
        meter, limiter = Meter(), Limiter()
        follower = Follower(
            args.controller,
            token,
            args.name,
            smg,
            args.wake_timeout,
            keyring=keyring,
            max_body=args.max_body,
            meter=meter,
            limiter=limiter,
        )
        front = Front(
            keyring,
            lambda: smg.base,
            smg.admin_key,
            public=public,
            body_timeout_s=args.request_timeout,
            max_body=args.max_body,
            declared=follower.declared,
            meter=meter,
            limiter=limiter,
            parents=lambda: follower.adapters,
            on_answered=follower.answered,
        )
        auth = (
            f"{len(keys)} client key(s) from the file, and the controller's"
            if keys
            else "the controller's client keys"
        )
        kept = "" if args.work_dir else " (removed at exit: --work-dir keeps it)"
        banner = (
            f"llmgw gateway {args.name} listening on http://{args.listen} (policy {args.policy}, "
            f"{auth}); following {args.controller}; SMG log in {workdir}/smg.log{kept}"
        )
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_serve(follower, smg, front, host, port, banner))
    return 0
