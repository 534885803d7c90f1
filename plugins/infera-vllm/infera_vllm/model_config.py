"""What the adapter can learn from a model's ``config.json`` before vLLM starts.

vLLM 0.32 refuses external-LB data parallel (``--data-parallel-size N`` with
``--data-parallel-rank K`` or ``--data-parallel-external-lb``) for a model that is not
mixture-of-experts (``EngineArgs.create_engine_config``: "Non-MoE models do not support
external data parallel mode"). vLLM calls a model MoE when ``ModelConfig.is_moe``:
``get_num_experts() > 0``, the first of ``num_experts``, ``moe_num_experts``,
``n_routed_experts``, ``num_local_experts`` on the (text) config, else the largest
``n_routed_experts`` of a ``block_configs`` entry whose ``block_type`` is ``moe``.

The adapter reads ``config.json`` from the model directory, or from the Hugging Face cache
for a hub id (never the network), and refuses the launch first, in one line, when the
model is dense; when it cannot tell, it warns once and lets vLLM decide.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from infera_core.errors import EngineError

log = logging.getLogger("infera_vllm.model_config")

EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
"""vLLM 0.32 ``ModelArchConfigConvertorBase.get_num_experts``, in its order."""
TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config", "thinker_config")
"""Where multimodal configs keep the language model's config (``get_text_config``)."""
REFUSAL = "Non-MoE models do not support external data parallel mode"
"""vLLM 0.32's message for the same refusal (``vllm/engine/arg_utils.py``)."""


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, as ``huggingface_hub`` resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return Path(home) / "hub"


def find_config(model: str) -> Path | None:
    """The ``config.json`` of ``model`` (a directory, or a hub id in the local cache), if any."""
    local = Path(model).expanduser()
    if local.is_dir():
        found = local / "config.json"
        return found if found.is_file() else None
    if model.count("/") != 1 or model.startswith(("/", ".", "~")):
        return None
    repo = hub_cache_dir() / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        found = repo / "snapshots" / ref.read_text().strip() / "config.json"
        if found.is_file():
            return found
    snapshots = sorted((repo / "snapshots").glob("*/config.json")) if repo.is_dir() else []
    return snapshots[-1] if len(snapshots) == 1 else None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    for key in TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, dict):
            return _text_config(sub) if key == "thinker_config" else sub
    return config


def num_experts(config: dict[str, Any]) -> int:
    """The expert count vLLM 0.32 derives from ``config`` (0: a dense model)."""
    text = _text_config(config)
    for key in EXPERT_KEYS:
        if key in text:
            value = text[key]
            if isinstance(value, list):
                value = value[0] if value else 0
            if value:
                return int(value)
            break
    blocks = text.get("block_configs") or []
    return max(
        (
            int(b.get("n_routed_experts") or 0)
            for b in blocks
            if isinstance(b, dict) and b.get("block_type") == "moe"
        ),
        default=0,
    )


def _hints_moe(config: dict[str, Any]) -> bool:
    """Whether a config without an expert count still looks MoE (a class default may supply it)."""
    names = [str(config.get("model_type", ""))] + [str(a) for a in config.get("architectures") or []]
    return "expert" in json.dumps(config).lower() or any("moe" in n.lower() for n in names)


def is_moe(model: str) -> bool | None:
    """True (MoE), False (surely dense) or None (no readable ``config.json`` here, or unclear)."""
    path = find_config(model)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text())
        if not isinstance(config, dict):
            return None
        if num_experts(config) > 0:
            return True
    except (OSError, ValueError, TypeError):
        return None
    return None if _hints_moe(config) else False


def check_external_dp(model: str, dp_size: int) -> None:
    """Refuse ``--dp-size`` > 1 for a dense model, as vLLM would after loading it."""
    if dp_size <= 1:
        return
    moe = is_moe(model)
    if moe is None:
        log.warning(
            "--dp-size %d: cannot tell whether %s is a mixture-of-experts model (no config.json "
            "with an expert count, locally or in the Hugging Face cache); vLLM refuses external "
            "data parallel for dense models ('%s')",
            dp_size,
            model,
            REFUSAL,
        )
    elif not moe:
        raise EngineError(
            f"--dp-size {dp_size}: {model} is a dense (non-MoE) model and vLLM refuses external "
            f"data parallel (--data-parallel-size/--data-parallel-rank) for it ('{REFUSAL}'); "
            f"run {dp_size} separate workers without --dp-size instead"
        )
