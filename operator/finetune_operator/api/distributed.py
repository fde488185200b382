"""spec.distributed: how many nodes and processes, and which data-parallel strategy (DDP, FSDP, DeepSpeed)."""

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import ApiModel
from .constants import DEFAULT_RENDEZVOUS_PORT
from .errors import FieldError, SpecRuleErrors

Offload = Literal["none", "cpu"]
FSDP2_SHARDING = ("full_shard", "shard_grad_op")


class DeepSpeedSpec(ApiModel):
    zero_stage: Literal[0, 1, 2, 3] = Field(
        default=2, description="ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters."
    )
    offload_optimizer: Offload = Field(default="none", description="Move optimizer state to CPU memory (stage >= 1).")
    offload_params: Offload = Field(default="none", description="Move parameters to CPU memory (stage 3 only).")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="DeepSpeed JSON merged over the generated preset (deep merge, your keys win). Values the "
        'Trainer fills are left as "auto".',
    )

    @model_validator(mode="after")
    def _offload_rules(self) -> "DeepSpeedSpec":
        errors: list[FieldError] = []
        if self.offload_params != "none" and self.zero_stage != 3:
            errors.append(
                FieldError("offloadParams", self.offload_params, "parameter offload needs ZeRO stage 3",
                           "set zeroStage: 3 or offloadParams: none")
            )
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            errors.append(
                FieldError("offloadOptimizer", self.offload_optimizer, "optimizer offload needs ZeRO stage >= 1",
                           "set zeroStage: 2 or offloadOptimizer: none")
            )
        if errors:
            raise SpecRuleErrors(errors)
        return self


class FsdpSpec(ApiModel):
    sharding_strategy: Literal["full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard"] = (
        Field(default="full_shard", description="What is sharded across ranks (hybrid_*: within a node only).")
    )
    offload_params: bool = Field(default=False, description="Keep parameters in CPU memory between uses.")
    auto_wrap_policy: Literal["transformer_based_wrap", "size_based_wrap", "no_wrap"] = Field(
        default="transformer_based_wrap", description="How the model is split into FSDP units."
    )
    transformer_layer_classes: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Decoder layer class names to wrap (e.g. LlamaDecoderLayer); empty uses the model's "
        "_no_split_modules.",
    )
    min_num_params: int | None = Field(
        default=None, ge=1, description="size_based_wrap: parameters per FSDP unit."
    )
    backward_prefetch: Literal["backward_pre", "backward_post", "none"] = Field(
        default="backward_pre",
        description="FSDP1: prefetch the next unit's parameters during backward (FSDP2 prefetches on its own)."
    )
    forward_prefetch: bool = Field(default=False,
                                   description="FSDP1: prefetch the next unit's parameters during forward.")
    activation_checkpointing: bool = Field(
        default=False, description="FSDP-native activation checkpointing (use instead of gradientCheckpointing)."
    )
    version: Literal[1, 2] = Field(default=2, description="FSDP implementation: 2 (per-parameter, fully_shard) or 1.")
    state_dict_type: Literal["sharded", "full"] = Field(
        default="sharded",
        description="Checkpoint format. sharded avoids gathering the whole model on one rank (full can OOM); the "
        "final model is still saved in full.",
    )
    cpu_ram_efficient_loading: bool = Field(
        default=True, description="Load weights on rank 0 only and broadcast, to save host memory."
    )

    @model_validator(mode="after")
    def _wrap_rules(self) -> "FsdpSpec":
        errors: list[FieldError] = []
        if self.min_num_params is not None and self.auto_wrap_policy != "size_based_wrap":
            errors.append(FieldError("minNumParams", self.min_num_params,
                                     "minNumParams applies to size_based_wrap only",
                                     "set autoWrapPolicy: size_based_wrap or remove minNumParams"))
        if self.version == 2 and self.sharding_strategy not in FSDP2_SHARDING:
            errors.append(FieldError("shardingStrategy", self.sharding_strategy,
                                     "FSDP2 supports full_shard and shard_grad_op only",
                                     "use one of those, or version: 1 (deprecated upstream) for hybrid sharding"))
        if errors:
            raise SpecRuleErrors(errors)
        return self


