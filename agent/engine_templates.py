"""Engine command templates: how to turn a shard assignment into an argv list.

A template is a command line with `{variables}`. It is split into words with
shlex *before* substitution, so a value with spaces (a path, a model name)
stays one argument and can never inject options or shell syntax: there is no
shell. The model spec's `engine_args` are appended verbatim.

Variables: python, source, model, replica, port, host (the address to listen
on: the agent's --engine-host, else its --address), gpus (cards on this
node), gpu_uuids, total_gpus (gpus x nnodes), nnodes, rank, leader_addr,
rendezvous_port. `{{` and `}}` give literal braces.

A multi-node replica runs `leader_command` on rank 0 and `worker_command` on
the other ranks (each falls back to the one before it, then to `command`).
Workers of vLLM and SGLang serve no HTTP, so by default only rank 0 is health
checked and scraped; `worker_serves_http` says otherwise.

Operators add or override templates with a TOML or YAML file
(`--engine-templates FILE`):

    [engines.vllm]
    command = "/opt/vllm/bin/vllm serve {source} --host {host} --port {port} -tp {gpus}"

    [engines]
    tiny = "my-engine --host {host} --port {port} {source}"   # a bare string is `command`

A table without `command` for a built-in name changes only the fields it gives,
so the built-in's arguments are kept. `executable` replaces the command's program,
the words before its first option or `{variable}` (`vllm serve`, `python3`): the
CPU build of vLLM, whose `vllm` command does not start, say:

    [engines.vllm]
    executable = "/opt/vllm-cpu/bin/python -m vllm.entrypoints.openai.api_server"
    env = { VLLM_CPU_OMP_THREADS_BIND = "0-7", NCCL_DEBUG = "WARN" }

`env` sets variables in the engine's environment (values take the same
`{variables}`); `hung_after_s` is how long an engine may hold requests without
producing a token before it is declared hung and replaced; `start_stall_s` is how
long a starting engine may write nothing and use no CPU (the agent's
`--engine-start-stall` unless set; 0: never); `probes = "quiet"`
(the default) adds `quiet_probes_args`, the engine's own option that keeps the
agent's and the gateway's `/health` and `/metrics` probes out of its access log
(about 100 lines a minute otherwise), where the engine has one. `load_path`
is where the engine's HTTP server counts the requests it holds (vLLM's `/load`, which
the built-in template turns on): a vLLM whose engine core is stopped keeps its
`/metrics` gauges at their last values, often 0, so only that count shows the
requests waiting in it: the agent reports the higher of the two as in flight, and a
request held there keeps the engine from reading as idle (and counts for the hung rule).

`api_key_env` names the environment variable that gives the engine its replica's
key (`VLLM_API_KEY` by default: vLLM, and the fake engine, then answer their API
paths only with `Authorization: Bearer KEY`); the agent sets it, never on the
command line, never in the log's header, and presents the key on every call it
makes to the engine. None: the engine takes no key from its environment (SGLang
reads one only from `--api-key`, a command line any local user can read), so it
runs without one, and its port serves anyone who reaches it.

`sleep` says whether and how the engine sleeps (vLLM's sleep mode: the built-in `vllm`
and `fake` templates have it). For a model whose spec asks for sleep, the agent adds
its `args` to the command and its `env` to the environment, and is the only caller of
its endpoints: `sleep_path?level=N`, `wake_path`, and after a level-2 wake (the
weights were dropped) `reload_path` with vLLM's `{"method": "reload_weights"}` and
`reset_cache_path`. A template without it never sleeps: the model stops instead.

`memory_share_arg` is the engine's option for the share of each card's memory it takes
(`--gpu-memory-utilization` for vLLM and the fake engine, `--mem-fraction-static` for
SGLang): a model whose spec sets `gpu_memory_share` gets it with that value, after its
`engine_args`, so the engines the agent lets be awake on one card fit there together.
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

VARIABLES: frozenset[str] = frozenset(
    {
        "python",
        "source",
        "model",
        "replica",
        "port",
        "host",
        "gpus",
        "gpu_uuids",
        "total_gpus",
        "nnodes",
        "rank",
        "leader_addr",
        "rendezvous_port",
    }
)
DEFAULT_RENDEZVOUS_PORT = 29500  # torch.distributed's customary port
_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")

Command = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
UrlPath = Annotated[str, StringConstraints(pattern=r"^/[^\s]*$", max_length=256)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
EnvValue = Annotated[str, StringConstraints(max_length=4096)]
DEFAULT_HUNG_AFTER_S = 60.0


class TemplateError(ValueError):
    """A template that cannot be used; the message says which and why."""


class SleepMode(BaseModel):
    """How an engine sleeps and wakes; the defaults are vLLM's (development endpoints,
    there only with VLLM_SERVER_DEV_MODE=1, and only with --enable-sleep-mode working)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    args: Command = "--enable-sleep-mode"
    env: dict[EnvName, EnvValue] = Field(
        default_factory=lambda: {"VLLM_SERVER_DEV_MODE": "1"}, max_length=64
    )
    sleep_path: UrlPath = "/sleep"  # POST, ?level=1 or 2
    wake_path: UrlPath = "/wake_up"  # POST
    reload_path: UrlPath | None = "/collective_rpc"  # POST after a level-2 wake
    reset_cache_path: UrlPath | None = "/reset_prefix_cache"  # POST after a level-2 wake
    # Asleep, its processes hold at most 1 - min_freed of what they held awake on each
    # card, or the sleep failed (llmgw.agent.sleep_check: measured, never taken on its word).
    min_freed: float = Field(default=0.9, gt=0, le=1)
    # What the engine prints when it refuses to start able to sleep on this machine
    # (vLLM's CPU build, config/model.py); seen in the log of a start that ended,
    # the agent starts it again without sleep mode (None: never).
    unsupported: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = (
        "Sleep mode is not supported on current platform"
    )


class EngineTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    command: Command
    leader_command: Command | None = None
    worker_command: Command | None = None
    health_path: UrlPath = "/health"
    metrics_path: UrlPath = "/metrics"
    worker_serves_http: bool = False
    executable: Command | None = None  # replaces the first word of every command
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=256)
    hung_after_s: float = Field(default=DEFAULT_HUNG_AFTER_S, gt=0, le=86400)
    # A start with no output and no CPU this long is stalled (None: the agent's
    # --engine-start-stall; 0: never).
    start_stall_s: float | None = Field(default=None, ge=0, le=86400)
    probes: Literal["quiet", "logged"] = "quiet"
    quiet_probes_args: Command | None = None  # the engine's option to not log the probes
    # Where the engine's HTTP server says how many requests it holds (vLLM's /load,
    # {"server_load": N}, with --enable-server-load-tracking): in flight, idleness and
    # the hung rule read it, since a stopped engine core no longer updates its gauges.
    # None: the /metrics gauges alone (vLLM without the option answers 0 here).
    load_path: UrlPath | None = None
    sleep: SleepMode | None = None  # None: this engine cannot sleep
    # The engine's option for the share of a card's memory it takes, given a model's
    # `gpu_memory_share` as its value (None: it has none, and such a model cannot start).
    memory_share_arg: (
        Annotated[str, StringConstraints(pattern=r"^--?[A-Za-z0-9][\w.-]*$")] | None
    ) = None
    # Where the engine reads its replica's key (None: it cannot take one so).
    api_key_env: EnvName | None = "VLLM_API_KEY"

    def command_for(self, rank: int, nnodes: int, sleeps: bool = False) -> str:
        """The command of this rank; `sleeps`: the model may sleep, and the engine can."""
        if nnodes <= 1:
            command = self.command
        else:
            leader = self.leader_command or self.command
            command = leader if rank == 0 else (self.worker_command or leader)
        if self.executable is not None:
            command = f"{self.executable} {_arguments(command)}"
        if self.probes == "quiet" and self.quiet_probes_args and self.serves_http(rank):
            command = f"{command} {self.quiet_probes_args}"
        if sleeps and self.sleep is not None:
            command = f"{command} {self.sleep.args}"
        return command

    def serves_http(self, rank: int) -> bool:
        return rank == 0 or self.worker_serves_http


def _arguments(command: str) -> str:
    """The command without its program: the words before the first option or {variable}
    (`vllm serve`, `python3`), which `executable` replaces."""
    words = shlex.split(command)
    first = next((i for i, w in enumerate(words) if w.startswith("-") or "{" in w), len(words))
    return shlex.join(words[max(1, first) :])


_VLLM = "vllm serve --model {source} --host {host} --port {port} --tensor-parallel-size {gpus}"
_VLLM_MULTI = (
    _VLLM + " --pipeline-parallel-size {nnodes} --nnodes {nnodes} --node-rank {rank}"
    " --master-addr {leader_addr} --master-port {rendezvous_port}"
)
_SGLANG = (
    "python3 -m sglang.launch_server --model-path {source} --host {host} --port {port}"
    " --served-model-name {model} --enable-metrics"
)
_SGLANG_MULTI = (
    _SGLANG + " --tp-size {total_gpus} --nnodes {nnodes} --node-rank {rank}"
    " --dist-init-addr {leader_addr}:{rendezvous_port}"
)
_QUIET_PROBES = "--disable-access-log-for-endpoints /health,/metrics,/load"
_LOAD = " --enable-server-load-tracking"  # /load counts the requests the server holds
_FAKE = "{python} -m llmgw.agent.fake_engine --host {host} --port {port} --model {model}" + _LOAD

