"""Model states of one training process, by strategy: what exists between steps (weights, optimizer states, buffers
a strategy keeps), what exists from the backward to the optimizer step (gradients), what the step allocates while
it runs, and what is moved to CPU memory.

It follows what our trainer actually runs: weights in the loaded dtype (model.dtype, auto = the checkpoint's);
torch optimizers keeping their states in the parameter's dtype; peft adapters upcast to fp32; QLoRA's
non-quantized parameters upcast to fp32 (prepare_model_for_kbit_training), a MoE's fused experts among them
(bitsandbytes quantizes nn.Linear only); DeepSpeed's fp32 master copy (kept at either precision) and the fp32
gradient partition its step builds; accelerate's FSDP upcasting trainable parameters to fp32 under mixed precision."""

from dataclasses import dataclass, field

from ..api.distributed import DeepSpeedSpec, FsdpSpec
from ..api.spec import FineTuneJobSpec
from .activations import EXPERT_ADAPTED_BYTES
from .shape import DTYPE_BYTES, ModelShape

NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit weights, 8-bit absmax per 64, fp32 per 256 absmax (double quant)
INT8_BYTES = 1.0 + 4 / 4096
# Our DeepSpeed ZeRO-3 preset (render/deepspeed.py): parameters stay gathered up to this many while they will be
# used again soon (stage3_max_reuse_distance as large): for models below it, nearly every gathered layer stays.
ZERO3_MAX_LIVE = 1_000_000_000
ZERO3_SUB_GROUP = 1_000_000_000  # sub_group_size: the step builds fp32 gradients one sub-group at a time
# ZeRO reduces gradients through contiguous buckets of reduce_bucket_size elements (two with overlap_comm). Our
# presets (render/deepspeed.py) give stage 2 and 3 "auto", which the Trainer fills with hidden^2, and leave stage 1
# at DeepSpeed's default of 5e8 elements (1 GB at bf16).
DEEPSPEED_DEFAULT_BUCKET = 500_000_000
AUTO_BUCKET_STAGES = (2, 3)
OVERLAP_COMM_STAGES = (2, 3)  # our stage 2 preset sets overlap_comm; DeepSpeed defaults it on for stage 3 only

# Optimizer state bytes per trainable parameter, as a multiple of the parameter's own bytes.
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


def step_temporaries(optim: str, trainable: float, largest: float, state_bytes: float, gpu: bool) -> float:
    """What the optimizer step allocates while it runs. Fused kernels (adamw_torch_fused, the default) and
    bitsandbytes' work in place. torch's other optimizers run "foreach" on a GPU: each step of the update over the
    whole parameter group at once (AdamW: the square root of its second moment, one state's size); on CPU one
    parameter at a time (two temporaries of the largest tensor). Adafactor works per parameter in fp32."""
    name = optim.removeprefix("paged_")
    if "fused" in name or "8bit" in name or "4bit" in name or name.startswith("adamw_bnb"):
        return 0.0
    if name.startswith("adafactor"):
        return 3 * largest * 4.0
    if optimizer_state_bytes(optim, 1.0) == 0 and not name.startswith("sgd"):
        return 0.0
    return trainable * state_bytes if gpu else 2 * largest * state_bytes


@dataclass
class ModelStates:
    weights: float
    optimizer: float  # optimizer states (and DeepSpeed's fp32 master copy)
    gradients: float
    gradients_resident: float = 0.0  # gradient buffers that exist in the forward too (DeepSpeed's)
    buckets: float = 0.0  # DDP's gradient buckets
    deepspeed_buckets: float = 0.0  # DeepSpeed's gradient reduction buckets
    step: float = 0.0  # the optimizer step's temporaries
    gathered: float = 0.0  # parameters a sharded strategy gathers (in "weights")
    offloaded: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def weight_bytes(spec: FineTuneJobSpec, shape: ModelShape) -> float:
    dtype = spec.model.dtype
    return float(shape.dtype_bytes if dtype == "auto" else DTYPE_BYTES[dtype])


