"""Make a random-weight LoRA adapter (PEFT layout: ``adapter_config.json`` +
``adapter_model.safetensors``) for the tiny Llama of ``make_tiny_model.py``, offline.

Run with the real-vLLM venv's python (it has torch and safetensors):
``python make_tiny_lora.py <tiny model dir> <out dir>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(model: str, out: str) -> None:
    import torch  # type: ignore[import-not-found]
    from safetensors.torch import save_file  # type: ignore[import-not-found]

    config = json.loads((Path(model) / "config.json").read_text())
    hidden, layers, rank = int(config["hidden_size"]), int(config["num_hidden_layers"]), 8
    torch.manual_seed(0)
    tensors = {}
    for i in range(layers):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, dtype=torch.float32) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(hidden, rank, dtype=torch.float32) * 0.01
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    adapter = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": model,
        "r": rank,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (dest / "adapter_config.json").write_text(json.dumps(adapter, indent=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
