"""GRPO's vLLM colocate mode (method.grpo.generationBackend: vllm) in the fit check: vLLM reserves its share of each
GPU (gpu_memory_utilization) for its own copy of the weights and its KV cache; training gets the rest."""

from typing import Any

from .estimate import GIB
from .shape import ModelShape

VLLM_WEIGHT_BYTES = 2  # vLLM's dtype "auto" runs fp32 checkpoints in fp16: 16 bits either way


def vllm_share(spec: Any) -> float | None:
    """The share of each GPU vLLM's colocate mode reserves (gpu_memory_utilization), None without vLLM."""
    grpo = spec.method.grpo
    if spec.method.objective != "grpo" or grpo is None or grpo.generation_backend != "vllm":
        return None
    return grpo.vllm_gpu_memory_utilization


def vllm_shortfall(spec: Any, shape: ModelShape, share_gib: float) -> str | None:
    """Why vLLM's share cannot hold what it needs at least: its own copy of the weights and the KV cache of one
    whole sequence (prompt and completion, data.maxLength), which vLLM refuses to start without. Its activations
    and CUDA graphs come on top, so this errs low: a share it names is too small, one it passes may still be."""
    weights = shape.parameters * VLLM_WEIGHT_BYTES
    kv = spec.data.max_length * shape.layers * 2 * shape.kv_width * VLLM_WEIGHT_BYTES
    if weights + kv <= share_gib * GIB:
        return None
    grpo = spec.method.grpo
    return (f"vLLM's share ({grpo.vllm_gpu_memory_utilization:g} of the GPU, {share_gib:.1f} GiB) cannot hold its "
            f"copy of the weights ({weights / GIB:.1f} GiB) and one sequence's KV cache ({kv / GIB:.2f} GiB); raise "
            "method.grpo.vllmGpuMemoryUtilization (training keeps the rest), or use generationBackend: transformers")
