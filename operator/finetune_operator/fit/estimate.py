"""Peak memory of one training process (one GPU) for a FineTuneJob spec and a model shape, term by term.

Model states follow what our trainer actually runs: weights in the loaded dtype (model.dtype, auto = the
checkpoint's), torch optimizers keeping their states in the parameter's dtype, peft adapters upcast to fp32, QLoRA's
non-quantized parameters upcast to fp32 (prepare_model_for_kbit_training), DeepSpeed's fp32 master copy with 16-bit
training (the ZeRO paper's 2 + 2 + 12 bytes per parameter, partitioned by stage), accelerate's FSDP upcasting
trainable parameters to fp32 under mixed precision. Activations come from activations.py (measured). What the
arithmetic cannot see is stated as constants: the CUDA context and library workspaces, allocator fragmentation."""

from dataclasses import dataclass, field, replace
from typing import Any

from ..api.distributed import DeepSpeedSpec, FsdpSpec
from ..api.spec import FineTuneJobSpec
from .activations import (
    checkpointed_layer_bytes_per_token,
    layer_bytes_per_token,
    method_kind,
    outside_bytes_per_token,
)
from .shape import DTYPE_BYTES, ModelShape

GIB = 1024**3
CUDA_CONTEXT_GIB = 0.75  # CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers: not in torch's allocator counts
FRAGMENTATION = 0.05  # reserved over allocated at the peak, a typical caching-allocator overhead
WARN_FRACTION = 0.9
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit weights, 8-bit absmax per 64, fp32 per 256 absmax (double quant)

# Optimizer state bytes per trainable parameter, as a multiple of the parameter's own bytes or as fixed bytes.
_STATE_MULTIPLE = {"adamw": 2.0, "adam": 2.0, "lion": 1.0, "sgd": 0.0, "adafactor": 0.0, "rmsprop": 1.0,
                   "adagrad": 1.0}


def optimizer_state_bytes(optim: str, param_bytes: float) -> float:
    """Bytes of optimizer state per trainable parameter; 8-bit optimizers keep two 1-byte states."""
    if "8bit" in optim:
        return 2.0 if "adam" in optim or "ademamix" in optim else 1.0
    for prefix, multiple in _STATE_MULTIPLE.items():
        if optim.removeprefix("paged_").startswith(prefix):
            return multiple * param_bytes
    return 2.0 * param_bytes  # an optimizer we do not know: counted as AdamW, the common case


