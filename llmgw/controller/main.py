"""`llmgw controller`: parse options, check they are safe, serve."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path
from urllib.parse import urlsplit

from llmgw.common import HelpWithExamples, examples
from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import (
    DEFAULT_LISTEN,
    ControllerSettings,
    is_loopback,
    split_listen,
)
from llmgw.controller.http.app import create_app
from llmgw.controller.http.serve import ServerLimits, serve
from llmgw.controller.store import StateError, Store, describe, open_store, parse_store, store_spec
from llmgw.durations import duration_arg
from llmgw.listen import PortInUse, check_free
from llmgw.tls import TlsConfigError, server_context
from llmgw.wire import IDLE_AFTER_S

log = logging.getLogger("llmgw.controller")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw controller",
        description="Aggregate agent reports, keep durable state, place replicas, serve the admin API.",
        epilog=examples(
            "llmgw controller --state-dir /var/lib/llmgw --listen 127.0.0.1:7460",
            "llmgw controller --store postgresql://llmgw@db/llmgw --listen 0.0.0.0:7460 "
            "--advertise-url https://ctl-a:7460",
        ),
        formatter_class=HelpWithExamples,
    )
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT (default %(default)s)")
    p.add_argument(
        "--state-dir",
        type=Path,
        help="directory for the SQLite state (created if missing); same as --store sqlite:DIR",
    )
    p.add_argument(
        "--store",
        help="where durable state lives: sqlite:DIR (the default, one controller) or "
        "postgresql://USER@HOST/DB (several controllers may share it)",
    )
    p.add_argument(
        "--advertise-url",
        help="the URL others should use for this controller (default: http://LISTEN)",
    )
    p.add_argument(
        "--lease-ttl",
        type=duration_arg,
        default=8.0,
        metavar="DURATION",
        help="PostgreSQL: the leader's lease lasts this long unless renewed (every quarter "
        "of it); a follower takes over about this long after the leader dies (default 8s)",
    )
    p.add_argument(
        "--reset-state",
        action="store_true",
        help="start with empty state on purpose: the state file is moved aside (kept, renamed), "
        "for when it is damaged and there is no backup",
    )
    p.add_argument(
        "--agent-token-file",
        type=Path,
        help="node credentials, one `NODE TOKEN` per line; a line with only a token is a "
        "shared token (needs --allow-shared-agent-token), as is LLMGW_AGENT_TOKEN",
    )
    p.add_argument(
        "--enroll-token-file",
        type=Path,
        help="a static enrollment token (needs --allow-static-enroll-token): a new agent "
        "trades it for its own node credential (else LLMGW_ENROLL_TOKEN)",
    )
    p.add_argument(
        "--enroll-approval",
        action="store_true",
        help="a newly enrolled node gets no replicas until an admin approves it "
        "(`llmgw ctl credentials approve NODE`)",
    )
    p.add_argument(
        "--enroll-rate",
        type=float,
        default=5.0,
        metavar="N",
        help="enrollments taken per second, from all callers together (bursts of 2 s worth); "
        "more get 429 with Retry-After (default %(default)g)",
    )
    p.add_argument(
        "--allow-shared-agent-token",
        action="store_true",
        help="accept a shared agent token, which may report as any node (warned about)",
    )
    p.add_argument(
        "--allow-static-enroll-token",
        action="store_true",
        help="accept a static enrollment token, which never expires and has no use limit "
        "(warned about)",
    )
    p.add_argument(
        "--admin-token-file", type=Path, help="tokens for admin changes (else LLMGW_ADMIN_TOKEN)"
    )
    p.add_argument("--read-token-file", type=Path, help="read-only tokens (else LLMGW_READ_TOKEN)")
    p.add_argument(
        "--metrics-token-file",
        type=Path,
        help="tokens that may only scrape /metrics (else LLMGW_METRICS_TOKEN)",
    )
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="also serve /metrics without a token on this loopback address (off by default)",
    )
    p.add_argument(
        "--metrics-per-node",
        action="store_true",
        help="export per-node series too (one series set per node: mind the cardinality)",
    )
    p.add_argument(
        "--gateway-token-file",
        type=Path,
        help="tokens gateways read endpoints with (else LLMGW_GATEWAY_TOKEN)",
    )
    p.add_argument(
        "--stop-grace",
        type=duration_arg,
        default=60.0,
        metavar="DURATION",
        help="how long a stopping replica waits for gateways to let go of it (default 60s)",
    )
    p.add_argument(
        "--grace-intervals",
        type=float,
        default=3.0,
        help="missed report intervals before a node is unreachable",
    )
    p.add_argument(
        "--replace-after",
        type=duration_arg,
        default=300.0,
        metavar="DURATION",
        help="how long a node is unreachable before its replicas move (default 5m)",
    )
    p.add_argument(
        "--idle-after",
        type=duration_arg,
        default=IDLE_AFTER_S,
        metavar="DURATION",
        help="how long a ready replica nothing asked anything for is idle: listed in the "
        "summary, first to go when room is needed (default 10m; minutes, not seconds, in "
        "production: unloading a replica throws its KV cache away)",
    )
    p.add_argument(
        "--adapter-idle-after",
        type=duration_arg,
        default=300.0,
        metavar="DURATION",
        help="how long a LoRA adapter nothing asked for stays loaded (default 5m)",
    )
    p.add_argument(
        "--no-cordon-on-gpu-fault",
        dest="cordon_on_gpu_fault",
        action="store_false",
        help="leave a node with a failed card schedulable (its replicas on that card "
        "are still replaced elsewhere)",
    )
    p.add_argument(
        "--backoff-base",
        type=duration_arg,
        default=5.0,
        metavar="DURATION",
        help="how long a model with a failed replica waits before the next placement; "
        "doubles with each failure until one of its replicas has been ready 60s (default 5s)",
    )
    p.add_argument(
        "--backoff-cap",
        type=duration_arg,
        default=300.0,
        metavar="DURATION",
        help="the longest crash-loop backoff (default 5m)",
    )
    p.add_argument(
        "--reconcile-interval",
        type=duration_arg,
        default=1.0,
        metavar="DURATION",
        help="time between reconcile passes (default 1s); a pass also runs at once when "
        "an engine turns ready, asleep or failed, or a gateway holds requests or lets a "
        "replica go",
    )
    p.add_argument(
        "--idle-timeout",
        type=duration_arg,
        default=15.0,
        metavar="DURATION",
        help="close a connection idle this long, or still sending its request headers "
        "this long after it opened or after its last reply (default 15s)",
    )
    p.add_argument(
        "--body-timeout",
        type=duration_arg,
        default=30.0,
        metavar="DURATION",
        help="a request body must arrive within this long, else 408 (default 30s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=4096,
        metavar="N",
        help="open connections at most (lowered to fit RLIMIT_NOFILE); past it a new "
        "connection gets 503 (default %(default)s)",
    )
    p.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (PEM chain)")
    p.add_argument("--tls-key", type=Path, help="the certificate's private key (PEM)")
    p.add_argument("--log-level", default="info")
    return p


def settings_from_args(args: argparse.Namespace) -> ControllerSettings:
    """Build settings, or raise ValueError with a message a person can act on."""
    host, _ = split_listen(args.listen)
    if args.store is not None:
        kind, where = parse_store(args.store)
        if args.state_dir is not None and not (kind == "sqlite" and Path(where) == args.state_dir):
            raise ValueError("give --store or --state-dir, not both")
        if kind == "sqlite":
            args.state_dir = Path(where)
    elif args.state_dir is None:
        raise ValueError(
            "say where state lives: --store sqlite:DIR, --store postgresql://..., or --state-dir DIR"
        )
    for option, value in (
        ("--backoff-base", args.backoff_base),
        ("--backoff-cap", args.backoff_cap),
        ("--reconcile-interval", args.reconcile_interval),
        ("--idle-timeout", args.idle_timeout),
        ("--body-timeout", args.body_timeout),
        ("--stop-grace", args.stop_grace),
        ("--idle-after", args.idle_after),
        ("--adapter-idle-after", args.adapter_idle_after),
        ("--lease-ttl", args.lease_ttl),
    ):
        if not 0 < value <= 86_400:
            raise ValueError(f"{option} must be more than 0s and at most 1d, got {value:g}s")
    if not 0 < args.enroll_rate <= 10_000:
        raise ValueError(
            f"--enroll-rate must be between 0 and 10000 per second, got {args.enroll_rate:g}"
        )
    if args.max_connections < 1:
        raise ValueError(f"--max-connections must be at least 1, got {args.max_connections}")
    files = {
        Role.AGENT: args.agent_token_file,
        Role.ADMIN: args.admin_token_file,
        Role.READ: args.read_token_file,
        Role.ENROLL: args.enroll_token_file,
        Role.METRICS: args.metrics_token_file,
        Role.GATEWAY: args.gateway_token_file,
    }
    try:
        tokens = Tokens.load(files=files)
    except OSError as exc:
        raise ValueError(f"cannot read token file: {exc}") from exc
    # Agents can authenticate with a token of their own, or enroll with a token an
    # admin makes (`ctl credentials token create`): an admin token is what it takes.
    if not is_loopback(host) and not tokens.has(Role.ADMIN):
        raise ValueError(
            f"refusing to listen on {host} without tokens: anyone on the network could cordon "
            "nodes or forge reports. Set LLMGW_ADMIN_TOKEN (or --admin-token-file) and let "
            "agents enroll (`llmgw ctl credentials token create`), or listen on 127.0.0.1."
        )
    if tokens.shared_agent and not args.allow_shared_agent_token:
        raise ValueError(
            "a shared agent token (LLMGW_AGENT_TOKEN, or a line without a node name in "
            "--agent-token-file) lets its holder report as any node. Give each node its own "
            "credential (`NODE TOKEN` lines, or enrollment with --enroll-token-file), or pass "
            "--allow-shared-agent-token to accept it anyway."
        )
    if tokens.has(Role.ENROLL) and not args.allow_static_enroll_token:
        raise ValueError(
            "a static enrollment token (--enroll-token-file, LLMGW_ENROLL_TOKEN) never expires "
            "and has no use limit: whoever reads it can enroll nodes for ever. Make tokens "
            "that expire and count their uses (`llmgw ctl credentials token create --ttl 1h "
            "--uses N`), or pass --allow-static-enroll-token to accept it anyway."
        )
    if args.metrics_listen is not None:
        metrics_host, _ = split_listen(args.metrics_listen)
        if not is_loopback(metrics_host):
            raise ValueError(
                f"--metrics-listen serves /metrics without a token, so it binds only loopback; "
                f"got {metrics_host}. Scrape the main port with a read or metrics token instead."
            )
    return ControllerSettings(
        state_dir=args.state_dir if args.state_dir is not None else Path("."),
        store=args.store,
        advertise_url=args.advertise_url or _default_advertise(args),
        lease_ttl_s=args.lease_ttl,
        enroll_approval=args.enroll_approval,
        enroll_rate=args.enroll_rate,
        metrics_listen=args.metrics_listen,
        metrics_per_node=args.metrics_per_node,
        listen=args.listen,
        tokens=tokens,
        grace_intervals=args.grace_intervals,
        replace_after_s=args.replace_after,
        idle_after_s=args.idle_after,
        adapter_idle_s=args.adapter_idle_after,
        cordon_on_gpu_fault=args.cordon_on_gpu_fault,
        backoff_base_s=args.backoff_base,
        backoff_cap_s=args.backoff_cap,
        reconcile_interval_s=args.reconcile_interval,
        body_timeout_s=args.body_timeout,
        stop_grace_s=args.stop_grace,
    )


def _default_advertise(args: argparse.Namespace) -> str | None:
    """With TLS the URL others use is https (settings.url gives http otherwise)."""
    if args.tls_cert is None:
        return None
    host, port = split_listen(args.listen)
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}"


def advertise_warning(settings: ControllerSettings) -> str | None:
    """A PostgreSQL controller whose URL names no host: followers would send clients
    to an address that means "this machine" to each of them."""
    if settings.store is None or not settings.store.startswith(("postgresql:", "postgres:")):
        return None
    host = urlsplit(settings.url).hostname or ""
    if host in ("0.0.0.0", "::", ""):
        return (
            f"followers will name this controller {settings.url}, which is no address "
            "others can reach: pass --advertise-url https://THIS-HOST:PORT"
        )
    return None


def tune_gc() -> None:
    """Fewer, cheaper collections for a process that keeps 10,000 nodes in memory.

    Everything imported so far lives forever: freezing it keeps full
    collections from walking it again. A larger young generation means fewer
    objects promoted per report: the collector's pauses were most of a report's
    p99 at 10,000 nodes (bench/README.md, bench_controller.py).
    """
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def main(argv: list[str]) -> int:
    if argv[:1] == ["migrate"]:
        from llmgw.controller.migrate import migrate

        return migrate(argv[1:])
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"llmgw controller: {exc}", file=sys.stderr)
        return 2
    if (why := advertise_warning(settings)) is not None:
        log.warning("%s", why)
    if settings.tokens.shared_agent:
        log.warning(
            "a shared agent token is accepted (--allow-shared-agent-token): any agent holding "
            "it can report as any node; prefer per-node credentials (enrollment)"
        )
    if settings.tokens.has(Role.ENROLL):
        log.warning(
            "a static enrollment token is accepted (--allow-static-enroll-token): it never "
            "expires and has no use limit; prefer tokens made with "
            "`llmgw ctl credentials token create --ttl 1h --uses N`"
        )
    try:  # a taken port is said before the state is touched (created, or moved aside)
        check_free(settings.host, settings.port, "the API")
        if settings.metrics_listen is not None:
            check_free(*split_listen(settings.metrics_listen), "--metrics-listen")
    except PortInUse as exc:
        print(f"llmgw controller: {exc}", file=sys.stderr)
        return 2
    spec = store_spec(settings)
    if args.reset_state:
        if spec[0] != "sqlite":
            print("llmgw controller: --reset-state is for a SQLite store", file=sys.stderr)
            return 2
        try:
            aside = Store.reset(settings.state_dir)
        except OSError as exc:
            print(
                f"llmgw controller: --reset-state: cannot move the state aside: {exc}",
                file=sys.stderr,
            )
            return 2
        if aside is not None:
            print(f"llmgw controller: --reset-state: old state moved to {aside}", file=sys.stderr)
    try:  # check the state before saying we listen: a damaged file stops here
        open_store(spec, settings.url).close()
    except StateError as exc:
        print(f"llmgw controller: {exc}", file=sys.stderr)
        return 2
    mode = "token auth" if settings.tokens.enabled else "open (loopback only, no tokens)"
    if (args.tls_cert is None) != (args.tls_key is None):
        print("llmgw controller: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    ssl_context = None
    if args.tls_cert is not None:
        try:
            ssl_context = server_context(args.tls_cert, args.tls_key)
        except TlsConfigError as exc:
            print(f"llmgw controller: {exc}", file=sys.stderr)
            return 2
    elif not is_loopback(settings.host):
        log.warning(
            "listening on %s without TLS: tokens and reports cross the network in clear; "
            "pass --tls-cert and --tls-key",
            settings.host,
        )
    scheme = "https" if ssl_context is not None else "http"

    def listening() -> None:  # said once the port is ours
        print(
            f"llmgw controller listening on {scheme}://{args.listen} ({mode}); "
            f"state in {describe(spec)}",
            flush=True,
        )

    tune_gc()
    # Per-request access logs would be 2,000 lines a second at fleet scale.
    access_log = logging.getLogger("aiohttp.access") if args.log_level.lower() == "debug" else None
    limits = ServerLimits(idle_timeout_s=args.idle_timeout, max_connections=args.max_connections)
    try:
        serve(
            create_app(settings),
            settings.host,
            settings.port,
            limits,
            ssl_context=ssl_context,
            access_log=access_log,
            ready=listening,
        )
    except (StateError, PortInUse) as exc:  # one message, no traceback
        print(f"llmgw controller: {exc}", file=sys.stderr)
        return 2
    return 0
