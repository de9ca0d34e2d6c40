"""Task adapters: LoRA weights per task (jina-embeddings-v3's `retrieval.query`, `retrieval.passage`, ...)
compiled into one graph and chosen per row at run time.

A folder's adapters are PEFT LoRA folders beside its weights, one per task and named by it
(`retrieval.query/adapter_config.json` + `adapter_model.safetensors`, as `PeftModel.save_pretrained` writes
them); compile/lora.py adds them to the exported model. The graph holds every task's low-rank matrices and takes
a per-row `adapter` input (0: none, i: the i-th task), so rows of different tasks share a batch.

Measured against the alternative, one graph per task with its adapter merged (as fast as the bare model):
a base-sized jina-v3 with rank-4 adapters on every projection and the word embeddings runs at 92% of the bare
model's speed on OpenVINO bf16, 94% on f32, 85% on onnxruntime (2-core EPYC). Merged graphs would need a copy
of the weights per task (jina-v3: five of 2.3 GB) or batches split by task; one graph is the choice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from encoderrt.compile.errors import InputError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class TaskAdapter:
    name: str
    """The task, as a request names it (its prompt_name)."""
    folder: Path
    scaling: float
    """PEFT's lora_alpha / r (or / sqrt(r) with rsLoRA), folded into B at export."""


def find_adapters(weights_folder: Path) -> tuple[TaskAdapter, ...]:
    """The folder's task adapters, by name; a LoRA variant the graph would compute differently is refused."""
    adapters = []
    for folder in sorted(p for p in weights_folder.iterdir() if (p / ADAPTER_CONFIG).is_file()):
        config_path = folder / ADAPTER_CONFIG
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"cannot read {config_path}: {exc}") from None
        problem = _unsupported(config)
        if problem:
            raise InputError(f"{config_path}: {problem}; encoderrt compiles plain LoRA task adapters")
        if not (folder / ADAPTER_WEIGHTS).is_file():
            raise InputError(f"no {ADAPTER_WEIGHTS} in {folder}: a task adapter needs its weights")
        rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        adapters.append(TaskAdapter(folder.name, folder, scaling))
    return tuple(adapters)


def _unsupported(config: dict[str, Any]) -> str | None:
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        return f"peft_type {config.get('peft_type') if isinstance(config, dict) else None!r} is not LORA"
    if not isinstance(config.get("r"), int) or config["r"] < 1:
        return f"r {config.get('r')!r} is not a positive integer"
    for name in ("use_dora", "fan_in_fan_out", "lora_bias", "use_qalora", "modules_to_save", "layers_to_transform",
                 "rank_pattern", "alpha_pattern", "trainable_token_indices", "target_parameters", "layer_replication"):
        if config.get(name):
            return f"{name} is set"
    if config.get("bias", "none") != "none":
        return f"bias is {config['bias']!r}"
    return None