@dataclass
class MemoryEstimate:
    """Bytes per GPU (per training process), by term."""

    terms: dict[str, float]
    world_size: int
    tokens_per_micro_batch: int
    notes: list[str] = field(default_factory=list)
    offloaded: dict[str, float] = field(default_factory=dict)  # moved to CPU memory, per process
    device: str = "GPU"  # or "process" for a CPU job

    @property
    def peak(self) -> float:
        """What torch.cuda.max_memory_allocated would report."""
        return sum(v for k, v in self.terms.items() if k not in ("cuda context", "fragmentation"))

    @property
    def needed(self) -> float:
        """What the GPU must hold: the peak, fragmentation and the CUDA context."""
        return sum(self.terms.values())

    @property
    def largest(self) -> str:
        return max((k for k in self.terms if k not in ("cuda context", "fragmentation")), key=self.terms.__getitem__)

    def to_status(self, capacity_gib: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"peakGiB": round(self.peak / GIB, 2), "neededGiB": round(self.needed / GIB, 2),
                               "largestTerm": self.largest,
                               "terms": {k: round(v / GIB, 3) for k, v in self.terms.items()}}
        if capacity_gib is not None:
            out["capacityGiB"] = capacity_gib
        return out

    def table(self, capacity_gib: float | None = None) -> str:
        """Plain text, one term a line, in GiB per GPU."""
        width = max(len(k) for k in self.terms)
        lines = [f"memory per {self.device} ({self.world_size} process{'es' if self.world_size > 1 else ''}, "
                 f"{self.tokens_per_micro_batch} tokens per micro-batch):"]
        lines += [f"  {k:<{width}}  {v / GIB:8.2f} GiB" for k, v in self.terms.items()]
        lines.append(f"  {'peak allocated':<{width}}  {self.peak / GIB:8.2f} GiB")
        lines.append(f"  {'needed':<{width}}  {self.needed / GIB:8.2f} GiB"
                     + (f" of {capacity_gib:g} GiB ({100 * self.needed / GIB / capacity_gib:.0f}%)"
                        if capacity_gib else ""))
        lines += [f"  {k} off the GPU: {v / GIB:.2f} GiB of CPU memory per process" for k, v in self.offloaded.items()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def sequence_length(spec: FineTuneJobSpec) -> int:
    """Tokens of one sequence at most: packed blocks are exactly blockSize (default maxLength); padded rows at most
    maxLength."""
    data = spec.data
    if data.format == "text" or data.packing:
        return data.block_size or data.max_length
    return data.max_length


def _weight_bytes(spec: FineTuneJobSpec, shape: ModelShape) -> float:
    dtype = spec.model.dtype
    return float(shape.dtype_bytes if dtype == "auto" else DTYPE_BYTES[dtype])


def _trainable(spec: FineTuneJobSpec, shape: ModelShape) -> tuple[int, float]:
    """(trainable parameters, their bytes each as the trainer holds them)."""
    method = spec.method
    if method.type in ("lora", "qlora"):
        return shape.lora_parameters(method.lora.r, method.lora.target_modules), 4.0  # peft upcasts adapters
    if method.type == "freeze":
        layers = min(method.freeze.trainable_layers, shape.layers)
        return layers * shape.layer_params, _weight_bytes(spec, shape)
    return shape.parameters, _weight_bytes(spec, shape)


def _frozen_weights(spec: FineTuneJobSpec, shape: ModelShape, trainable: int) -> float:
    """Bytes of the parameters that do not train (the base model under LoRA, frozen layers)."""
    quant = "4bit" if spec.method.type == "qlora" else spec.model.quantization
    if spec.method.type not in ("lora", "qlora"):
        return (shape.parameters - trainable) * _weight_bytes(spec, shape)
    if quant == "none":
        return shape.parameters * _weight_bytes(spec, shape)
    linear = shape.linear_params * (NF4_BYTES if quant == "4bit" else 1.0 + 4 / 4096)
    # prepare_model_for_kbit_training upcasts every 16-bit parameter that is not quantized (embeddings, head, norms).
    others = (shape.parameters - shape.linear_params) * (4.0 if spec.method.type == "qlora" else
                                                         _weight_bytes(spec, shape))
    return linear + others


def _layer_params_gathered(shape: ModelShape, compute_bytes: int) -> float:
    """A sharded strategy gathers one layer to compute and prefetches the next: two layers' weights, unsharded."""
    return 2 * shape.layer_params * compute_bytes


def estimate(spec: FineTuneJobSpec, shape: ModelShape) -> MemoryEstimate:
    if spec.method.objective == "reward":
        # A reward model has no LM head (its score head, hidden x 1, is negligible): the embedding counts once.
        shape = replace(shape, tied_embeddings=True)
    dist = spec.distributed
    world = dist.world_size
    compute = 4 if spec.training.precision == "fp32" else 2
    trainable, tbytes = _trainable(spec, shape)
    frozen = _frozen_weights(spec, shape, trainable)
    optim = spec.training.optim
    terms: dict[str, float] = {}
    offloaded: dict[str, float] = {}
    notes: list[str] = []

    if dist.strategy == "deepspeed":
        ds = dist.deepspeed or DeepSpeedSpec()
        stage = ds.zero_stage
        # DeepSpeed casts the model to the training precision and keeps an fp32 master copy in the optimizer.
        pbytes = float(compute)
        master = 4.0 if compute == 2 else 0.0
        states = trainable * (master + optimizer_state_bytes(optim, 4.0))
        weights = trainable * pbytes + (frozen if spec.method.type in ("lora", "qlora", "freeze") else 0.0)
        grads = trainable * pbytes
        if stage >= 1:
            states /= world
        if stage >= 2:
            grads /= world
        if stage == 3:
            weights = weights / world + _layer_params_gathered(shape, compute)
            if ds.offload_params != "none":
                offloaded["weights"] = weights - _layer_params_gathered(shape, compute)
                weights = _layer_params_gathered(shape, compute)
        if ds.offload_optimizer != "none" and stage >= 1:
            offloaded["optimizer states"] = states
            states = 0.0
            if stage >= 2:  # the fp32 gradient partition lives beside the states on the CPU
                offloaded["gradients"] = grads * 4 / pbytes
                grads = 0.0
        terms.update({"weights": weights, "gradients": grads, "optimizer states": states})
    elif dist.strategy == "fsdp":
        fsdp = dist.fsdp or FsdpSpec()
        shard = {"full_shard": world, "shard_grad_op": world, "hybrid_shard": dist.processes_per_node,
                 "hybrid_shard_zero2": dist.processes_per_node, "no_shard": 1}[fsdp.sharding_strategy]
        # accelerate upcasts trainable 16-bit parameters to fp32 when FSDP runs mixed precision.
        pbytes = 4.0 if compute == 2 else float(tbytes)
        train_w, grads = trainable * pbytes / shard, trainable * pbytes / shard
        frozen_w = frozen / shard
        gathered = _layer_params_gathered(shape, compute) if shard > 1 else 0.0
        if fsdp.sharding_strategy in ("shard_grad_op", "hybrid_shard_zero2"):
            gathered = shape.parameters * compute  # parameters stay gathered between forward and backward
        states = trainable * optimizer_state_bytes(optim, pbytes) / shard
        if fsdp.offload_params:
            offloaded.update({"weights": train_w + frozen_w, "gradients": grads, "optimizer states": states})
            train_w = frozen_w = grads = states = 0.0
        terms.update({"weights": train_w + frozen_w + gathered, "gradients": grads, "optimizer states": states})
    else:
        grads = trainable * tbytes
        terms.update({"weights": frozen + trainable * tbytes, "gradients": grads,
                      "optimizer states": trainable * optimizer_state_bytes(optim, tbytes)})
        if world > 1:
            terms["DDP gradient buckets"] = grads  # DDP all-reduces through buckets the size of the gradients

    seq = sequence_length(spec)
    # DPO, ORPO, SimPO, CPO and a reward model score a pair's chosen and rejected answers in one batch: twice the
    # sequences of the micro-batch. KTO's second sequence (a mismatched completion for its KL estimate) runs without
    # gradients.
    objective = spec.method.objective
    pairs = 2 if objective in ("dpo", "orpo", "simpo", "cpo", "reward") else 1
    tokens = spec.training.per_device_train_batch_size * seq * pairs
    if (objective in ("dpo", "kto") and spec.method.type in ("full", "freeze")
            and not spec.method.preference.precompute_ref_log_probs):
        # TRL's frozen reference model, a second copy in the training precision, sharded like the weights by ZeRO-3.
        shard = world if dist.strategy == "deepspeed" and (dist.deepspeed or DeepSpeedSpec()).zero_stage == 3 else 1
        terms["reference model"] = shape.parameters * compute / shard
    lora = spec.method.lora
    kind = method_kind(spec.method.type, lora.dropout)
    lora_args = (lora.r, shape.lora_targets(lora.target_modules)) if kind != "full" else (0, 0)
    attention = spec.model.attn_implementation
    per_layer = layer_bytes_per_token(shape, compute, kind, attention, seq, *lora_args)
    layers_with_grad = (min(spec.method.freeze.trainable_layers, shape.layers) if spec.method.type == "freeze"
                        else shape.layers)
    if spec.training.gradient_checkpointing:
        # Each layer keeps its input; in backward one layer at a time is recomputed with all it keeps.
        layer_acts = layers_with_grad * checkpointed_layer_bytes_per_token(shape, compute) + per_layer
    else:
        layer_acts = layers_with_grad * per_layer
    terms["activations"] = layer_acts * tokens
    # fp32 logits kept for the loss, counted in outside_bytes; in backward their gradient (fp32, and its 16-bit
    # cast) exists at once with them: for 128k-token vocabularies often the largest single allocation.
    # A reward model's head has one output, not a vocabulary: its logits are nothing beside the layers.
    head = replace(shape, vocab=1) if objective == "reward" else shape
    terms["logits and loss"] = (outside_bytes_per_token(head, compute)
                                + (4 + (2 if compute == 2 else 0)) * head.vocab) * tokens
    if objective == "grpo" and spec.method.grpo is not None:  # generation, the reference (fit/grpo.py)
        from .grpo import grpo_terms

        lora_params = trainable if spec.method.type in ("lora", "qlora") else 0
        extra, grpo_notes = grpo_terms(spec, shape, compute, terms, lora_params)
        terms.update(extra)
        notes += grpo_notes
    if dist.gpus_per_node > 0:
        terms["fragmentation"] = FRAGMENTATION * sum(terms.values())
        terms["cuda context"] = CUDA_CONTEXT_GIB * GIB
    if "paged" in optim:
        notes.append(f"{optim} pages its states to CPU memory under pressure: counted as if on the GPU")
    if attention == "eager" and seq > 4096:
        notes.append("eager attention keeps heads x sequence^2 probabilities per layer: sdpa keeps none")
    return MemoryEstimate(terms=terms, world_size=world, tokens_per_micro_batch=tokens, notes=notes,
                          offloaded=offloaded, device="GPU" if dist.gpus_per_node > 0 else "process")
