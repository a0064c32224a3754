"""`llmgw agent`: the node agent daemon.

`llmgw agent --once --json` prints one report without sending it: the first
thing an operator runs on a node, like `nvidia-smi -q`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import ssl
import sys
from pathlib import Path

from llmgw.agent.assignments_feed import AssignmentFeed
from llmgw.agent.enroll import Enroller, read_credential
from llmgw.agent.fake_gpus import FakeGpuFile, FakeGpus, parse_fake_spec
from llmgw.agent.fake_process_memory import ENV_DIR
from llmgw.agent.gpus import DEFAULT_IGNORED_XIDS, GpuSource, NvmlGpus
from llmgw.agent.loop import Engines, ReportLoop
from llmgw.agent.report import ReportBuilder
from llmgw.agent.storage import parse_storage_arg
from llmgw.agent.storage_watch import StorageWatch
from llmgw.common import DEFAULT_CONTROLLER, HelpWithExamples, UsageError, examples
from llmgw.durations import duration_arg
from llmgw.listen import PortInUse
from llmgw.tls import TlsConfigError, client_context
from llmgw.wire import GpuHealth, NodeReport, node_name

log = logging.getLogger("llmgw.agent")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw agent",
        description="Observe this node (GPUs, fabrics, model weights on disk), run the "
        "engines the controller assigns, and report every few seconds.",
        epilog=examples(
            "llmgw agent --controller https://ctl:7460 --enroll-token-file /etc/llmgw/enroll.token "
            "--storage /mnt/models --fabric ib-a",
            "llmgw agent --once --json    # what this node would report, then exit",
        ),
        formatter_class=HelpWithExamples,
    )
    p.add_argument(
        "--controller",
        default=os.environ.get("LLMGW_CONTROLLER", DEFAULT_CONTROLLER),
        metavar="URL[,URL]",
        help="controller URL, or several (with PostgreSQL, any number may run: reports go "
        "to the one that leads); env LLMGW_CONTROLLER; default %(default)s",
    )
    p.add_argument("--node", default=socket.gethostname(), help="node name (default: hostname)")
    p.add_argument(
        "--interval",
        type=duration_arg,
        default=5.0,
        metavar="DURATION",
        help="time between reports (default 5s)",
    )
    p.add_argument(
        "--assignments-wait",
        type=duration_arg,
        default=30.0,
        metavar="DURATION",
        help="long-poll the controller this long for changes of this node's assignments, "
        "so a wake or a start begins at once rather than at the next report (default "
        "30s, at most 30s; 0: only with reports)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        help="file holding a fixed agent credential (else STATE_DIR/credential from "
        "enrollment, else LLMGW_AGENT_TOKEN)",
    )
    p.add_argument(
        "--ca-file",
        type=Path,
        default=os.environ.get("LLMGW_CA_FILE") or None,
        help="CA certificate to verify an https controller (env LLMGW_CA_FILE; "
        "default: the system's CAs)",
    )
    p.add_argument(
        "--enroll-token-file",
        type=Path,
        help="enrollment token (else LLMGW_ENROLL_TOKEN): traded on first contact for this "
        "node's own credential, kept in STATE_DIR/credential",
    )
    p.add_argument(
        "--fabric",
        action="append",
        default=[],
        metavar="NAME",
        help="fabric this node is on (repeatable); else derived from InfiniBand",
    )
    p.add_argument(
        "--storage",
        action="append",
        default=[],
        metavar="PATH[:local|:shared]",
        help="directory to look for model weights in (repeatable); the suffix "
        "overrides the mount-table classification",
    )
    p.add_argument(
        "--fake-gpus",
        action="append",
        default=[],
        metavar="COUNTxCLASS[,unhealthy=I,J] | @FILE",
        help="simulate GPUs instead of NVML, e.g. 8xH100-80GB,unhealthy=3 (repeatable); "
        "@FILE reads the specs, one per line, from FILE at every scan, so a card can fail "
        "while the agent runs",
    )
    p.add_argument(
        "--ignore-xids",
        default=",".join(str(x) for x in sorted(DEFAULT_IGNORED_XIDS)),
        help="Xids that do not make a card unhealthy (default %(default)s; '' for none)",
    )
    p.add_argument("--address", help="where engines on this node are reached (default: hostname)")
    p.add_argument(
        "--engine-host",
        metavar="HOST",
        help="address engines listen on (default: --address, else the hostname); "
        "0.0.0.0 listens on every interface, and only when given here",
    )
    p.add_argument("--sysfs-root", type=Path, default=Path("/sys"), help=argparse.SUPPRESS)
    p.add_argument(
        "--mountinfo", type=Path, default=Path("/proc/self/mountinfo"), help=argparse.SUPPRESS
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir(),
        help="where engine state and logs go (env LLMGW_AGENT_STATE; default %(default)s)",
    )
    p.add_argument(
        "--engine-templates",
        type=Path,
        metavar="FILE",
        help="TOML or YAML file adding or overriding engine command templates",
    )
    p.add_argument(
        "--engine-start-timeout",
        type=duration_arg,
        default=1800.0,
        metavar="DURATION",
        help="kill an engine not healthy this long after starting (default 30m)",
    )
    p.add_argument(
        "--engine-start-stall",
        type=duration_arg,
        default=600.0,
        metavar="DURATION",
        help="kill a starting engine that writes nothing to its log and uses under a "
        "second of CPU for this long (default 10m; 0: never)",
    )
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve the agent's own /metrics here (off by default; e.g. 127.0.0.1:9461)",
    )
    p.add_argument("--once", action="store_true", help="print one report and exit; send nothing")
    p.add_argument("--json", action="store_true", help="with --once: print the report as JSON")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    return p


def default_state_dir() -> Path:
    if "LLMGW_AGENT_STATE" in os.environ:
        return Path(os.environ["LLMGW_AGENT_STATE"])
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw/agent")
    return Path.home() / ".local" / "state" / "llmgw" / "agent"


def read_token(token_file: Path | None) -> str | None:
    """The token file's first non-comment line (`TOKEN` or `NAME TOKEN`), else the env."""
    if token_file is not None:
        try:
            lines = token_file.read_text().splitlines()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {token_file}: {exc.strerror}") from exc
        for line in lines:
            line = line.strip()
            if line and not line.startswith("#"):
                return line.split()[-1]
        raise UsageError(f"--token-file {token_file} holds no token")
    return os.environ.get("LLMGW_AGENT_TOKEN") or None