BUILTIN_TEMPLATES: Mapping[str, EngineTemplate] = {
    # Multi-node vLLM without Ray (recent vLLM): workers run headless.
    "vllm": EngineTemplate(
        command=_VLLM + " --served-model-name {model}" + _LOAD,
        leader_command=_VLLM_MULTI + " --served-model-name {model}" + _LOAD,
        worker_command=_VLLM_MULTI + " --headless",
        quiet_probes_args=_QUIET_PROBES,
        load_path="/load",
        sleep=SleepMode(),
        memory_share_arg="--gpu-memory-utilization",
    ),
    # SGLang takes a key only as `--api-key` (argv): it runs keyless (see api_key_env).
    "sglang": EngineTemplate(
        command=_SGLANG + " --tp-size {gpus}",
        leader_command=_SGLANG_MULTI,
        api_key_env=None,
        memory_share_arg="--mem-fraction-static",
    ),
    "fake": EngineTemplate(
        command=_FAKE,
        worker_serves_http=True,
        quiet_probes_args=_QUIET_PROBES,
        load_path="/load",
        sleep=SleepMode(),
        memory_share_arg="--gpu-memory-utilization",
    ),
}


def render(command: str, values: Mapping[str, str]) -> list[str]:
    """Split `command` into words, then substitute `{name}` inside each word."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise TemplateError(f"cannot split {command!r} into words: {exc}") from exc
    if not words:
        raise TemplateError("the command is empty")
    return [_substitute(w, values, command) for w in words]


def _substitute(text: str, values: Mapping[str, str], where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = m.group(1)
        if name not in values:
            known = ", ".join(sorted(VARIABLES))
            raise TemplateError(f"unknown variable {{{name}}} in {where!r}; known: {known}")
        return values[name]

    return _FIELD.sub(sub, text)


def render_env(
    template: EngineTemplate, values: Mapping[str, str], sleeps: bool = False
) -> dict[str, str]:
    """The template's environment, `{variables}` substituted (values are not split);
    `sleeps`: with its sleep mode's variables under it."""
    env = dict(template.env)
    if sleeps and template.sleep is not None:
        env = {**template.sleep.env, **env}
    return {name: _substitute(value, values, value) for name, value in env.items()}


def _check(name: str, template: EngineTemplate) -> None:
    dummy = {v: "x" for v in VARIABLES}
    try:
        for rank, nnodes in ((0, 1), (0, 2), (1, 2)):
            render(template.command_for(rank, nnodes, sleeps=True), dummy)
        render_env(template, dummy, sleeps=True)
    except TemplateError as exc:
        raise TemplateError(f"engine {name!r}: {exc}") from exc


def coerce_templates(raw: Mapping[str, Any]) -> dict[str, EngineTemplate]:
    """Validate a name -> (command string | table | EngineTemplate) mapping."""
    out: dict[str, EngineTemplate] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
            raise TemplateError(f"engine name {name!r} must be 1-64 letters, digits, . _ -")
        try:
            if isinstance(spec, EngineTemplate):
                tpl = spec
            elif isinstance(spec, str):
                tpl = EngineTemplate(command=spec)
            elif isinstance(spec, Mapping) and "command" not in spec and name in BUILTIN_TEMPLATES:
                # Only what it gives changes: the built-in's arguments are kept.
                base = BUILTIN_TEMPLATES[name].model_dump(exclude_unset=False)
                tpl = EngineTemplate.model_validate({**base, **dict(spec)})
            elif isinstance(spec, Mapping):
                tpl = EngineTemplate.model_validate(dict(spec))
            else:
                raise TemplateError(f"engine {name!r}: expected a command string or a table")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()
            )
            raise TemplateError(f"engine {name!r}: {problems}") from exc
        _check(name, tpl)
        out[name] = tpl
    return out


def merged_templates(overrides: Mapping[str, Any] | None = None) -> dict[str, EngineTemplate]:
    """The built-ins, with operator templates added or replacing them by name."""
    return {**BUILTIN_TEMPLATES, **coerce_templates(overrides or {})}


def load_templates(path: Path | str) -> dict[str, EngineTemplate]:
    """Read operator templates from TOML or YAML (by extension); not merged with built-ins."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TemplateError(f"cannot read engine templates {path}: {exc.strerror}") from exc
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise TemplateError(f"{path}: engine templates must be a .toml, .yaml or .yml file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise TemplateError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from exc
    if isinstance(data, Mapping) and "engines" in data:
        data = data["engines"]
    if not isinstance(data, Mapping):
        raise TemplateError(
            f"{path}: expected a table of engines (name = command, or [engines.NAME])"
        )
    try:
        return coerce_templates(data)
    except TemplateError as exc:
        raise TemplateError(f"{path}: {exc}") from exc


def python_executable() -> str:
    """The interpreter running the agent: what `{python}` means (the fake engine uses it)."""
    return sys.executable
