"""What would fit: each change a user can make to a spec that does not fit, estimated again, the cheapest first.

Cheapest means least cost to the run: recomputing activations (about a third more compute) before a smaller
micro-batch with more accumulation (same global batch, less parallel work per step), before adapting fewer of a
MoE's weights, before sharding more (more communication), before moving states to CPU memory (slowest, and only
where the pod's memory holds them), before changing what is trained (LoRA instead of a full fine-tune, 4-bit base
weights). Each change is applied to the spec as data and validated again, so no advice names a spec the API would
refuse, and each label says everything it changes."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..api.errors import SpecRuleErrors
from ..api.spec import FineTuneJobSpec
from .estimate import GIB, MemoryEstimate, checkpointing, estimate
from .host import host_bytes_per_node, host_shortfall
from .shape import ModelShape

MAX_SUGGESTIONS = 3
Spec = dict[str, Any]  # the spec as data (model_dump by alias), changed in place
Change = Callable[[Spec, FineTuneJobSpec], str | None]  # applies itself and says what it did; None: not applicable


@dataclass(frozen=True)
class Suggestion:
    change: str
    estimate: MemoryEstimate
    kind: str = ""

    def describe(self, capacity_gib: float) -> str:
        host = ""
        if self.estimate.offloaded:
            host = f", {sum(self.estimate.offloaded.values()) / GIB:.1f} GiB of CPU memory per process"
        return (f"{self.change} (needs {self.estimate.needed / GIB:.1f} GiB of {capacity_gib:g}, "
                f"peak allocated {self.estimate.peak / GIB:.1f}{host})")


def _checkpointing(d: Spec, spec: FineTuneJobSpec) -> str | None:
    if checkpointing(spec):
        return None
    if spec.distributed.strategy == "fsdp":  # FSDP's own, as accelerate asks for under FSDP
        d["distributed"]["fsdp"] = {**(d["distributed"].get("fsdp") or {}), "activationCheckpointing": True}
        return "distributed.fsdp.activationCheckpointing: true"
    d["training"]["gradientCheckpointing"] = True
    return "training.gradientCheckpointing: true"


def _halve_micro_batch(d: Spec, spec: FineTuneJobSpec) -> str | None:
    t = d["training"]
    if t["perDeviceTrainBatchSize"] < 2 or t["perDeviceTrainBatchSize"] % 2:
        return None
    t["perDeviceTrainBatchSize"] //= 2
    t["gradientAccumulationSteps"] *= 2
    return (f"training.perDeviceTrainBatchSize: {t['perDeviceTrainBatchSize']} with gradientAccumulationSteps: "
            f"{t['gradientAccumulationSteps']} (same global batch)")


def _attention_only(d: Spec, spec: FineTuneJobSpec) -> str | None:
    """A MoE whose fused experts peft adapts: adapters on the attention only keep no expert weights for backward."""
    if spec.method.type not in ("lora", "qlora") or spec.method.lora.target_modules != ["all-linear"]:
        return None
    d["method"]["lora"]["targetModules"] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    return "method.lora.targetModules: [q_proj, k_proj, v_proj, o_proj] (the experts stay frozen)"


def _shard(d: Spec, spec: FineTuneJobSpec) -> str | None:
    dist = spec.distributed
    if dist.world_size < 2:
        return None
    if dist.strategy == "fsdp":
        if dist.fsdp is None or dist.fsdp.sharding_strategy == "full_shard":
            return None
        d["distributed"]["fsdp"]["shardingStrategy"] = "full_shard"
        return "distributed.fsdp.shardingStrategy: full_shard"
    stage = dist.deepspeed.zero_stage if dist.strategy == "deepspeed" and dist.deepspeed else None
    if stage == 3:
        return None
    ds = {**(d["distributed"].get("deepspeed") or {}), "zeroStage": 3}
    d["distributed"].update(strategy="deepspeed", fsdp=None, deepspeed=ds)
    return ("distributed.deepspeed.zeroStage: 3" if stage is not None
            else "distributed.strategy: deepspeed with deepspeed.zeroStage: 3")


def _offload(d: Spec, spec: FineTuneJobSpec) -> str | None:
    """States to CPU memory: FSDP's parameter offload for an FSDP job; else DeepSpeed's optimizer offload (at the
    job's ZeRO stage if it has one of at least 1, else ZeRO-2 for one process and ZeRO-3 for more)."""
    dist = spec.distributed
    if dist.gpus_per_node == 0:
        return None
    if dist.strategy == "fsdp":
        if dist.fsdp is not None and dist.fsdp.offload_params:
            return None
        d["distributed"]["fsdp"] = {**(d["distributed"].get("fsdp") or {}), "offloadParams": True}
        return "distributed.fsdp.offloadParams: true"
    ds = dist.deepspeed if dist.strategy == "deepspeed" else None
    if ds is not None and ds.offload_optimizer != "none":
        return None
    stage = ds.zero_stage if ds is not None and ds.zero_stage >= 1 else (2 if dist.world_size < 2 else 3)
    d["distributed"].update(strategy="deepspeed", fsdp=None, deepspeed={
        **(d["distributed"].get("deepspeed") or {}), "zeroStage": stage, "offloadOptimizer": "cpu"})
    if ds is not None and ds.zero_stage == stage:
        return "distributed.deepspeed.offloadOptimizer: cpu"
    prefix = "distributed.strategy: deepspeed with " if ds is None else "distributed."
    return f"{prefix}deepspeed.zeroStage: {stage} and offloadOptimizer: cpu"


def _lora(d: Spec, spec: FineTuneJobSpec) -> str | None:
    if spec.method.type in ("lora", "qlora"):
        return None
    d["method"]["type"] = "lora"
    return "method.type: lora"


def _qlora(d: Spec, spec: FineTuneJobSpec) -> str | None:
    if spec.method.type == "qlora" or spec.distributed.gpus_per_node == 0:
        return None
    d["method"]["type"], d["model"]["quantization"] = "qlora", "4bit"
    return "method.type: qlora (model.quantization: 4bit)"


CHANGES: tuple[tuple[str, Change], ...] = (
    ("checkpointing", _checkpointing), ("micro-batch", _halve_micro_batch), ("experts", _attention_only),
    ("sharding", _shard), ("offload", _offload), ("lora", _lora), ("qlora", _qlora))


def _apply(spec: FineTuneJobSpec, changes: list[Change]) -> tuple[list[str], FineTuneJobSpec] | None:
    data = spec.model_dump(by_alias=True)
    labels, current = [], spec
    for change in changes:
        label = change(data, current)
        if label is None:
            return None
        labels.append(label)
        try:
            current = FineTuneJobSpec.model_validate(data)
        except (ValidationError, SpecRuleErrors, ValueError):  # a combination the API refuses is no advice
            return None
    return labels, current


def _variants(spec: FineTuneJobSpec, shape: ModelShape) -> Iterator[tuple[str, str, FineTuneJobSpec]]:
    """(kind, label, changed spec): single changes in order, then each with checkpointing and the micro-batch
    halved down to 1."""
    usable = [(k, c) for k, c in CHANGES if k != "experts" or shape.expert_targets(spec.method.lora.target_modules)]
    singles = []
    for kind, change in usable:
        applied = _apply(spec, [change])
        if applied is not None:
            singles.append((kind, change))
            yield kind, applied[0][0], applied[1]
    for kind, change in singles:
        extra: list[Change] = [] if kind == "checkpointing" or checkpointing(spec) else [_checkpointing]
        for halvings in range(0, 8):
            applied = _apply(spec, [change, *extra, *[_halve_micro_batch] * halvings])
            if applied is None:
                break
            if extra or halvings:
                labels = [label for i, label in enumerate(applied[0]) if not (  # the last micro-batch says it all
                    label.startswith("training.perDeviceTrainBatchSize") and i < len(applied[0]) - 1)]
                yield kind, " and ".join(labels), applied[1]


def what_fits(spec: FineTuneJobSpec, shape: ModelShape, capacity_gib: float,
              limit: int = MAX_SUGGESTIONS) -> list[Suggestion]:
    """Changes (cheapest first, one per kind of change, at most `limit`) whose estimate fits `capacity_gib` and whose
    offloaded states fit the pod's memory; [] when nothing we know fits."""
    found: list[Suggestion] = []
    kinds: set[str] = set()
    for kind, label, changed in _variants(spec, shape):
        # Two kinds can arrive at the same change (checkpointing turned on, then the batch halved, by either road).
        if kind in kinds or any(s.change.split(" (the pods")[0] == label for s in found):
            continue
        est = estimate(changed, shape)
        if est.needed > capacity_gib * GIB or host_shortfall(changed, est) is not None:
            continue
        host = host_bytes_per_node(changed, est)
        if host and changed.resources.memory is None:
            label += f" (the pods then need about {host / GIB:.0f} GiB of CPU memory each: set spec.resources.memory)"
        found.append(Suggestion(label, est, kind))
        kinds.add(kind)
        if len(found) == limit:
            break
    return found
