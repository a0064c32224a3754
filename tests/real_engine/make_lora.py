"""Make a tiny random-weight LoRA for make_model.py's Llama (run with vLLM's Python).

`python make_lora.py DIR [RANK]`: PEFT's layout, `adapter_config.json` and
`adapter_model.safetensors`, for q_proj and v_proj of both layers (hidden 128);
rank 8 unless told; nothing downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HIDDEN, LAYERS = 128, 2  # make_model.py's


def main(out: Path, rank: int = 8) -> None:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(rank)
    tensors = {}
    for layer in range(LAYERS):
        for proj in ("q_proj", "v_proj"):
            stem = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, HIDDEN) * 0.01
            tensors[f"{stem}.lora_B.weight"] = torch.randn(HIDDEN, rank) * 0.01
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "base_model_name_or_path": "tiny-llama",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(out / "adapter_model.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 8)
