"""Which adapter specs the controller takes, and what a base's engine arguments say
of adapters (issue 33).

An adapter names its base model; the base's engine must load adapters at run time
(vLLM: `--enable-lora`, the agent adds `VLLM_ALLOW_RUNTIME_LORA_UPDATING`), and
holds at most `--max-cpu-loras` of them resident (vLLM's default: `--max-loras`,
whose default is 1). A spec set that breaks a rule is refused whole (400), so a
bad file changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.errors import BadRequest
from llmgw.wire import AdapterSpec, ModelSpec

ENABLE = "--enable-lora"
DEFAULT_MAX_LORAS = 1  # vLLM's


def _arg(args: Sequence[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` (the last one given, as argparse takes)."""
    found = None
    for i, word in enumerate(args):
        if word == name and i + 1 < len(args):
            found = args[i + 1]
        elif word.startswith(name + "="):
            found = word.split("=", 1)[1]
    return found


def loads_adapters(spec: ModelSpec) -> bool:
    return ENABLE in spec.engine_args


def _int_arg(spec: ModelSpec, name: str) -> int | None:
    raw = _arg(spec.engine_args, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def adapter_slots(spec: ModelSpec) -> int:
    """How many adapters one replica of `spec` holds resident (its --max-cpu-loras)."""
    max_loras = _int_arg(spec, "--max-loras") or DEFAULT_MAX_LORAS
    return _int_arg(spec, "--max-cpu-loras") or max_loras


def check_adapters(
    models: Mapping[str, ModelSpec], adapters: Mapping[str, AdapterSpec], new: Sequence[str]
) -> None:
    """Refuse (400) a declared set where one of `new` (adapter or model names just
    applied) breaks a rule: an unknown base, a base that cannot load adapters, an
    adapter named as a model."""
    problems = []
    for name in sorted(set(new)):
        if name in models and name in adapters:
            problems.append(f"{name!r} names both a model and an adapter: rename the adapter")
    for name, spec in sorted(adapters.items()):
        base = models.get(spec.base)
        if name not in new and (base is None or spec.base not in new):
            continue  # neither it nor its base changed here
        if spec.base in adapters:
            problems.append(f"adapter {name}: its base {spec.base!r} is an adapter, not a model")
        elif base is None:
            problems.append(
                f"adapter {name}: no model named {spec.base!r} is declared: declare the base "
                "model first (in the same file is fine)"
            )
        elif not loads_adapters(base):
            problems.append(
                f"adapter {name}: model {spec.base}'s engine cannot load adapters: add "
                f"{ENABLE} (and --max-cpu-loras N, how many one replica holds) to its "
                "engine_args"
            )
    if problems:
        raise BadRequest("; ".join(problems))


def check_delete(name: str, adapters: Mapping[str, AdapterSpec]) -> None:
    """A model with adapters declared on it is not deleted from under them."""
    users = sorted(a for a, spec in adapters.items() if spec.base == name)
    if users:
        raise BadRequest(
            f"model {name} is the base of adapter(s) {', '.join(users)}: delete them first"
        )