def whole_modules(spec: FineTuneJobSpec, shape: ModelShape) -> tuple[int, list[str]]:
    """(parameters trained whole beside what the method trains, the names among them we cannot size): LoRA's
    modulesToSave (peft trains a copy of each, the original stays frozen; matched by the module's name) and freeze's
    extraTrainableModules (trained in place; any module whose name holds the substring), and the embedding and head
    when the tokenizer grows them (the trainer adds them to either)."""
    method = spec.method
    sizes = shape.module_parameters()
    grown = list(shape.embedding_names) if shape.embeddings_grown else []
    if method.type in ("lora", "qlora"):
        if method.lora.init_from is not None:  # a continued adapter brings its own modules_to_save: not read here
            return 0, []
        names = list(dict.fromkeys([*(m.split(".")[-1] for m in method.lora.modules_to_save), *grown]))
        return sum(sizes.get(n, 0) for n in names), [n for n in names if n not in sizes]
    if method.type == "freeze":
        # The trainer trains every parameter whose full name holds the substring: only a module's own name
        # ("lm_head", "norm": every norm) can be sized; "weight", "mlp", "layers.0", a MoE's "experts" cannot.
        wanted = [w for w in [*method.freeze.extra_trainable_modules, *grown] if w in sizes]
        matched = {name for name in sizes if any(w in name for w in wanted)}
        if shape.tied_embeddings and set(shape.embedding_names) <= matched:
            matched.discard(shape.embedding_names[1])  # one parameter under two names
        return (sum(sizes[n] for n in matched),
                [w for w in method.freeze.extra_trainable_modules if w not in sizes])
    return 0, []


def whole_module_bytes(spec: FineTuneJobSpec, shape: ModelShape) -> float:
    """Bytes a parameter of a module trained whole is held in: the loaded dtype, fp32 after QLoRA's upcast."""
    return 4.0 if spec.method.type == "qlora" else weight_bytes(spec, shape)


def trainable(spec: FineTuneJobSpec, shape: ModelShape) -> tuple[int, float]:
    """(trainable parameters, their bytes each as the trainer holds them: under LoRA the mean of the adapters' fp32
    and the whole modules' bytes, which is exact for every use, weights, gradients and states being per byte)."""
    method = spec.method
    whole, _ = whole_modules(spec, shape)
    if method.type in ("lora", "qlora"):
        adapters = shape.lora_parameters(method.lora.r, method.lora.target_modules)
        held = adapters * 4.0 + whole * whole_module_bytes(spec, shape)  # peft upcasts adapters
        return adapters + whole, held / max(1, adapters + whole)
    if method.type == "freeze":
        layers = min(method.freeze.trainable_layers, shape.layers) * shape.layer_params
        return min(shape.parameters, layers + whole), weight_bytes(spec, shape)
    return shape.parameters, weight_bytes(spec, shape)


def frozen_weights(spec: FineTuneJobSpec, shape: ModelShape, trained: int) -> float:
    """Bytes of the parameters that do not train (the base model under LoRA, frozen layers)."""
    quant = "4bit" if spec.method.type == "qlora" else spec.model.quantization
    if spec.method.type not in ("lora", "qlora"):
        return (shape.parameters - trained) * weight_bytes(spec, shape)
    if quant == "none":
        return shape.parameters * weight_bytes(spec, shape)
    linear = shape.linear_params * (NF4_BYTES if quant == "4bit" else INT8_BYTES)
    # Everything bitsandbytes leaves (embeddings, head, norms, a MoE's fused experts and routers): QLoRA's
    # prepare_model_for_kbit_training upcasts it to fp32.
    others = (shape.parameters - shape.linear_params) * (4.0 if spec.method.type == "qlora" else
                                                         weight_bytes(spec, shape))
    return linear + others


