"""Is a LoRA adapter directory complete? (issue 33; DESIGN.md storage rule 2)

An adapter is present only when its `adapter_config.json` parses and names a LoRA
(`peft_type` LORA, a positive rank `r`) and its weight file is whole:
`adapter_model.safetensors` whose header and size agree (llmgw.agent.weights), or
`adapter_model.bin` in torch.save's zip format with its central directory. A
download still running (`*.incomplete`) is not an adapter yet. Otherwise a
replica's engine would be told to load it and refuse.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from llmgw.agent.weights import FileCache, check_safetensors

CONFIG = "adapter_config.json"
SAFETENSORS = "adapter_model.safetensors"
PICKLE = "adapter_model.bin"


@dataclass(frozen=True)
class AdapterVerdict:
    complete: bool
    reason: str | None = None  # why not, when not
    rank: int = 0
    base: str | None = None  # base_model_name_or_path, as the adapter says
    size_bytes: int = 0


def is_adapter_dir(directory: Path) -> bool:
    return os.path.isfile(os.path.join(directory, CONFIG))


def _check_zip(path: str, size: int) -> str | None:
    name = os.path.basename(path)
    try:
        with zipfile.ZipFile(path) as z:
            z.infolist()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{name}: not a whole torch.save archive ({exc}): download not finished?"
    return None


def check_adapter_dir(directory: Path, cache: FileCache) -> AdapterVerdict:
    try:
        names = set(os.listdir(directory))
    except OSError as exc:
        return AdapterVerdict(False, f"cannot list the directory: {exc.strerror or exc}")
    partial = sorted(n for n in names if n.endswith(".incomplete"))
    if partial:
        return AdapterVerdict(False, f"download in progress: {partial[0]} is still there")
    try:
        config = json.loads((directory / CONFIG).read_text())
    except OSError as exc:
        return AdapterVerdict(False, f"{CONFIG}: unreadable ({exc.strerror or exc})")
    except (ValueError, UnicodeDecodeError):
        return AdapterVerdict(False, f"{CONFIG}: not valid JSON (truncated?)")
    if not isinstance(config, dict):
        return AdapterVerdict(False, f"{CONFIG}: not a JSON object")
    kind = config.get("peft_type")
    if not isinstance(kind, str) or kind.upper() != "LORA":
        return AdapterVerdict(False, f"{CONFIG}: peft_type is {kind!r}, not LORA")
    rank = config.get("r")
    if type(rank) is not int or not 0 < rank <= 65_536:
        return AdapterVerdict(False, f"{CONFIG}: the rank r is {rank!r}, not a positive integer")
    base = config.get("base_model_name_or_path")
    base = base[:256] if isinstance(base, str) and base else None
    for weights, check in ((SAFETENSORS, check_safetensors), (PICKLE, _check_zip)):
        if weights not in names:
            continue
        path = str(directory / weights)
        try:
            st = os.stat(path)
        except OSError as exc:
            return AdapterVerdict(False, f"{weights}: {exc.strerror or exc}")
        problem = cache.get(path, st, check)
        if problem is not None:
            return AdapterVerdict(False, str(problem))
        return AdapterVerdict(True, None, rank, base, st.st_size)
    return AdapterVerdict(False, f"{CONFIG} but no {SAFETENSORS} or {PICKLE}")
