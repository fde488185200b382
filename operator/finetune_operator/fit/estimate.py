"""Peak memory of one training process (one GPU) for a FineTuneJob spec and a model shape.

A step holds different things at different moments, and the peak is the largest of them, not their sum:
- the end of the forward (the loss): weights, optimizer states (from the second step on), every layer's saved
  activations and the loss's peak over the vocabulary; no gradients (the Trainer sets them to None after each step)
  unless micro-batches are accumulated or a strategy keeps gradient buffers;
- the backward: the gradients, and with gradient checkpointing the one layer being recomputed;
- the optimizer step: weights, gradients, states and what the step allocates (DeepSpeed's fp32 gradients, a foreach
  optimizer's temporaries);
- evaluation (when the spec evaluates): weights, states and an evaluation batch's logits.
Each term is counted as our trainer runs it (states.py, activations.py: measured); ESTIMATE_MARGIN on top keeps the
gate on the high side of what was measured (benchmarks/memory_measured.py on CPU, the GPU suite on an H200:
docs/results.md). What the arithmetic cannot see is stated as constants: the CUDA context and library workspaces,
allocator fragmentation."""

from dataclasses import dataclass, field, replace
from typing import Any

from ..api.spec import FineTuneJobSpec
from .activations import (
    COMPILED_LAYER_SHARE,
    DORA_OUT_BYTES,
    checkpointed_layer_bytes_per_token,
    dora_norm_bytes,
    dropout_kernel,
    eval_bytes_per_token,
    layer_bytes_per_token,
    liger_loss_bytes_per_token,
    loss_bytes_per_token,
)
from .grpo import GENERATION_TERM, grpo_terms
from .shape import ModelShape
from .states import adapted_experts_per_layer, model_states, trainable, whole_modules

GIB = 1024**3
CUDA_CONTEXT_GIB = 0.75  # CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers: not in torch's allocator counts
FRAGMENTATION = 0.05  # reserved over allocated at the peak, a typical caching-allocator overhead
# The model's own error, measured: within 3% either way of every CPU run and GPU run (docs/results.md); the margin
# makes the prediction err high.
ESTIMATE_MARGIN = 0.04
WARN_FRACTION = 0.9
OVERHEAD_TERMS = ("estimate margin", "fragmentation", "cuda context")
PHASES = ("start", "end of forward", "backward", "optimizer step", "evaluation", "generation")
# DDP's constructor broadcasts the model's parameters and buffers from rank 0 through flat buckets of this many bytes
# (torch's broadcast_bucket_size): one bucket beside the weights, before any optimizer state exists (measured: a
# 100M-parameter LoRA run on short rows peaks there, 2x its fp32 weights).
DDP_BROADCAST_BUCKET = 250 * 1024**2