class DistributedSpec(ApiModel):
    num_nodes: int = Field(default=1, ge=1, le=4096, description="Pods (torchrun nodes) per attempt; with "
                           "minNodes, the most the job grows to.")
    min_nodes: int | None = Field(
        default=None, ge=1, le=4096,
        description="Elastic size: the job starts once this many of its numNodes pods run, continues on the "
        "survivors (down to minNodes) when a node is lost, and grows back toward numNodes when pods can run again; "
        "torchrun's c10d rendezvous re-forms the group and the trainer resumes from the newest checkpoint, with "
        "gradient accumulation recomputed so the global batch stays the same. Needs output.claimName and strategy "
        "ddp. Unset: a fixed gang of numNodes.",
    )
    gpus_per_node: int = Field(
        default=1, ge=0, le=64, description="GPUs requested per pod, one training process each; 0 runs on CPU."
    )
    cpu_processes_per_node: int = Field(
        default=1, ge=1, le=256, description="Training processes per pod when gpusPerNode is 0 (CPU jobs)."
    )
    strategy: Literal["ddp", "fsdp", "deepspeed"] = Field(
        default="ddp", description="ddp replicates the model; fsdp and deepspeed shard it."
    )
    deepspeed: DeepSpeedSpec | None = Field(default=None, description="DeepSpeed settings (strategy deepspeed).")
    fsdp: FsdpSpec | None = Field(default=None, description="FSDP settings (strategy fsdp).")
    rendezvous_port: int = Field(
        default=DEFAULT_RENDEZVOUS_PORT, ge=1024, le=65535, description="Port of the torchrun rendezvous on node 0."
    )
    collective_timeout_seconds: int = Field(
        default=1800, ge=60, le=86400, description="Timeout of one collective (ddp_timeout) before the attempt fails."
    )
    nccl_debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = Field(
        default=None, description="NCCL_DEBUG level for debugging hangs; unset leaves NCCL quiet."
    )

    @property
    def processes_per_node(self) -> int:
        return self.gpus_per_node if self.gpus_per_node > 0 else self.cpu_processes_per_node

    @property
    def shards_parameters(self) -> bool:
        """FSDP or ZeRO-3: each rank holds a slice of every weight, so generation needs every rank (synced_gpus)."""
        return self.strategy == "fsdp" or (self.strategy == "deepspeed" and self.deepspeed is not None
                                           and self.deepspeed.zero_stage == 3)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.processes_per_node

    @property
    def elastic(self) -> bool:
        """numNodes is a range: minNodes..numNodes nodes."""
        return self.min_nodes is not None and self.min_nodes < self.num_nodes

    @property
    def fewest_nodes(self) -> int:
        """The fewest nodes the job trains on (numNodes for a fixed gang)."""
        return self.min_nodes if self.min_nodes is not None else self.num_nodes

    @model_validator(mode="after")
    def _strategy_rules(self) -> "DistributedSpec":
        errors: list[FieldError] = []
        if self.deepspeed is not None and self.fsdp is not None:
            errors.append(
                FieldError("fsdp", "set", "fsdp and deepspeed are exclusive", "keep only the one named by strategy")
            )
        elif self.deepspeed is not None and self.strategy != "deepspeed":
            errors.append(
                FieldError("strategy", self.strategy, "deepspeed settings are given but strategy is not deepspeed",
                           "set strategy: deepspeed or remove the deepspeed block")
            )
        elif self.fsdp is not None and self.strategy != "fsdp":
            errors.append(
                FieldError("strategy", self.strategy, "fsdp settings are given but strategy is not fsdp",
                           "set strategy: fsdp or remove the fsdp block")
            )
        if self.gpus_per_node == 0 and self.strategy == "fsdp":
            errors.append(
                FieldError("strategy", "fsdp", "FSDP through the Trainer needs GPUs (on CPU it silently runs as DDP)",
                           "use strategy ddp or deepspeed for CPU jobs, or request gpusPerNode")
            )
        if self.gpus_per_node == 0 and self.deepspeed is not None and (
            self.deepspeed.offload_optimizer != "none" or self.deepspeed.offload_params != "none"
        ):
            errors.append(
                FieldError("deepspeed.offloadOptimizer", self.deepspeed.offload_optimizer,
                           "a CPU job has no GPU memory to offload from",
                           "set offloadOptimizer/offloadParams: none, or request gpusPerNode")
            )
        if self.min_nodes is not None and self.min_nodes > self.num_nodes:
            errors.append(
                FieldError("minNodes", self.min_nodes, f"more than numNodes ({self.num_nodes}), the most the job "
                           "grows to", f"set minNodes to at most {self.num_nodes}, or raise numNodes")
            )
        if self.elastic and self.strategy != "ddp":
            errors.append(
                FieldError("minNodes", self.min_nodes, f"an elastic job resumes its checkpoints on another number of "
                           f"processes, which strategy {self.strategy}'s sharded optimizer states cannot be loaded "
                           "on without a conversion", "use strategy ddp for an elastic job, or remove minNodes")
            )
        if self.gpus_per_node > 0 and self.cpu_processes_per_node != 1:
            errors.append(
                FieldError("cpuProcessesPerNode", self.cpu_processes_per_node,
                           "GPU jobs run one process per GPU; cpuProcessesPerNode is for gpusPerNode 0",
                           "remove cpuProcessesPerNode")
            )
        if errors:
            raise SpecRuleErrors(errors)
        return self