def read_enroll_token(path: Path | None) -> str | None:
    if path is None:
        return os.environ.get("LLMGW_ENROLL_TOKEN", "").strip() or None
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read --enroll-token-file {path}: {exc.strerror}") from exc
    if not text:
        raise UsageError(f"--enroll-token-file {path} holds no token")
    return text.split()[-1]


def credential_source(args: argparse.Namespace) -> tuple[str | None, Enroller | None]:
    """A fixed credential (--token-file), else the enrolled one, else enrollment, else env."""
    if args.token_file is not None:
        return read_token(args.token_file), None
    try:
        stored = read_credential(args.state_dir)
    except OSError as exc:
        raise UsageError(f"cannot read {args.state_dir}/credential: {exc.strerror}") from exc
    if stored is not None:
        return stored, None
    enroll_token = read_enroll_token(args.enroll_token_file)
    if enroll_token is not None:
        return None, Enroller(args.controller, args.node, enroll_token, args.state_dir)
    return read_token(None), None


def controller_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """A verifying context for an https controller; None for http."""
    if "https:" not in str(args.controller):
        return None
    try:
        return client_context(args.ca_file)
    except TlsConfigError as exc:
        raise UsageError(str(exc)) from exc


def _xids(text: str) -> frozenset[int]:
    try:
        return frozenset(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError as exc:
        raise UsageError(f"--ignore-xids wants numbers separated by commas, got {text!r}") from exc


def fake_memory(args: argparse.Namespace) -> Path:
    """Where this agent's fake engines say what they hold on its fake cards
    (llmgw.agent.fake_process_memory): the driver's part, which fake cards have none of."""
    return Path(args.state_dir) / "fake-gpu-memory"


def make_gpus(args: argparse.Namespace) -> GpuSource:
    if args.fake_gpus:
        files = [spec for spec in args.fake_gpus if spec.startswith("@")]
        if files and len(args.fake_gpus) > 1:
            raise UsageError("--fake-gpus @FILE: give the file alone (one spec per line in it)")
        try:
            if files:
                return FakeGpuFile(args.node, Path(files[0][1:]), memory_dir=fake_memory(args))
            groups = [parse_fake_spec(spec) for spec in args.fake_gpus]
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        return FakeGpus(args.node, groups, memory_dir=fake_memory(args))
    # --once reads once: no Xid event thread to start and stop.
    return NvmlGpus(_xids(args.ignore_xids), watch_xids=not args.once)


def make_builder(args: argparse.Namespace) -> ReportBuilder:
    try:
        args.node = node_name(args.node)  # lower case, as the controller keeps it
    except ValueError as exc:
        raise UsageError(f"--node {exc}") from None
    if not 0 < args.interval <= 3600:
        raise UsageError("--interval must be more than 0s and at most 1h")
    if not 0 <= args.assignments_wait <= 30:
        raise UsageError("--assignments-wait must be between 0s and 30s")
    try:
        dirs = [parse_storage_arg(s) for s in args.storage]
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return ReportBuilder(
        node=args.node,
        gpus=make_gpus(args),
        # Each directory scanned in its own thread: a hung filer cannot stop reports.
        storage=StorageWatch(
            dirs,
            args.mountinfo,
            wait_s=3600.0 if args.once else min(5.0, args.interval),  # --once: the full answer
            stuck_after_s=max(60.0, 3 * args.interval),
        ),
        interval_s=args.interval,
        fabrics=args.fabric,
        sysfs_root=args.sysfs_root,
        address=args.address or socket.gethostname(),
    )


def make_engines(args: argparse.Namespace, builder: ReportBuilder) -> Engines | None:
    """The engine supervisor: runs what the controller assigns to this node."""
    from llmgw.agent.engine_settings import SupervisorSettings
    from llmgw.agent.engine_templates import TemplateError, load_templates, merged_templates
    from llmgw.agent.engines import EngineSupervisor  # not needed by --once

    if not args.engine_start_timeout > 0:
        raise UsageError("--engine-start-timeout must be a positive duration (30s, 10m, 1h)")
    if not args.engine_start_stall >= 0:
        raise UsageError("--engine-start-stall must be 0 (never) or a positive duration (30s, 10m)")
    templates = merged_templates()  # the built-ins
    if args.engine_templates is not None:
        try:
            templates = merged_templates(load_templates(args.engine_templates))
        except TemplateError as exc:
            raise UsageError(str(exc)) from exc
    settings = SupervisorSettings(
        state_dir=args.state_dir,
        node=args.node,
        address=builder.address,
        engine_host=args.engine_host or builder.address or socket.gethostname(),
        templates=templates,
        start_timeout_s=args.engine_start_timeout,
        start_stall_s=args.engine_start_stall,
        extra_env={ENV_DIR: str(fake_memory(args))} if args.fake_gpus else {},
    )
    try:
        # A sleep's memory is measured on the node's cards.
        supervisor = EngineSupervisor(settings, card_memory=builder.gpus.processes)
        builder.engines = list(supervisor.templates)  # reported: see NodeReport.engines
        return supervisor
    except OSError as exc:
        raise UsageError(
            f"cannot use --state-dir {args.state_dir}: {exc.strerror or exc}; "
            "point --state-dir (or LLMGW_AGENT_STATE) at a writable directory"
        ) from exc


def describe(report: NodeReport) -> str:
    """A short human reading of one report, for `--once` without `--json`."""
    lines = [f"node {report.node}  agent {report.agent_version}  boot {report.boot_id}"]
    if report.gpu_error:
        lines.append(f"GPUs: none ({report.gpu_error})")
    else:
        bad = sum(g.health is GpuHealth.UNHEALTHY for g in report.gpus)
        lines.append(f"GPUs: {len(report.gpus)}, {bad} unhealthy")
    for g in report.gpus:
        mem = f"{g.memory_used_mib if g.memory_used_mib is not None else '?'}/{g.memory_total_mib}"
        reason = f"  ({g.health_reason})" if g.health_reason else ""
        lines.append(
            f"  {g.index:>2} {g.uuid}  {g.gpu_class:<16} {g.health.value:<9} "
            f"mem {mem} MiB  {'in use' if g.in_use else 'idle'}{reason}"
        )
    lines.append("fabrics: " + (", ".join(report.fabrics) or "none"))
    if not report.storage_configured:
        lines.append("storage: not configured (no --storage): no weights reported")
    for loc in report.storage:
        where = f"{loc.fs_type or '?'} {loc.mount_source or '?'}"
        override = ", override" if loc.scope_overridden else ""
        lines.append(f"storage {loc.path}: {loc.scope.value}{override} on {where}")
        if loc.error:
            lines.append(f"  error: {loc.error}")
        for m in loc.models:
            lines.append(f"  model {m.name}  {m.format}  {m.size_bytes / 2**30:.1f} GiB")
        for bad_model in loc.incomplete:
            lines.append(f"  not usable {bad_model.name}: {bad_model.reason}")
    return "\n".join(lines)


async def run_agent(
    args: argparse.Namespace, builder: ReportBuilder, stop: asyncio.Event | None = None
) -> None:
    """Report until `stop` is set or the task is cancelled.

    Takes over no signals: that is the entry point's choice (`main`), not a
    caller's that runs the agent inside its own loop (tests, the demo).
    """
    engines = make_engines(args, builder)
    token, enrollment = credential_source(args)
    loop = ReportLoop(
        builder,
        args.controller,
        token=token,
        engines=engines,
        enrollment=enrollment,
        ssl_context=controller_tls(args),
    )
    if engines is not None and args.assignments_wait > 0:
        loop.feed = AssignmentFeed(loop, args.assignments_wait)
    stop = stop or asyncio.Event()
    log.info("agent %s reporting to %s every ~%g s", builder.node, args.controller, args.interval)
    metrics = None
    try:
        if args.metrics_listen:
            from llmgw.agent.telemetry import AgentTelemetry

            metrics = await AgentTelemetry(loop).serve(args.metrics_listen)
        await loop.run(stop)
    finally:
        still_running = engines.reports() if engines is not None else []
        if metrics is not None:
            await metrics.cleanup()
        if engines is not None:
            await engines.close()
        builder.gpus.close()
        if still_running:
            log.info(
                "agent %s stopped; its engines keep running (an agent restart finds them again);"
                " to stop them: llmgw ctl drain %s --reason REASON, or stop the processes"
                " listed in %s",
                builder.node,
                builder.node,
                args.state_dir,
            )
        else:
            log.info("agent %s stopped", builder.node)


async def run_until_signalled(args: argparse.Namespace, builder: ReportBuilder) -> None:
    """The entry point's run: SIGTERM and SIGINT stop the agent cleanly."""
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(sig, stop.set)
    await run_agent(args, builder, stop)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.json and not args.once:
            raise UsageError("--json applies to --once (print one report); add --once")
        builder = make_builder(args)
        if args.once:
            try:
                report = builder.build()
            finally:
                builder.gpus.close()
            print(report.model_dump_json(indent=2) if args.json else describe(report))
            return 0
        credential_source(args)  # a bad token file is a usage error, up front
        controller_tls(args)
        asyncio.run(run_until_signalled(args, builder))
    except (UsageError, PortInUse) as exc:
        sys.stderr.write(f"llmgw agent: {exc}\n")
        return 2
    except KeyboardInterrupt:
        pass
    return 0
