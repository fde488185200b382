"""DeepSpeed JSON presets (ZeRO 0-3, CPU offload), with "auto" wherever the HF Trainer fills the value."""

from typing import Any

from ..api.distributed import DeepSpeedSpec
from .merge import deep_merge

# "auto" lets the Trainer copy its own arguments in, so the JSON and TrainingArguments can never disagree.
# train_batch_size is left out on purpose: DeepSpeed derives it (micro x accumulation x world), and setting it
# before the process group exists breaks ZeRO-3 start-up on some launchers.
_COMMON: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "steps_per_print": 1_000_000_000,
    "wall_clock_breakdown": False,
}

_ZERO: dict[int, dict[str, Any]] = {
    0: {"stage": 0},
    1: {"stage": 1},
    2: {
        "stage": 2,
        "allgather_partitions": True,
        "allgather_bucket_size": 200_000_000,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": "auto",
        "contiguous_gradients": True,
    },
    3: {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1_000_000_000,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1_000_000_000,
        "stage3_max_reuse_distance": 1_000_000_000,
        # Without this, ZeRO-3 saves empty or partial weights (the classic "model.safetensors is 0 bytes").
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}

# With the optimizer offloaded, DeepSpeed's CPU Adam must run the step; a torch optimizer would run on GPU tensors.
_OFFLOADED_OPTIMIZER: dict[str, Any] = {
    "type": "AdamW",
    "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
}


def deepspeed_config(ds: DeepSpeedSpec) -> dict[str, Any]:
    """The DeepSpeed JSON for `ds`: preset for the stage, offload blocks, then the user's overrides on top."""
    zero = dict(_ZERO[ds.zero_stage])
    config: dict[str, Any] = {**_COMMON, "zero_optimization": zero}
    if ds.offload_optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        config["optimizer"] = _OFFLOADED_OPTIMIZER
    if ds.offload_params == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return deep_merge(config, ds.config)
