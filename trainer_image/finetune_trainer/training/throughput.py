"""Model FLOPs utilization: how much of the accelerators' peak the training tokens/s represent.

Model FLOPs per token, not hardware FLOPs (recomputed activations do not count, as in the PaLM paper's MFU): a
matmul weight costs 2 FLOPs per token forward, 2 backward for the input gradient, and 2 more for its own gradient
only when it is trained. Full fine-tuning is the familiar 6N; LoRA is about 4N. Embedding lookups are not matmuls
and attention's score/value products are left out, so the figure is a slight lower bound at long sequence lengths.
"""

from dataclasses import dataclass
from typing import Any

# Dense (no sparsity) 16-bit tensor-core peaks per device, from the vendors' datasheets, in FLOP/s. The first name
# that is a substring of torch.cuda.get_device_name() wins, so more specific names come first.
PEAK_16BIT_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15), ("B200", 2.25e15), ("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12),
    ("H800", 989e12), ("H20", 148e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12),
    ("A40", 150e12), ("A10G", 70e12), ("A10", 125e12), ("L4", 121e12), ("V100", 125e12), ("T4", 65e12),
    ("MI300X", 1307e12), ("MI250X", 383e12),
)


@dataclass(frozen=True)
class ParameterCounts:
    matmul: int  # parameters used in matmuls (everything but input embeddings)
    trained_matmul: int

    @property
    def flops_per_token(self) -> int:
        return 4 * self.matmul + 2 * self.trained_matmul


def _numel(p: Any) -> int:
    if hasattr(p, "ds_numel"):  # ZeRO-3 partitions parameters: numel() is this rank's empty placeholder
        return int(p.ds_numel)
    quant_state = getattr(p, "quant_state", None)
    if quant_state is not None and getattr(quant_state, "shape", None) is not None:  # 4-bit: packed storage
        n = 1
        for d in quant_state.shape:
            n *= int(d)
        return n
    return int(p.numel())


def parameter_counts(model: Any) -> ParameterCounts:
    embeddings = _module_params(model, "get_input_embeddings") - _module_params(model, "get_output_embeddings")
    matmul = trained = 0
    for p in model.parameters():
        if id(p) in embeddings:
            continue
        n = _numel(p)
        matmul += n
        if p.requires_grad:
            trained += n
    return ParameterCounts(matmul, trained)


def _module_params(model: Any, getter: str) -> set[int]:
    """Ids of the parameters of an embedding module; a tied lm_head shares the input's and is a matmul."""
    get = getattr(model, getter, None)
    module = get() if callable(get) else None
    return {id(p) for p in module.parameters()} if module is not None else set()


def peak_flops(device_name: str | None, precision: str, configured_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of one device for this run's precision; None when unknown (CPU, fp32, an unlisted GPU).
    `configured_tflops` (spec.resources.peakTflopsPerGpu) wins: the user knows their hardware and precision."""
    if configured_tflops is not None:
        return configured_tflops * 1e12
    if device_name is None or precision not in ("bf16", "fp16"):
        return None
    for name, flops in PEAK_16BIT_FLOPS:
        if name in device_name:
            return flops
    return None


def mfu(tokens_per_second_per_device: float, counts: ParameterCounts, peak: float | None) -> float | None:
    if peak is None or peak <= 0:
        return None
    return tokens_per_second_per_device * counts.flops_per_token / peak
