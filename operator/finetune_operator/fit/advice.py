"""What would fit: each change a user can make to a spec that does not fit, estimated again, the cheapest first.

Cheapest means least cost to the run: recomputing activations (about a third more compute) before a smaller
micro-batch with more accumulation (same global batch, less parallel work per step), before sharding everything
(ZeRO-3: more communication), before moving states to CPU memory (slowest), before changing what is trained (LoRA
instead of a full fine-tune, 4-bit base weights)."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..api.distributed import DeepSpeedSpec
from ..api.spec import FineTuneJobSpec
from .estimate import GIB, MemoryEstimate, estimate
from .shape import ModelShape

Change = tuple[str, Callable[[FineTuneJobSpec], bool]]  # (what to write in the spec, apply it; False: not applicable)


@dataclass(frozen=True)
class Suggestion:
    change: str
    estimate: MemoryEstimate

    def describe(self, capacity_gib: float) -> str:
        return (f"{self.change} (needs {self.estimate.needed / GIB:.1f} GiB of {capacity_gib:g}, "
                f"peak allocated {self.estimate.peak / GIB:.1f})")


def _checkpointing(spec: FineTuneJobSpec) -> bool:
    if spec.training.gradient_checkpointing:
        return False
    spec.training.gradient_checkpointing = True
    return True


def _halve_micro_batch(spec: FineTuneJobSpec) -> bool:
    t = spec.training
    if t.per_device_train_batch_size < 2 or t.per_device_train_batch_size % 2:
        return False
    t.per_device_train_batch_size //= 2
    t.gradient_accumulation_steps *= 2
    return True


def _zero3(spec: FineTuneJobSpec) -> bool:
    d = spec.distributed
    if d.world_size < 2 or (d.strategy == "deepspeed" and d.deepspeed is not None and d.deepspeed.zero_stage == 3):
        return False
    d.strategy, d.fsdp, d.deepspeed = "deepspeed", None, DeepSpeedSpec(zero_stage=3)
    return True


def _offload(spec: FineTuneJobSpec) -> bool:
    """Optimizer states to CPU memory under DeepSpeed: the job's own ZeRO stage (at least 2, 3 with more than one
    process), ZeRO-3 when it ran another strategy."""
    d = spec.distributed
    ds = (d.deepspeed or DeepSpeedSpec()) if d.strategy == "deepspeed" else None
    if ds is not None and ds.offload_optimizer != "none":
        return False
    stage = ds.zero_stage if ds is not None else 3
    d.strategy, d.fsdp = "deepspeed", None
    d.deepspeed = DeepSpeedSpec(zero_stage=max(stage, 2 if d.world_size < 2 else 3), offload_optimizer="cpu")
    return True


def _lora(spec: FineTuneJobSpec) -> bool:
    if spec.method.type in ("lora", "qlora"):
        return False
    spec.method.type = "lora"
    return True


def _qlora(spec: FineTuneJobSpec) -> bool:
    if spec.method.type == "qlora" or spec.distributed.gpus_per_node == 0:
        return False
    spec.method.type, spec.model.quantization = "qlora", "4bit"
    return True


def _changes(spec: FineTuneJobSpec) -> list[Change]:
    t = spec.training
    halved = (f"training.perDeviceTrainBatchSize: {t.per_device_train_batch_size // 2} with "
              f"gradientAccumulationSteps: {t.gradient_accumulation_steps * 2} (same global batch)")
    return [("training.gradientCheckpointing: true", _checkpointing), (halved, _halve_micro_batch),
            ("distributed.strategy: deepspeed with zeroStage: 3", _zero3),
            ("distributed.deepspeed.offloadOptimizer: cpu", _offload),
            ("method.type: lora", _lora), ("method.type: qlora (model.quantization: 4bit)", _qlora)]


def _variants(spec: FineTuneJobSpec) -> Iterator[tuple[str, FineTuneJobSpec]]:
    """Single changes in order, then each with gradient checkpointing and the micro-batch halved down to 1."""
    singles = []
    for label, change in _changes(spec):
        changed = spec.model_copy(deep=True)
        if change(changed):
            singles.append((label, changed))
            yield label, changed
    for label, changed in singles:
        current, labels = changed.model_copy(deep=True), [label]
        if _checkpointing(current):
            labels.append("training.gradientCheckpointing: true")
            yield " and ".join(labels), current.model_copy(deep=True)
        while _halve_micro_batch(current):
            t = current.training
            yield (" and ".join([*labels, f"training.perDeviceTrainBatchSize: {t.per_device_train_batch_size} "
                                          f"with gradientAccumulationSteps: {t.gradient_accumulation_steps}"]),
                   current.model_copy(deep=True))


def what_fits(spec: FineTuneJobSpec, shape: ModelShape, capacity_gib: float) -> Suggestion | None:
    """The first change (cheapest first) whose estimate fits `capacity_gib`; None when nothing we know fits."""
    for label, changed in _variants(spec):
        est = estimate(changed, shape)
        if est.needed <= capacity_gib * GIB:
            return Suggestion(label, est)
    return None
