"""Our memory estimate beside the two estimators users run today and a published figure, for real configurations.

- accelerate estimate-memory: its "Training using Adam" column of the float16 row (the largest of model, gradients,
  optimizer and step: the whole model on one GPU, no activations), computed by accelerate's own functions on the
  model built empty from the same config.json exactly as its CLI builds it after downloading the config (AutoModel,
  in fp32);
- DeepSpeed's ZeRO estimators (estimate_zero2/zero3_model_states_mem_needs, its default buffer factor 1.5): model
  states per GPU for the ZeRO rows, no activations;
- a published figure where a maintained source gives one for the same configuration (named in the row).
The configs are the models' published config.json (tests/data/model_configs). Usage:
  .venv/bin/python benchmarks/memory_estimates.py [--out FILE]   (prints a Markdown table; --out writes JSON)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.fit import GIB, ModelShape, estimate  # noqa: E402
from tests.builders import make_job  # noqa: E402

CONFIGS = ROOT / "tests" / "data" / "model_configs"
GB = 1e9

# (label, model config, spec overrides, published figure (GB, source) or None)
ROWS: list[tuple[str, str, dict, tuple[float, str] | None]] = [
    ("full, 1 GPU, 8k packed, micro 1, GC, paged 8-bit AdamW, flash", "llama-3.1-8b",
     {"spec.method.type": "full", "spec.data.packing": True, "spec.data.maxLength": 8192,
      "spec.training.perDeviceTrainBatchSize": 1, "spec.training.gradientCheckpointing": True,
      "spec.training.optim": "paged_adamw_8bit",
      "spec.model.attnImplementation": "flash_attention_2"},
     (48.0, "axolotl examples/llama-3/README.md (fft-8b.yaml): single GPU @ 48GB")),
    ("LoRA r16, 1 GPU, 2k, micro 4", "llama-3.1-8b", {"spec.method.type": "lora"}, None),
    ("LoRA r16, 1 GPU, 2k, micro 4, GC", "llama-3.1-8b",
     {"spec.method.type": "lora", "spec.training.gradientCheckpointing": True}, None),
    ("QLoRA r16, 1 GPU, 4k, micro 1, GC", "llama-3.1-8b",
     {"spec.method.type": "qlora", "spec.model.quantization": "4bit", "spec.data.maxLength": 4096,
      "spec.training.perDeviceTrainBatchSize": 1, "spec.training.gradientCheckpointing": True}, None),
    ("full, ZeRO-2 on 8 GPUs, 4k, micro 2, GC", "llama-3.1-8b",
     {"spec.method.type": "full", "spec.distributed.gpusPerNode": 8, "spec.distributed.strategy": "deepspeed",
      "spec.distributed.deepspeed": {"zeroStage": 2}, "spec.data.maxLength": 4096,
      "spec.training.perDeviceTrainBatchSize": 2, "spec.training.gradientCheckpointing": True}, None),
    ("full, ZeRO-3 on 2x8 GPUs, 8k, micro 1, GC", "llama-3.1-8b",
     {"spec.method.type": "full", "spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8,
      "spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {"zeroStage": 3},
      "spec.data.maxLength": 8192, "spec.training.perDeviceTrainBatchSize": 1,
      "spec.training.gradientCheckpointing": True}, None),
    ("LoRA r16, ZeRO-3 on 2x8 GPUs, 4k, micro 1, GC", "llama-3.1-70b",
     {"spec.method.type": "lora", "spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8,
      "spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {"zeroStage": 3},
      "spec.data.maxLength": 4096, "spec.training.perDeviceTrainBatchSize": 1,
      "spec.training.gradientCheckpointing": True}, None),
    ("full, ZeRO-3 + CPU optimizer on 2x8 GPUs, 4k, micro 1, GC", "llama-3.1-70b",
     {"spec.method.type": "full", "spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8,
      "spec.distributed.strategy": "deepspeed",
      "spec.distributed.deepspeed": {"zeroStage": 3, "offloadOptimizer": "cpu"}, "spec.data.maxLength": 4096,
      "spec.training.perDeviceTrainBatchSize": 1, "spec.training.gradientCheckpointing": True}, None),
    ("LoRA r64, 1 GPU, 8k, micro 1, GC", "qwen2.5-7b",
     {"spec.method.type": "lora", "spec.method.lora": {"r": 64}, "spec.data.maxLength": 8192,
      "spec.training.perDeviceTrainBatchSize": 1, "spec.training.gradientCheckpointing": True}, None),
    ("QLoRA r16, 1 GPU, 4k, micro 1, GC", "qwen2.5-32b",
     {"spec.method.type": "qlora", "spec.model.quantization": "4bit", "spec.data.maxLength": 4096,
      "spec.training.perDeviceTrainBatchSize": 1, "spec.training.gradientCheckpointing": True}, None),
    ("full, FSDP on 8 GPUs, 4k, micro 1, GC", "mistral-7b-v0.3",
     {"spec.method.type": "full", "spec.distributed.gpusPerNode": 8, "spec.distributed.strategy": "fsdp",
      "spec.data.maxLength": 4096, "spec.training.perDeviceTrainBatchSize": 1,
      "spec.training.gradientCheckpointing": True}, None),
    ("full, FSDP with fsdp.activationCheckpointing on 2x4 GPUs, 4k packed, micro 4 (examples/cpt-fsdp.yaml)",
     "llama-3.2-1b",
     {"spec.method.type": "full", "spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 4,
      "spec.distributed.strategy": "fsdp", "spec.distributed.fsdp": {"activationCheckpointing": True},
      "spec.data.format": "text", "spec.data.blockSize": 4096, "spec.training.perDeviceTrainBatchSize": 4}, None),
    ("full, 1 GPU, 2k, micro 4", "qwen2.5-0.5b", {"spec.method.type": "full"}, None),
    ("LoRA r16 (dropout 0), ZeRO-3 on 8 GPUs, 4k, micro 1, GC", "mixtral-8x7b",
     {"spec.method.type": "lora", "spec.method.lora": {"dropout": 0.0}, "spec.distributed.gpusPerNode": 8,
      "spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {"zeroStage": 3},
      "spec.data.maxLength": 4096, "spec.training.perDeviceTrainBatchSize": 1,
      "spec.training.gradientCheckpointing": True}, None),
    ("QLoRA r16 (dropout 0), 1 GPU, 4k, micro 1, GC", "mixtral-8x7b",
     {"spec.method.type": "qlora", "spec.model.quantization": "4bit", "spec.method.lora": {"dropout": 0.0},
      "spec.data.maxLength": 4096, "spec.training.perDeviceTrainBatchSize": 1,
      "spec.training.gradientCheckpointing": True}, None),
    ("LoRA r16 (dropout 0), 1 GPU, 4k, micro 1, GC", "deepseek-v2-lite",
     {"spec.method.type": "lora", "spec.method.lora": {"dropout": 0.0}, "spec.data.maxLength": 4096,
      "spec.training.perDeviceTrainBatchSize": 1, "spec.training.gradientCheckpointing": True}, None),
    ("full, ZeRO-3 on 8 GPUs, 4k, micro 1, GC", "deepseek-v2-lite",
     {"spec.method.type": "full", "spec.distributed.gpusPerNode": 8, "spec.distributed.strategy": "deepspeed",
      "spec.distributed.deepspeed": {"zeroStage": 3}, "spec.data.maxLength": 4096,
      "spec.training.perDeviceTrainBatchSize": 1, "spec.training.gradientCheckpointing": True}, None),
    ("LoRA r16, 1 GPU, bf16 weights, eager, 4k, micro 1, GC", "gemma-2-9b",
     {"spec.method.type": "lora", "spec.model.attnImplementation": "eager", "spec.model.dtype": "bfloat16",
      "spec.data.maxLength": 4096,
      "spec.training.perDeviceTrainBatchSize": 1, "spec.training.gradientCheckpointing": True}, None),
]


def accelerate_training_bytes(config: dict) -> float:
    """accelerate estimate-memory's "Training using Adam" of its float16 row, as its CLI computes it
    (accelerate/commands/estimate.py: gather_data): the model built empty by AutoModel (the base model, no LM head)
    in fp32 whatever the checkpoint's dtype, then the largest of model, gradients, optimizer and step for mixed
    precision (the optimizer's two fp32 states)."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoConfig, AutoModel

    hf_config = AutoConfig.for_model(**config)
    with init_empty_weights():
        model = AutoModel.from_config(hf_config, dtype=torch.float32)
    total, _ = calculate_maximum_sizes(model)
    return float(max(estimate_training_usage(total, "float16").values()))


def deepspeed_states_bytes(shape: ModelShape, spec) -> float | None:
    """DeepSpeed's ZeRO-2/3 model-states estimate per GPU (per process for a CPU job); None outside DeepSpeed."""
    d = spec.distributed
    if d.strategy != "deepspeed" or d.deepspeed is None or d.deepspeed.zero_stage not in (2, 3):
        return None
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    offload = d.deepspeed.offload_optimizer != "none"
    if d.deepspeed.zero_stage == 2:
        _, gpu = estimate_zero2_model_states_mem_needs(shape.parameters, d.processes_per_node, d.num_nodes,
                                                      cpu_offload=offload)
    else:
        largest = max(shape.vocab * shape.hidden, shape.layer_params)
        _, gpu, _ = estimate_zero3_model_states_mem_needs(shape.parameters, largest, d.processes_per_node,
                                                         d.num_nodes, cpu_offload=offload, cpu_offload_params=False)
    return float(gpu)


def measure() -> list[dict]:
    rows = []
    for label, name, overrides, published in ROWS:
        config = json.loads((CONFIGS / f"{name}.json").read_text())
        spec = validate_job(make_job({"spec.model.name": name, "spec.data.maxLength": 2048,
                                      "spec.training.perDeviceTrainBatchSize": 4, "spec.distributed.gpusPerNode": 1,
                                      **overrides})).spec
        shape = ModelShape.from_config(config)
        est = estimate(spec, shape)
        ds = deepspeed_states_bytes(shape, spec)
        states = sum(v for k, v in est.terms.items() if k in ("weights", "gradients", "optimizer states",
                                                             "DDP gradient buckets"))
        rows.append({"model": name, "configuration": label, "ours_needed_gb": est.needed / GB,
                     "ours_states_gb": states / GB, "ours_largest": est.largest,
                     "accelerate_gb": accelerate_training_bytes(config) / GB,
                     "deepspeed_states_gb": None if ds is None else ds / GB,
                     "published_gb": published[0] if published else None,
                     "published_source": published[1] if published else None,
                     "ours_needed_gib": est.needed / GIB})
    return rows


def markdown(rows: list[dict]) -> str:
    def gb(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = ["| model | configuration | ours: needed per GPU (GB) | ours: model states only | largest term | "
             "accelerate estimate-memory (training, 1 GPU) | DeepSpeed ZeRO estimator (states per GPU) | published |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        published = f"{r['published_gb']:.0f} ({r['published_source']})" if r["published_gb"] else "-"
        lines.append(f"| {r['model']} | {r['configuration']} | {gb(r['ours_needed_gb'])} | {gb(r['ours_states_gb'])}"
                     f" | {r['ours_largest']} | {gb(r['accelerate_gb'])} | {gb(r['deepspeed_states_gb'])} | "
                     f"{published} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rows = measure()
    print(markdown(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
