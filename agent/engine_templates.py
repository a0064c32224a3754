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
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

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


class TemplateError(ValueError):
    """A template that cannot be used; the message says which and why."""


class EngineTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    command: Command
    leader_command: Command | None = None
    worker_command: Command | None = None
    health_path: UrlPath = "/health"
    metrics_path: UrlPath = "/metrics"
    worker_serves_http: bool = False

    def command_for(self, rank: int, nnodes: int) -> str:
        if nnodes <= 1:
            return self.command
        leader = self.leader_command or self.command
        return leader if rank == 0 else (self.worker_command or leader)

    def serves_http(self, rank: int) -> bool:
        return rank == 0 or self.worker_serves_http


_VLLM = "vllm serve {source} --host {host} --port {port} --tensor-parallel-size {gpus}"
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
_FAKE = "{python} -m agent.fake_engine --host {host} --port {port} --model {model}"

BUILTIN_TEMPLATES: Mapping[str, EngineTemplate] = {
    # Multi-node vLLM without Ray (recent vLLM): workers run headless.
    "vllm": EngineTemplate(
        command=_VLLM + " --served-model-name {model}",
        leader_command=_VLLM_MULTI + " --served-model-name {model}",
        worker_command=_VLLM_MULTI + " --headless",
    ),
    "sglang": EngineTemplate(
        command=_SGLANG + " --tp-size {gpus}",
        leader_command=_SGLANG_MULTI,
    ),
    "fake": EngineTemplate(command=_FAKE, worker_serves_http=True),
}


def render(command: str, values: Mapping[str, str]) -> list[str]:
    """Split `command` into words, then substitute `{name}` inside each word."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise TemplateError(f"cannot split {command!r} into words: {exc}") from exc
    if not words:
        raise TemplateError("the command is empty")

    def sub(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = m.group(1)
        if name not in values:
            known = ", ".join(sorted(VARIABLES))
            raise TemplateError(f"unknown variable {{{name}}} in {command!r}; known: {known}")
        return values[name]

    return [_FIELD.sub(sub, w) for w in words]


def _check(name: str, template: EngineTemplate) -> None:
    dummy = {v: "x" for v in VARIABLES}
    for cmd in (template.command, template.leader_command, template.worker_command):
        if cmd is not None:
            try:
                render(cmd, dummy)
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
