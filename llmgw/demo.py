"""`llmgw demo`: a whole simulated fleet on this machine, in one command.

An embedded controller (state in a temporary directory) and N in-process
agents running the real agent code (report builder, storage scanner, report
loop, engine supervisor) with fake GPUs. By default 48 nodes in 3 fabrics:

- ib-a: 8 x H100-SXM-80GB per node; every node mounts one NFS filer holding
  two models and a half-finished download; two nodes have broken cards;
- ib-b: 8 x A100-SXM-80GB (one node also has L40S cards); a few nodes keep
  models on local NVMe: two complete copies, an empty directory, a truncated
  shard; the rest are not told to look;
- ib-c: 4 x L40S-48GB; two nodes look in an empty directory and find nothing.

The storage is real files (small but valid safetensors), classified through a
simulated mount table per node, exactly as on a real node. A few model specs
with the `fake` engine are declared, so replicas start as fake engine
processes once the controller places them; one spec cannot be placed.

Cards: the broken ones are there from the start (their nodes cordoned by llmgw at
once), and three minutes in (`--fail-card-after`) a card under a serving engine
fails, so the console shows its replica replaced elsewhere and its node cordoned.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmgw.agent.fake_gpus import FakeGpus, parse_fake_spec
from llmgw.agent.loop import Engines, ReportLoop
from llmgw.agent.report import ReportBuilder
from llmgw.agent.sample_models import write_adapter, write_model
from llmgw.agent.storage import StorageDir, StorageScanner
from llmgw.client import AdminClient, ControllerError, ControllerUnreachable
from llmgw.common import HelpWithExamples, examples
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.durations import duration_arg, format_duration
from llmgw.wire import AdapterSpec, GpuHealth, ModelSpec, ShardState

if TYPE_CHECKING:
    from llmgw.gateway.smg import Smg  # imported when the demo starts its gateway

log = logging.getLogger("llmgw.demo")

FABRICS = ("ib-a", "ib-b", "ib-c")
REPORT_INTERVAL_S = 2.0
FAIL_CARD_AFTER_S = 180.0
DEMO_IDLE_AFTER_S = 60.0  # the controller's --idle-after in the demo (10 min in production)
# Headless, the demo's terminal shows the banner and the controller's own decisions;
# these loggers speak once per node, engine or request, so they say only what went wrong.
PER_NODE_LOGGERS = ("llmgw.agent", "httpx")
SETTLE_S = 10.0  # at most this long for every node's first report before the banner
ROUTED_MODEL = "mistralai/Mistral-7B-Instruct-v0.3"  # part of its traffic comes through the gateway
SLEEPING_MODEL = "google/gemma-2-9b-it"  # at zero replicas until a request wakes it
WARM_MODEL = "Qwen/Qwen2.5-7B-Instruct"  # its idle replicas sleep, woken by a request


@dataclass
class DemoNode:
    name: str
    fabric: str
    gpus: list[str]  # --fake-gpus specs
    storage: list[StorageDir] = field(default_factory=list)
    mountinfo: Path | None = None


def _escape(path: Path) -> str:
    """A path as mountinfo writes it (octal escapes for space, tab, newline, backslash)."""
    out = str(path)
    for ch, code in (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012")):
        out = out.replace(ch, code)
    return out


def _mountinfo(root_dev: str, mounts: Sequence[tuple[Path, str, str]]) -> str:
    lines = [f"22 1 252:1 / / rw,relatime shared:1 - ext4 {root_dev} rw"]
    for i, (point, fs_type, source) in enumerate(mounts):
        lines.append(
            f"{30 + i} 22 0:{45 + i} / {_escape(point)} rw,relatime - {fs_type} {source} rw"
        )
    return "\n".join(lines) + "\n"


def _hf_download_in_progress(cache: Path, repo: str) -> None:
    """An HF cache entry whose download has not finished: a blob still .incomplete."""
    base = cache / ("models--" + repo.replace("/", "--"))
    commit = "3f1c" * 10
    snapshot = base / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    (base / "blobs").mkdir()
    (snapshot / "config.json").write_text('{"model_type": "mixtral"}')
    (base / "blobs" / ("9e" * 32 + ".incomplete")).write_bytes(b"\0" * 1024)


def _hf_complete(cache: Path, repo: str) -> None:
    """A finished HF cache entry: refs/main -> snapshot of symlinks into blobs/."""
    base = cache / ("models--" + repo.replace("/", "--"))
    commit = "a1b2" * 10
    snapshot = base / "snapshots" / commit
    staging = base / "staging"
    write_model(staging, shards=2)
    snapshot.mkdir(parents=True)
    (base / "blobs").mkdir()
    for i, f in enumerate(sorted(staging.iterdir())):
        blob = base / "blobs" / f"{i:064x}"
        f.rename(blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    staging.rmdir()
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)


def build_fleet(root: Path, nodes: int = 48) -> list[DemoNode]:
    """Lay out the simulated disks under `root` and say what each node has."""
    sizes = [nodes // 3 + (1 if i < nodes % 3 else 0) for i in range(3)]
    fleet: list[DemoNode] = []

    # ib-a: one NFS filer for every node of the fabric.
    filer = root / "filers" / "ib-a"
    write_model(filer / "meta-llama" / "Llama-3.1-8B-Instruct", shards=4)
    _hf_complete(filer / "hub", "Qwen/Qwen2.5-7B-Instruct")
    for adapter in DEMO_ADAPTERS:
        write_adapter(filer / "acme" / adapter, base="Qwen/Qwen2.5-7B-Instruct")
    _hf_download_in_progress(filer / "hub", "mistralai/Mixtral-8x7B-Instruct-v0.1")
    unhealthy_a = {3: "unhealthy=3", 7: "unhealthy=0,5"}
    for i in range(sizes[0]):
        name = f"gpu-a{i + 1:02d}"
        spec = "8xH100-SXM-80GB" + (f",{unhealthy_a[i]}" if i in unhealthy_a else "")
        mounts = root / "mounts" / name
        mounts.parent.mkdir(parents=True, exist_ok=True)
        mounts.write_text(_mountinfo("/dev/sda1", [(filer, "nfs4", "filer-a:/export/models")]))
        fleet.append(
            DemoNode(
                name,
                "ib-a",
                [spec],
                [StorageDir(str(filer))],  # plain layout and an HF cache in hub/
                mounts,
            )
        )

    # ib-b: local NVMe on a few nodes, nothing configured on the rest.
    for i in range(sizes[1]):
        name = f"gpu-b{i + 1:02d}"
        gpus = ["8xA100-SXM-80GB"]
        if i == 2:
            gpus = ["4xA100-SXM-80GB", "4xL40S-48GB"]  # two classes on one node
        if i == 5:
            gpus = ["8xA100-SXM-80GB,unhealthy=6"]
        node = DemoNode(name, "ib-b", gpus)
        if i < 4:
            local = root / "nodes" / name / "models"
            local.mkdir(parents=True)
            if i in (0, 1):
                write_model(local / "mistralai" / "Mistral-7B-Instruct-v0.3", shards=3)
            if i == 2:
                (local / "deepseek-ai" / "DeepSeek-V3").mkdir(parents=True)  # empty
            if i == 3:
                files = write_model(local / "google" / "gemma-2-9b", shards=2, tensor_bytes=4096)
                os.truncate(files[1], files[1].stat().st_size // 2)  # copy interrupted
            node.mountinfo = root / "mounts" / name
            node.mountinfo.parent.mkdir(parents=True, exist_ok=True)
            node.mountinfo.write_text(
                _mountinfo("/dev/sda1", [(local.parent, "ext4", "/dev/nvme0n1")])
            )
            node.storage = [StorageDir(str(local))]
        fleet.append(node)

    # ib-c: two nodes look and find nothing.
    for i in range(sizes[2]):
        name = f"gpu-c{i + 1:02d}"
        node = DemoNode(name, "ib-c", ["4xL40S-48GB" + (",unhealthy=2" if i == 1 else "")])
        if i < 2:
            empty = root / "nodes" / name / "models"
            empty.mkdir(parents=True)
            node.storage = [StorageDir(str(empty))]
            # on the root disk: a local filesystem the mount table names
            node.mountinfo = root / "mounts" / name
            node.mountinfo.parent.mkdir(parents=True, exist_ok=True)
            node.mountinfo.write_text(_mountinfo("/dev/sda1", []))
        fleet.append(node)
    return fleet


DEMO_ADAPTERS = ("sql-lora", "support-lora", "legal-lora")


def demo_adapters() -> list[AdapterSpec]:
    """LoRA adapters on one base, their files on ib-a's filer: loaded by their first
    request (`curl` one through the demo's gateway by its name), unloaded when idle."""
    base = "Qwen/Qwen2.5-7B-Instruct"
    return [AdapterSpec(name=n, base=base, source=f"acme/{n}") for n in DEMO_ADAPTERS]


def demo_specs() -> list[ModelSpec]:
    def fake(repo: str, **fields: Any) -> ModelSpec:
        """A model served from its hub repo of the same name by the fake engine."""
        return ModelSpec(name=repo, source=repo, engine="fake", **fields)

    return [
        fake(
            "meta-llama/Llama-3.1-8B-Instruct",
            min_replicas=3,
            gpus_per_shard=4,
            gpu_class="H100-SXM-80GB",
            engine_args=["--traffic", "3"],
        ),
        # The base of the demo's LoRA adapters (`demo_adapters`), a few held per replica,
        # and the warm tier: idle two minutes, its replicas sleep (keeping their cards
        # and processes); a request, for it or one of its adapters, wakes one in about
        # a second.
        fake(
            WARM_MODEL,
            min_replicas=2,
            gpus_per_shard=2,
            engine_args=["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "3"],
            sleep_after_s=120,
        ),
        # Routed through the gateway, in rushes (`routed_traffic`): it scales
        # between 2 and 4 replicas with them.
        fake(
            ROUTED_MODEL,
            min_replicas=2,
            max_replicas=4,
            target_in_flight=2,
            scale_down_after_s=120,
            gpus_per_shard=8,
            gpu_class="A100-SXM-80GB",
            engine_args=["--traffic", "1", "--token-interval", "0.2"],
        ),
        # Asleep at zero replicas until the banner's curl line wakes it.
        fake(
            SLEEPING_MODEL,
            min_replicas=0,
            max_replicas=2,
            scale_down_after_s=300,
            gpus_per_shard=1,
            gpu_class="L40S-48GB",
        ),
        fake(
            "deepseek-ai/DeepSeek-V3",
            min_replicas=1,
            gpus_per_shard=8,
            shards=2,
            gpu_class="H100-SXM-80GB",
            engine_args=["--traffic", "0.5"],
        ),
        fake(
            "meta-llama/Llama-3.1-405B-Instruct",
            min_replicas=1,
            gpus_per_shard=8,
            shards=4,
            gpu_class="B200-SXM-180GB",
        ),
    ]


@dataclass
class DemoAgent:
    node: DemoNode
    loop: ReportLoop
    engines: Engines | None
    gpus: FakeGpus


def make_agent(
    node: DemoNode, url: str, root: Path, *, engines: bool, seed: int, interval_s: float
) -> DemoAgent:
    supervisor: Engines | None = None

    def assigned() -> set[str]:
        """Cards the node's engines hold: busy, with memory used, as NVML would show."""
        if supervisor is None:
            return set()
        live = ("starting", "ready", "stopping")
        return {g for r in supervisor.reports() if str(r.state) in live for g in r.gpus}

    gpus = FakeGpus(node.name, [parse_fake_spec(s) for s in node.gpus], busy=assigned)
    builder = ReportBuilder(
        node=node.name,
        gpus=gpus,
        storage=StorageScanner(node.storage, node.mountinfo or Path("/nonexistent")),
        interval_s=interval_s,
        fabrics=[node.fabric],
        address="127.0.0.1",
        boot_id=f"demo-{node.name}",
    )
    if engines:
        from llmgw.agent.engine_settings import SupervisorSettings
        from llmgw.agent.engines import EngineSupervisor

        supervisor = EngineSupervisor(
            SupervisorSettings(
                state_dir=root / "agents" / node.name,
                node=node.name,
                address="127.0.0.1",
                engine_host="127.0.0.1",
                grace_s=3.0,
            )
        )
        builder.engines = list(supervisor.templates)
    loop = ReportLoop(builder, url, engines=supervisor, rng=random.Random(seed))
    return DemoAgent(node, loop, supervisor, gpus)


async def fail_a_card(agents: Sequence[DemoAgent], after_s: float, stop: asyncio.Event) -> None:
    """A few minutes in, a card under a serving engine fails (as a fatal Xid would):
    the console then shows its replica replaced elsewhere and its node cordoned."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), after_s)
        return
    while not stop.is_set():
        chosen = card_to_fail(agents)
        if chosen is not None:
            agent, card, replica = chosen
            agent.gpus.unhealthy.add(card)
            log.warning(
                "demo: card %s of %s fails now (simulated): its replica %s moves",
                card,
                agent.node.name,
                replica,
            )
            return
        await asyncio.sleep(1.0)


async def say_when_late(stop: asyncio.Event, every_s: float = 1.0, said_s: float = 5.0) -> None:
    """Say when the demo's own event loop runs `said_s` late or more: the controller and
    every simulated node share it, so on a busy machine a stall of 11 s (three report
    intervals and 5 s) shows every node unreachable, through no fault of theirs."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        asked = loop.time()
        await asyncio.sleep(every_s)
        late = loop.time() - asked - every_s
        if late >= said_s:
            log.warning(
                "demo: its event loop ran %.1f s late (the machine is busy): nodes may show"
                " unreachable for it",
                late,
            )


def card_to_fail(agents: Sequence[DemoAgent]) -> tuple[DemoAgent, str, str] | None:
    """A card under a ready engine whose replica a stand-in can replace elsewhere, with
    its node and replica id; None while there is none."""
    for agent in agents:
        for r in agent.engines.reports() if agent.engines else ():
            if r.state is ShardState.READY and r.gpus and _room_elsewhere(agents, agent, r.gpus):
                return agent, r.gpus[0], r.id
    return None


def _room_elsewhere(agents: Sequence[DemoAgent], home: DemoAgent, cards: Sequence[str]) -> bool:
    """Whether another node without a fault has as many free cards of the class as
    `cards`: a failed card whose replica has nowhere to go would show only a cordon
    (the replicas a model spreads over its class may fill every node of it)."""
    classes = {g.uuid: g.gpu_class for g in home.gpus.scan().gpus}
    wanted = {classes.get(c) for c in cards}
    for agent in agents:
        if agent is home:
            continue
        scan = agent.gpus.scan().gpus
        if any(g.health is GpuHealth.UNHEALTHY for g in scan):
            continue  # cordoned by llmgw for its fault
        free = [g for g in scan if g.gpu_class in wanted and not g.in_use]
        if len(free) >= len(cards):
            return True
    return False


async def _stop_engines(agents: Sequence[DemoAgent]) -> None:
    """Unlike a real agent, the demo takes its engines down with it."""
    running = [a.engines for a in agents if a.engines is not None]
    for engines in running:
        with contextlib.suppress(Exception):
            await engines.apply([], {})
    for _ in range(50):  # up to ~5 s: SIGTERM, then the supervisor's SIGKILL
        if not any(
            r.state.value in ("starting", "ready", "stopping") for e in running for r in e.reports()
        ):
            break
        await asyncio.sleep(0.1)
    for engines in running:
        with contextlib.suppress(Exception):
            await engines.close()


def banner(url: str, fleet: Sequence[DemoNode], root: Path, *, headless: bool = True) -> str:
    fabrics = sorted({n.fabric for n in fleet})
    return "\n".join(
        [
            f"llmgw demo: {len(fleet)} simulated nodes in {len(fabrics)} fabrics "
            f"({', '.join(fabrics)})",
            f"  controller:  {url}",
            f"  state and simulated disks: {root}",
            "  in another terminal:",
            f"    llmgw ctl --controller {url} status",
            f"    export LLMGW_CONTROLLER={url}; llmgw ctl nodes; llmgw console",
            "  Ctrl-C stops the demo."
            if headless
            else "  quitting the console (q) stops the demo.",
        ]
    )


def _start_gateway(controller: str, root: Path) -> tuple[Smg, list[asyncio.Task[None]]]:
    """One `llmgw gateway` in process: SMG on a free loopback port, following the demo."""
    from llmgw.gateway.smg import Smg, SmgOptions, free_loopback_port
    from llmgw.gateway.sync import Follower

    options = SmgOptions(
        host="127.0.0.1",
        port=free_loopback_port(),
        policy="cache_aware",
        keys=[],
        workdir=root / "gateway",
    )
    smg = Smg(options)
    follower = Follower(controller, None, "demo-gateway", smg)
    return smg, [asyncio.create_task(smg.run()), asyncio.create_task(follower.run())]


SYSTEM_PROMPTS = 4  # shared prefixes, so cache-aware routing has something to find
# A rush of RUSH_RATE requests a second for RUSH_S every RUSH_EVERY_S, the first
# RUSH_AFTER_S in; ROUTED_RATE in between.
ROUTED_RATE = 2.0
RUSH_RATE = 8.0
RUSH_AFTER_S, RUSH_S, RUSH_EVERY_S = 60.0, 180.0, 600.0
MAX_CONCURRENT = 64


def routed_rate(elapsed_s: float) -> float:
    """Requests a second the demo sends through the gateway, `elapsed_s` in."""
    in_cycle = (elapsed_s - RUSH_AFTER_S) % RUSH_EVERY_S
    return RUSH_RATE if elapsed_s >= RUSH_AFTER_S and in_cycle < RUSH_S else ROUTED_RATE


async def routed_traffic(gateway: Callable[[], str], stop: asyncio.Event, seed: int = 0) -> None:
    """Part of the demo's traffic goes through the gateway, as real clients would:
    chat requests behind a few long shared system prompts, arriving at random at
    `routed_rate`, each on its own (so a rush has many in flight and the model
    scales). Errors (before a replica serves, during a drain) are the demo's
    weather, not logged."""
    import httpx

    rng = random.Random(seed)
    systems = [" ".join(f"policy{p}-{i}" for i in range(256)) for p in range(SYSTEM_PROMPTS)]
    slots = asyncio.Semaphore(MAX_CONCURRENT)
    started = asyncio.get_running_loop().time()

    async def one(http: httpx.AsyncClient, body: dict[str, object]) -> None:
        try:
            with contextlib.suppress(httpx.HTTPError):
                await http.post(f"{gateway()}/v1/chat/completions", json=body)
        finally:
            slots.release()

    async with httpx.AsyncClient(timeout=30.0) as http:
        pending: set[asyncio.Task[None]] = set()
        n = 0
        while not stop.is_set():
            n += 1
            body = {
                "model": ROUTED_MODEL,
                "messages": [
                    {"role": "system", "content": rng.choice(systems)},
                    {"role": "user", "content": f"question {n}"},
                ],
                "max_tokens": 8,
            }
            await slots.acquire()
            task = asyncio.create_task(one(http, body))
            pending.add(task)
            task.add_done_callback(pending.discard)
            rate = routed_rate(asyncio.get_running_loop().time() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.expovariate(rate))
        for task in list(pending):
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def curl_line(url: str) -> str:
    """A first request through the gateway: one line, so a paste runs it whole."""
    body = f'{{"model": "{SLEEPING_MODEL}", "messages": [{{"role": "user", "content": "hello"}}]}}'
    return f"curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"


def gateway_banner(url: str) -> str:
    return "\n".join(
        [
            f"  gateway (OpenAI API, SMG): {url}",
            # One line: pasted whole as a command (the console's help copies it with y).
            f"    {curl_line(url)}",
            f"    ({SLEEPING_MODEL} sleeps at zero replicas: this request wakes it and is",
            "    answered in a few seconds; `llmgw ctl status` shows it waking)",
            f"    ({WARM_MODEL}'s replicas sleep after 2 minutes idle, keeping their cards:"
            " the same request with its name wakes one in about a second, `ctl replicas`)",
            f"    ({ROUTED_MODEL}'s traffic comes through it, with a rush a minute in:"
            " it scales from 2 to 4 replicas and back, `llmgw ctl models` and `ctl events`)",
        ]
    )


async def run_demo(
    args: argparse.Namespace,
    stop: asyncio.Event,
    on_ready: Callable[[str], None] | None = None,
) -> int:
    own_root = args.state_dir is None
    root = Path(tempfile.mkdtemp(prefix="llmgw-demo-")) if own_root else Path(args.state_dir)
    root.mkdir(parents=True, exist_ok=True)
    runner: web.AppRunner | None = None
    agents: list[DemoAgent] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        fleet = build_fleet(root, args.nodes)
        # Idle after a minute, not ten: a newcomer sees idleness while the demo is new.
        settings = ControllerSettings(
            state_dir=root / "controller",
            listen=f"127.0.0.1:{args.port}",
            idle_after_s=DEMO_IDLE_AFTER_S,
        )
        runner = web.AppRunner(create_app(settings), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", args.port).start()
        except OSError as exc:
            sys.stderr.write(
                f"llmgw demo: cannot listen on 127.0.0.1:{args.port}: {exc.strerror}; "
                "pass --port 0 for any free port\n"
            )
            return 1
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        agents = [
            make_agent(n, url, root, engines=not args.no_engines, seed=i, interval_s=args.interval)
            for i, n in enumerate(fleet)
        ]
        tasks = [asyncio.create_task(a.loop.run(stop)) for a in agents]
        tasks.append(asyncio.create_task(say_when_late(stop)))
        smg: Smg | None = None
        if not args.no_engines:
            async with AdminClient(url) as client:
                await client.apply_models(demo_specs(), demo_adapters())
            started, gateway_tasks = _start_gateway(url, root)
            tasks += [
                *gateway_tasks,
                asyncio.create_task(routed_traffic(lambda: started.base, stop)),
            ]
            smg = started
            if args.fail_card_after > 0:
                tasks.append(asyncio.create_task(fail_a_card(agents, args.fail_card_after, stop)))
        await _settled(url, len(fleet), settings.reconcile_interval_s)
        about = banner(url, fleet, root, headless=args.headless)
        # Read once settled: a start of SMG that found its port taken moved it.
        gateway_url = None if smg is None else smg.base
        if gateway_url is not None:
            about += "\n" + gateway_banner(gateway_url)
        print(about, flush=True)
        if on_ready is not None:
            on_ready(url)
        if args.headless:
            await stop.wait()
        else:
            await _console(url, stop, about, gateway_url or "")
        return 0
    finally:
        stop.set()
        for t in tasks[len(agents) :]:  # the gateway's: they run until cancelled
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _stop_engines(agents)
        if runner is not None:
            await runner.cleanup()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


async def _settled(url: str, nodes: int, reconcile_s: float) -> None:
    """Until every node has reported and the controller has acted on what they said
    (cordons for broken cards, the first placements): the banner then comes after
    those lines instead of under them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_S
    async with AdminClient(url) as client:
        while loop.time() < deadline:
            with contextlib.suppress(ControllerError, ControllerUnreachable):
                if (await client.summary()).nodes.total >= nodes:
                    break
            await asyncio.sleep(0.1)
    await asyncio.sleep(1.5 * reconcile_s)  # one reconcile pass over every report


async def _console(url: str, stop: asyncio.Event, about: str, gateway: str) -> None:
    """The live console in this terminal, the banner in its help (the terminal's
    scrollback is hidden behind it); quitting it ends the demo."""
    try:
        from llmgw.console.app import ConsoleApp
    except ImportError:
        await stop.wait()
        return
    async with AdminClient(url) as client:
        app = ConsoleApp(client, about=about, gateway=gateway)
        console = asyncio.create_task(app.run_async())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({console, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not console.done():
            app.exit()
            await console
        stopped.cancel()
    print("llmgw demo: stopping the simulated fleet", flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw demo",
        description="A simulated fleet on this machine: an embedded controller and "
        "in-process agents with fake GPUs, real storage observation and fake engines.",
        epilog=examples(
            "llmgw demo                   # the fleet and its console, in this terminal",
            "llmgw demo --nodes 200 --headless",
        ),
        formatter_class=HelpWithExamples,
    )
    p.add_argument("--nodes", type=int, default=48, help="simulated nodes (default 48)")
    p.add_argument(
        "--port", type=int, default=7460, help="controller port on 127.0.0.1 (0: any free)"
    )
    p.add_argument(
        "--headless", action="store_true", help="no console here: print how to connect, wait"
    )
    p.add_argument(
        "--interval",
        type=duration_arg,
        default=REPORT_INTERVAL_S,
        metavar="DURATION",
        help=f"agent report interval (default {format_duration(REPORT_INTERVAL_S)})",
    )
    p.add_argument("--no-engines", action="store_true", help="declare no models, run no engines")
    p.add_argument(
        "--fail-card-after",
        type=duration_arg,
        default=FAIL_CARD_AFTER_S,
        metavar="DURATION",
        help="fail a card under a serving engine this long after the start, to show its "
        f"replacement and the cordon (0: never; default {format_duration(FAIL_CARD_AFTER_S)})",
    )
    p.add_argument("--state-dir", type=Path, help="keep state and disks here (default: a temp dir)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not 3 <= args.nodes <= 2000:
        sys.stderr.write("llmgw demo: --nodes must be between 3 and 2000\n")
        return 2
    if not 0 < args.interval <= 3600:
        sys.stderr.write("llmgw demo: --interval must be more than 0s and at most 1h\n")
        return 2
    logging.basicConfig(
        level=logging.WARNING if not args.headless else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.headless:
        # The console owns the terminal: keep agent warnings out of its way.
        logging.getLogger().setLevel(logging.ERROR)
    else:
        for name in PER_NODE_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)

    async def _main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # SIGHUP: the terminal running the demo was closed. Every way out ends in
        # run_demo's `finally`, which stops the engines the demo started.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        return await run_demo(args, stop)

    try:
        return asyncio.run(_main())
    except KeyboardInterrupt:
        return 0