@dataclass
class MemoryEstimate:
    """Bytes per GPU (per training process), by term, and which terms are held at once in each phase of a step."""

    terms: dict[str, float]
    world_size: int
    tokens_per_micro_batch: int
    phases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    uncounted: list[str] = field(default_factory=list)  # what trains and could not be counted: no verdict of fit
    offloaded: dict[str, float] = field(default_factory=dict)  # moved to CPU memory, per process
    device: str = "GPU"  # or "process" for a CPU job
    complete: bool = True  # False where the job runs something the estimate does not model (torch_compile)

    def phase_bytes(self, phase: str) -> float:
        return sum(self.terms.get(t, 0.0) for t in self.phases[phase])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes) if self.phases else ""

    @property
    def peak(self) -> float:
        """What torch.cuda.max_memory_allocated would report (at most): the largest phase, with the margin."""
        inside = self.phase_bytes(self.peak_phase) if self.phases else sum(
            v for k, v in self.terms.items() if k not in OVERHEAD_TERMS)
        return inside + self.terms.get("estimate margin", 0.0)

    @property
    def needed(self) -> float:
        """What the GPU must hold: the peak, fragmentation and the CUDA context."""
        return self.peak + self.terms.get("fragmentation", 0.0) + self.terms.get("cuda context", 0.0)

    @property
    def largest(self) -> str:
        held = self.phases.get(self.peak_phase) or tuple(self.terms)
        return max((k for k in held if k not in OVERHEAD_TERMS), key=lambda k: self.terms.get(k, 0.0))

    def to_status(self, capacity_gib: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"peakGiB": round(self.peak / GIB, 2), "neededGiB": round(self.needed / GIB, 2),
                               "largestTerm": self.largest,
                               "terms": {k: round(v / GIB, 3) for k, v in self.terms.items()}}
        if capacity_gib is not None:
            out["capacityGiB"] = capacity_gib
        return out

    def table(self, capacity_gib: float | None = None) -> str:
        """Plain text, one term a line, in GiB per GPU, then the peak and the phase it falls in."""
        width = max(len(k) for k in [*self.terms, "peak allocated"])
        lines = [f"memory per {self.device} ({self.world_size} process{'es' if self.world_size > 1 else ''}, "
                 f"{self.tokens_per_micro_batch} tokens per micro-batch):"]
        lines += [f"  {k:<{width}}  {v / GIB:8.2f} GiB" for k, v in self.terms.items()]
        held = [t for t in self.phases.get(self.peak_phase, ()) if self.terms.get(t)]
        lines.append(f"  {'peak allocated':<{width}}  {self.peak / GIB:8.2f} GiB"
                     + (f" at the {self.peak_phase}: {' + '.join(held)} + estimate margin" if held else ""))
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


def checkpointing(spec: FineTuneJobSpec) -> bool:
    """Activations recomputed in the backward: gradientCheckpointing, or FSDP's own activationCheckpointing."""
    d = spec.distributed
    return spec.training.gradient_checkpointing or (
        d.strategy == "fsdp" and d.fsdp is not None and d.fsdp.activation_checkpointing)


def _switch(spec: FineTuneJobSpec, name: str) -> bool:
    return spec.training.extra_args.get(name) is True


def _layers(spec: FineTuneJobSpec, shape: ModelShape, compute: int, seq: int, tokens: int,
            terms: dict[str, float], notes: list[str]) -> float:
    """Adds the layers' terms (activations, the recomputed layer, adapted expert weights); returns the bytes per
    token of the largest layer."""
    lora = spec.method.lora
    adapter = (dropout_kernel(lora.dropout, spec.distributed.gpus_per_node > 0)
               if spec.method.type in ("lora", "qlora") else None)
    rank, targets = (lora.r, shape.lora_targets(lora.target_modules)) if adapter else (0, 0)
    attention = spec.model.attn_implementation
    dora = adapter is not None and lora.use_dora and lora.init_from is None
    dora_bytes = DORA_OUT_BYTES[compute] * shape.lora_out_width(lora.target_modules) if dora else 0.0

    def per_token(moe: bool) -> float:
        return dora_bytes + layer_bytes_per_token(
            shape, compute, attention, seq, lora=adapter, lora_rank=rank, lora_targets=targets, moe=moe,
            liger=_switch(spec, "use_liger_kernel"), gpu=spec.distributed.gpus_per_node > 0)

    dense = per_token(False)
    moe = per_token(True) if shape.is_moe else 0.0
    if _switch(spec, "torch_compile"):
        dense, moe = dense * COMPILED_LAYER_SHARE[compute], moe * COMPILED_LAYER_SHARE[compute]
    trains = (min(spec.method.freeze.trainable_layers, shape.layers) if spec.method.type == "freeze"
              else shape.layers)
    moe_layers = min(trains, shape.moe_layers)
    experts = adapted_experts_per_layer(spec, shape)
    if checkpointing(spec):
        terms["activations"] = trains * checkpointed_layer_bytes_per_token(shape, compute) * tokens
        terms["recomputed layer"] = max(dense, moe) * tokens + experts  # one layer at a time, in the backward
    else:
        terms["activations"] = ((trains - moe_layers) * dense + moe_layers * moe) * tokens
    if experts:
        # peft keeps each adapted layer's W + BA of its experts for the backward (with checkpointing: one layer).
        terms["adapted expert weights"] = experts * (1 if checkpointing(spec) else moe_layers)
        notes.append("peft adapts the fused experts through a ParamWrapper, which keeps every layer's experts "
                     "(W + BA) for the backward; targetModules without the experts (q_proj, k_proj, v_proj, o_proj) "
                     "or gradient checkpointing keep far less")
    if dora:
        terms["DoRA weight norm"] = dora_norm_bytes(shape, lora.target_modules, compute)
    if attention == "eager" and seq > 4096:
        notes.append("eager attention keeps heads x sequence^2 probabilities per layer: sdpa keeps none")
    return max(dense, moe)


