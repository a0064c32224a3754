"""Small but valid model directories, for the demo, the tests and the bench.

Real safetensors layout (8-byte little-endian header length, JSON header,
data), so the completeness checks treat them exactly like real weights.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def write_safetensors(path: Path, tensors: int = 2, tensor_bytes: int = 64) -> int:
    """Write a valid safetensors file of `tensors` float32 tensors; returns its size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    count = max(1, tensor_bytes // 4)
    for i in range(tensors):
        header[f"layer.{i}.weight"] = {
            "dtype": "F32",
            "shape": [count],
            "data_offsets": [offset, offset + count * 4],
        }
        offset += count * 4
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.write(b"\0" * offset)
    return 8 + len(raw) + offset


def write_model(
    directory: Path, shards: int = 1, tensors: int = 2, tensor_bytes: int = 64
) -> list[Path]:
    """A Hugging Face style model directory: config.json plus safetensors.

    One shard writes `model.safetensors`; more write numbered shards and the
    index that names them. Returns the weight files written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if shards == 1:
        path = directory / "model.safetensors"
        write_safetensors(path, tensors, tensor_bytes)
        return [path]
    files = []
    weight_map: dict[str, str] = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        write_safetensors(directory / name, tensors, tensor_bytes)
        files.append(directory / name)
        for t in range(tensors):
            weight_map[f"shard{i}.layer.{t}.weight"] = name
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return files


def write_adapter(directory: Path, base: str = "m", rank: int = 8) -> Path:
    """A PEFT LoRA adapter directory: adapter_config.json and adapter_model.safetensors."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": base,
        "bias": "none",
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    write_safetensors(directory / "adapter_model.safetensors")
    return directory