def expert_weight_bytes(spec: FineTuneJobSpec, shape: ModelShape) -> float:
    """Bytes of one fused expert parameter as loaded and prepared (fp32 after QLoRA's upcast)."""
    return 4.0 if spec.method.type == "qlora" else weight_bytes(spec, shape)


def adapted_experts_per_layer(spec: FineTuneJobSpec, shape: ModelShape) -> float:
    """peft's ParamWrapper keeps W + BA of a MoE layer's adapted experts for the backward: bytes per layer."""
    if spec.method.type not in ("lora", "qlora") or not shape.expert_targets(spec.method.lora.target_modules):
        return 0.0
    per_layer = shape.expert_params / max(1, shape.moe_layers)
    return per_layer * EXPERT_ADAPTED_BYTES[2 if expert_weight_bytes(spec, shape) == 2 else 4]


def largest_trainable_tensor(spec: FineTuneJobSpec, shape: ModelShape) -> int:
    if spec.method.type in ("lora", "qlora"):
        whole = shape.vocab * shape.hidden if whole_modules(spec, shape)[0] >= shape.vocab * shape.hidden else 0
        return max(spec.method.lora.r * max(shape.hidden, shape.intermediate), whole)
    return max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate * (2 if shape.is_moe else 1)
               * max(1, shape.experts if shape.is_moe else 1))


def model_states(spec: FineTuneJobSpec, shape: ModelShape, compute: int) -> ModelStates:
    dist = spec.distributed
    trained, tbytes = trainable(spec, shape)
    frozen = frozen_weights(spec, shape, trained)
    gpu = dist.gpus_per_node > 0
    largest = largest_trainable_tensor(spec, shape)
    if dist.strategy == "deepspeed":
        return _deepspeed(spec, shape, compute, trained, frozen, largest)
    if dist.strategy == "fsdp":
        return _fsdp(spec, shape, compute, trained, tbytes, frozen, largest)
    optim = spec.training.optim
    grads = trained * tbytes
    states = ModelStates(weights=frozen + trained * tbytes, optimizer=trained * optimizer_state_bytes(optim, tbytes),
                         gradients=grads, step=step_temporaries(optim, trained, largest, tbytes, gpu))
    if dist.world_size > 1 or not gpu:
        # DDP all-reduces through buckets the size of the gradients. On CPU accelerate wraps even one process in DDP
        # (MULTI_CPU: our launcher gives the one process torchrun's variables), on a GPU only several.
        states.buckets = grads
    return states


def _zero3_gathered(shape: ModelShape, compute: int, ds: DeepSpeedSpec, world: int) -> float:
    """Parameters ZeRO-3 holds gathered at once: our preset keeps them while they will be reused, up to
    stage3_max_live_parameters; at least the module being computed (the embedding or head, often the largest) and
    the next one prefetched."""
    if world == 1:  # one process's partition is the whole parameter: nothing to gather (measured)
        return 0.0
    live = ds.config.get("zero_optimization", {}).get("stage3_max_live_parameters", ZERO3_MAX_LIVE)
    largest = max(shape.layer_params, shape.vocab * shape.hidden)
    # A gathered parameter is a full tensor beside the process's own partition.
    return max(min(float(shape.parameters), float(live)), 2.0 * largest) * compute


def _reduce_buckets(ds: DeepSpeedSpec, shape: ModelShape, compute: int) -> float:
    zero = ds.config.get("zero_optimization", {})
    size = zero.get("reduce_bucket_size", "auto" if ds.zero_stage in AUTO_BUCKET_STAGES else DEEPSPEED_DEFAULT_BUCKET)
    elements = shape.hidden * shape.hidden if size == "auto" else float(size)
    overlap = zero.get("overlap_comm", ds.zero_stage in OVERLAP_COMM_STAGES)
    return elements * compute * (2 if overlap else 1)