def _loss(spec: FineTuneJobSpec, shape: ModelShape, compute: int, tokens: int, terms: dict[str, float],
          notes: list[str]) -> ModelShape:
    """Adds the loss's term; returns the shape of the head (a reward model's has one output)."""
    head = replace(shape, vocab=1) if spec.method.objective == "reward" else shape
    if _switch(spec, "use_liger_kernel") and spec.method.objective != "reward":
        head_grad = shape.vocab * shape.hidden * compute if spec.method.type == "full" else 0.0
        terms["logits and loss"] = liger_loss_bytes_per_token(head, compute) * tokens + head_grad
        notes.append("use_liger_kernel: Liger's fused linear cross-entropy holds a chunk of the logits, not all")
    else:
        terms["logits and loss"] = loss_bytes_per_token(head, compute) * tokens
    if _switch(spec, "torch_compile"):
        notes.append("torch_compile: its layers are counted at the share of eager's they keep at most (measured); "
                     "its loss as eager's, so the prediction is high (1.17x on one H200 run)")
    return head


def _phases(spec: FineTuneJobSpec, gradients_resident: bool, evaluates: bool) -> dict[str, tuple[str, ...]]:
    resident = ("weights", "optimizer states", "DDP gradient buckets", "reference model", "reference adapter")
    # DeepSpeed sets its reduction buckets up when the backward starts (measured: not held in the forward).
    reducing = (*resident, "DeepSpeed gradient buckets")
    grads_in_forward = gradients_resident or spec.training.gradient_accumulation_steps > 1
    phases = {
        "start": ("weights", "reference model", "reference adapter", "DDP first broadcast"),
        "end of forward": (*resident, *(("gradients",) if grads_in_forward else ()), "adapted expert weights",
                           "activations", "DoRA weight norm", "logits and loss"),
        "backward": (*reducing, "gradients", *(("activations",) if checkpointing(spec) else ()),
                     "recomputed layer", *(("DoRA weight norm",) if checkpointing(spec) else ())),
        "optimizer step": (*reducing, "gradients", "optimizer step"),
    }
    if evaluates:
        phases["evaluation"] = (*resident, *(("gradients",) if gradients_resident else ()), "evaluation")
    if spec.method.objective == "grpo":
        # TRL generates the next batch between optimizer steps: no activation of a training step is alive then.
        phases["generation"] = (*resident, *(("gradients",) if gradients_resident else ()), GENERATION_TERM)
    return phases


