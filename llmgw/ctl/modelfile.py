"""Models from a YAML or TOML file (`ctl apply -f`), and what no node offers.

pydantic, yaml and tomllib are imported here, on `apply` only: a one-shot read
does not pay for them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmgw.errors import UsageError

if TYPE_CHECKING:
    from llmgw.wire import AdapterSpec, ModelSpec


def load_specs(path: str) -> list[ModelSpec]:
    """Models from YAML or TOML (a list, or a mapping with a `models` list); - is stdin."""
    return load_spec_file(path)[0]


def load_spec_file(path: str) -> tuple[list[ModelSpec], list[AdapterSpec]]:
    """Models and LoRA adapters (an entry with `base:`) from YAML or TOML; - is stdin."""
    import tomllib

    import yaml
    from pydantic import ValidationError

    from llmgw.wire import ModelSpecList

    where = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    toml = path.endswith(".toml")
    try:
        data: Any = tomllib.loads(text) if toml else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{where} is not valid {'TOML' if toml else 'YAML'}: {exc}") from exc
    if isinstance(data, list):
        data = {"models": data}
    if not isinstance(data, dict) or "models" not in data:
        raise UsageError(f"{where} should hold a list of models (or a `models:` list)")
    entries = data["models"]
    if not isinstance(entries, list):
        raise UsageError(f"{where}: `models` should be a list")
    # An entry with `base:` is an adapter; positions kept for the error messages.
    is_adapter = [isinstance(e, dict) and "base" in e for e in entries]
    try:
        parsed = ModelSpecList.model_validate(
            {
                "models": [e for e, a in zip(entries, is_adapter, strict=True) if not a],
                "adapters": [e for e, a in zip(entries, is_adapter, strict=True) if a],
            }
        )
        specs, adapters = list(parsed.models), list(parsed.adapters)
    except ValidationError as exc:
        lines = [f"{where} has invalid model specs:"]
        for e in exc.errors(include_url=False, include_input=False):
            loc = list(e["loc"])
            if len(loc) >= 2 and loc[0] in ("models", "adapters") and isinstance(loc[1], int):
                kind = loc[0] == "adapters"
                model = [e for e, a in zip(entries, is_adapter, strict=True) if a == kind][loc[1]]
                name = model.get("name") if isinstance(model, dict) else None
                at = f"model {name or '#' + str(loc[1] + 1)}"
                loc = loc[2:]
            else:
                at = "file"
            lines.append(f"  {at}: {'.'.join(map(str, loc)) or '(entry)'}: {e['msg']}")
        raise UsageError("\n".join(lines)) from exc
    seen: set[str] = set()
    for name in [s.name for s in specs] + [a.name for a in adapters]:
        if name in seen:
            raise UsageError(f"{where} declares {name} twice")
        seen.add(name)
    return specs, adapters


def apply_warnings(specs: Sequence[ModelSpec], summary: dict[str, Any]) -> list[str]:
    """What no reporting node offers: applied all the same (a node may join
    later), but said, so a typo is not found an hour later as a short model."""
    classes = sorted({g["class"] for g in summary.get("gpus", []) if g.get("total")})
    engines = summary.get("engines")  # engine -> nodes whose agent has it
    warnings = []
    for spec in specs:
        if spec.gpu_class and spec.gpu_class not in classes:
            warnings.append(
                f"model {spec.name} wants GPU class {spec.gpu_class}, which no reporting node "
                f"has (classes reported: {', '.join(classes) or 'none'}); it stays short "
                "until such a node reports"
            )
        if isinstance(engines, dict) and engines and spec.engine not in engines:
            warnings.append(
                f"model {spec.name} uses engine {spec.engine!r}, which no reporting node's "
                f"agent knows (engines reported: {', '.join(sorted(engines))}); add it to "
                "the agents' --engine-templates, or fix the spec"
            )
    return warnings