def _deepspeed(spec: FineTuneJobSpec, shape: ModelShape, compute: int, trained: int, frozen: float,
               largest: int) -> ModelStates:
    """DeepSpeed casts the model to the training precision; ZeRO keeps an fp32 master copy and AdamW's fp32 states
    (the ZeRO paper's 4 + 8 bytes a parameter) partitioned over the processes from stage 1, the gradients from
    stage 2, the parameters at stage 3. Its step converts the gradient partition to fp32 (stage 1-2: whole;
    stage 3: a sub-group at a time)."""
    dist = spec.distributed
    ds = dist.deepspeed or DeepSpeedSpec()
    world, stage = dist.world_size, ds.zero_stage
    optim = spec.training.optim
    lora = spec.method.type in ("lora", "qlora")
    master = 4.0 if stage >= 1 or compute == 2 else 0.0
    states = trained * (master + optimizer_state_bytes(optim, 4.0))
    weights = trained * compute + (frozen if lora or spec.method.type == "freeze" else 0.0)
    grads = trained * float(compute)
    resident = 0.0
    fp32_grads = trained * 4.0  # the step's fp32 gradient partition
    if stage >= 1:
        states /= world
        fp32_grads /= world
    gathered = 0.0
    if stage >= 2:
        grads /= world
    if stage == 3:
        resident, grads = grads, 0.0  # a flat partition buffer, allocated once
        fp32_grads = min(fp32_grads, ZERO3_SUB_GROUP * 4.0)
        gathered = _zero3_gathered(shape, compute, ds, world)
        weights = weights / world + gathered
    elif stage == 0 and compute == 2:
        resident = fp32_grads  # bf16 without ZeRO: DeepSpeed's BF16_Optimizer accumulates fp32 gradients
    out = ModelStates(weights=weights, optimizer=states, gradients=grads, gradients_resident=resident,
                      step=fp32_grads + step_temporaries(optim, trained / (world if stage else 1), largest, 4.0, True),
                      gathered=gathered, deepspeed_buckets=_reduce_buckets(ds, shape, compute) if stage else 0.0)
    if ds.offload_params != "none" and stage == 3:
        out.offloaded["weights"] = weights - gathered
        out.weights = gathered
    if ds.offload_optimizer != "none" and stage >= 1:
        out.offloaded["optimizer states"] = out.optimizer
        out.optimizer = 0.0
        out.offloaded["gradients"] = fp32_grads  # the fp32 gradient partition lives beside the states on the CPU
        out.step = 0.0
    return out


def _fsdp(spec: FineTuneJobSpec, shape: ModelShape, compute: int, trained: int, tbytes: float, frozen: float,
          largest: int) -> ModelStates:
    dist = spec.distributed
    fsdp = dist.fsdp or FsdpSpec()
    world = dist.world_size
    shard = {"full_shard": world, "shard_grad_op": world, "hybrid_shard": dist.processes_per_node,
             "hybrid_shard_zero2": dist.processes_per_node, "no_shard": 1}[fsdp.sharding_strategy]
    # accelerate upcasts trainable 16-bit parameters to fp32 when FSDP runs mixed precision.
    pbytes = 4.0 if compute == 2 else float(tbytes)
    train_w, grads = trained * pbytes / shard, trained * pbytes / shard
    frozen_w = frozen / shard
    gathered = 2.0 * max(shape.layer_params, shape.vocab * shape.hidden) * compute if shard > 1 else 0.0
    if fsdp.sharding_strategy in ("shard_grad_op", "hybrid_shard_zero2"):
        gathered = shape.parameters * compute  # parameters stay gathered between forward and backward
    optim = spec.training.optim
    states = trained * optimizer_state_bytes(optim, pbytes) / shard
    out = ModelStates(weights=train_w + frozen_w + gathered, optimizer=states, gradients=grads,
                      step=step_temporaries(optim, trained / shard, largest / shard, pbytes, True), gathered=gathered)
    if fsdp.offload_params:
        out.offloaded.update({"weights": train_w + frozen_w, "gradients": grads, "optimizer states": states})
        out.weights, out.gradients, out.optimizer, out.step = gathered, 0.0, 0.0, 0.0
    return out