def estimate(spec: FineTuneJobSpec, shape: ModelShape) -> MemoryEstimate:
    objective = spec.method.objective
    if objective == "reward":
        # A reward model has no LM head (its score head, hidden x 1, is negligible): the embedding counts once.
        shape = replace(shape, tied_embeddings=True)
    dist = spec.distributed
    gpu = dist.gpus_per_node > 0
    compute = 4 if spec.training.precision == "fp32" else 2
    states = model_states(spec, shape, compute)
    terms: dict[str, float] = {"weights": states.weights, "optimizer states": states.optimizer,
                               "gradients": states.gradients + states.gradients_resident}
    if states.buckets:
        terms["DDP gradient buckets"] = states.buckets
        terms["DDP first broadcast"] = min(states.weights, DDP_BROADCAST_BUCKET)
    if states.deepspeed_buckets:
        terms["DeepSpeed gradient buckets"] = states.deepspeed_buckets
    notes = list(states.notes)
    unsized = whole_modules(spec, shape)[1]
    uncounted = []
    if unsized:
        field = "lora.modulesToSave" if spec.method.type in ("lora", "qlora") else "freeze.extraTrainableModules"
        uncounted.append(f"method.{field} {', '.join(unsized)} (no module of that name we can size)")
    continued = spec.method.type in ("lora", "qlora") and spec.method.lora.init_from is not None
    if continued:
        notes.append("method.lora.initFrom: the continued adapter's own modules_to_save and DoRA are not read here "
                     "(its LoRA layers are counted from targetModules and r)")
    if shape.embeddings_grown:
        notes.append(f"the tokenizer grows the embedding and head to {shape.vocab} rows" + (
            "" if continued else ", which then train: counted"))

    seq = sequence_length(spec)
    # DPO, ORPO, SimPO, CPO and a reward model score a pair's chosen and rejected answers in one batch: twice the
    # sequences of the micro-batch. KTO's second sequence (a mismatched completion for its KL estimate) runs without
    # gradients.
    pairs = 2 if objective in ("dpo", "orpo", "simpo", "cpo", "reward") else 1
    tokens = spec.training.per_device_train_batch_size * seq * pairs
    if (objective in ("dpo", "kto") and spec.method.type in ("full", "freeze")
            and not spec.method.preference.precompute_ref_log_probs):
        # TRL's frozen reference model, a second copy in the training precision, sharded like the weights by ZeRO-3.
        zero3 = dist.strategy == "deepspeed" and dist.deepspeed is not None and dist.deepspeed.zero_stage == 3
        terms["reference model"] = shape.parameters * compute / (dist.world_size if zero3 else 1)
    layer = _layers(spec, shape, compute, seq, tokens, terms, notes)
    head = _loss(spec, shape, compute, tokens, terms, notes)
    if objective == "grpo" and spec.method.grpo is not None:  # generation, the reference (fit/grpo.py)
        lora_params = trainable(spec, shape)[0] if spec.method.type in ("lora", "qlora") else 0
        extra, grpo_notes = grpo_terms(spec, shape, compute, lora_params)
        terms.update(extra)
        notes += grpo_notes
    evaluates = spec.training.eval_strategy != "no" and bool(spec.data.validation)
    if evaluates:
        # Without gradients nothing is kept: the peak is at the loss (the logits), or inside a layer (its
        # intermediates, at most what it would keep) where the vocabulary is small.
        eval_tokens = spec.training.per_device_eval_batch_size * seq * pairs
        terms["evaluation"] = max(eval_bytes_per_token(head, compute), layer) * eval_tokens
    if states.step:
        terms["optimizer step"] = states.step
    est = MemoryEstimate(terms=terms, world_size=dist.world_size, tokens_per_micro_batch=tokens,
                         phases=_phases(spec, bool(states.gradients_resident), evaluates), notes=notes,
                         offloaded=states.offloaded, device="GPU" if gpu else "process", uncounted=uncounted,
                         complete=not _switch(spec, "torch_compile"))
    inside = est.phase_bytes(est.peak_phase)
    terms["estimate margin"] = ESTIMATE_MARGIN * inside
    if gpu:
        terms["fragmentation"] = FRAGMENTATION * (inside + terms["estimate margin"])
        terms["cuda context"] = CUDA_CONTEXT_GIB * GIB
    if "paged" in spec.training.optim:
        notes.append(f"{spec.training.optim} pages its states to CPU memory under pressure: counted as if on the GPU")
    return est
