"""What GRPO adds to one training process's memory (estimate.py calls this for method.objective grpo). TRL's GRPOTrainer
generates the next batch in the training process, between optimizer steps: the completions of a whole generation
batch (perDeviceTrainBatchSize x gradientAccumulationSteps per process) at once, each up to data.maxLength tokens
with its prompt, with a KV cache of 2 x layers x kv heads x head dim values per token. No activation of a training
step is alive then: generation is a phase of its own (estimate.py), holding the resident states and this term, and
sets the peak only where it needs more than the step's own phases. Under ZeRO-3 TRL gathers the whole model for
generation (ds3_gather_for_generation). With beta > 0 the KL needs the reference model: a frozen copy for a full
fine-tune; under LoRA a new adapter's reference is the base with the adapter off (nothing held), and a continued one
(lora.initFrom) a frozen copy of the adapter it starts from (TRL's "ref" adapter)."""

from typing import Any

from ..api.distributed import DeepSpeedSpec
from .shape import ModelShape

GENERATION_TERM = "generation (KV cache, decoding logits)"


def generation_batch(spec: Any) -> int:
    """Completions each process generates at once (TRL's generation_batch_size / processes)."""
    return spec.training.per_device_train_batch_size * spec.training.gradient_accumulation_steps


def kv_cache_bytes(spec: Any, shape: ModelShape, compute: int) -> float:
    return generation_batch(spec) * spec.data.max_length * shape.layers * 2 * shape.kv_width * compute


def grpo_terms(spec: Any, shape: ModelShape, compute: int, lora_parameters: int) -> tuple[dict[str, float], list[str]]:
    """(terms to add, notes): what generating a batch holds, and the reference."""
    grpo, dist = spec.method.grpo, spec.distributed
    world = dist.world_size
    zero3 = dist.strategy == "deepspeed" and (dist.deepspeed or DeepSpeedSpec()).zero_stage == 3
    out: dict[str, float] = {}
    notes: list[str] = []
    if grpo.generation_backend == "vllm":
        notes.append(f"vLLM generates in its own share of each GPU (method.grpo.vllmGpuMemoryUtilization "
                     f"{grpo.vllm_gpu_memory_utilization:g}): training is checked against the rest")
    else:
        # One decoding step's fp32 logits, and the sampler's copy of them.
        logits = generation_batch(spec) * shape.vocab * 4 * 2
        gathered = shape.parameters * compute * (world - 1) / world if zero3 and world > 1 else 0.0
        out[GENERATION_TERM] = kv_cache_bytes(spec, shape, compute) + logits + gathered
    if grpo.beta > 0:
        if spec.method.type in ("lora", "qlora"):
            if spec.method.lora.init_from is not None:
                out["reference adapter"] = lora_parameters * 4.0
        else:
            out["reference model"] = shape.parameters * compute / (world if zero3 else 1)
    models = [r.model for r in grpo.rewards if r.type == "model"]
    if models:
        notes.append(f"reward model weights are not counted ({', '.join(models)}): add each one's size")
    return out, notes

