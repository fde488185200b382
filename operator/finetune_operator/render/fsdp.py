"""The fsdp_config JSON that TrainingArguments reads (transformers 5 keys, FSDP2 by default)."""

from typing import Any

from ..api.distributed import FsdpSpec

_WRAP = {"transformer_based_wrap": "TRANSFORMER_BASED_WRAP", "size_based_wrap": "SIZE_BASED_WRAP",
         "no_wrap": "NO_WRAP"}
_STATE_DICT = {"sharded": "SHARDED_STATE_DICT", "full": "FULL_STATE_DICT"}


def fsdp_config(fsdp: FsdpSpec) -> dict[str, Any]:
    """FSDP2 expresses sharding as reshard_after_forward (bool); FSDP1 takes the strategy name there."""
    config: dict[str, Any] = {
        "version": fsdp.version,
        "auto_wrap_policy": _WRAP[fsdp.auto_wrap_policy],
        "state_dict_type": _STATE_DICT[fsdp.state_dict_type],
        "cpu_offload": fsdp.offload_params,
        "activation_checkpointing": fsdp.activation_checkpointing,
        "cpu_ram_efficient_loading": fsdp.cpu_ram_efficient_loading,
    }
    if fsdp.transformer_layer_classes:
        config["transformer_layer_cls_to_wrap"] = list(fsdp.transformer_layer_classes)
    if fsdp.min_num_params is not None:
        config["min_num_params"] = fsdp.min_num_params
    if fsdp.version == 2:
        config["reshard_after_forward"] = fsdp.sharding_strategy == "full_shard"
    else:
        config["reshard_after_forward"] = fsdp.sharding_strategy.upper()
        config["backward_prefetch"] = "NO_PREFETCH" if fsdp.backward_prefetch == "none" else (
            fsdp.backward_prefetch.upper())
        config["forward_prefetch"] = fsdp.forward_prefetch
        config["use_orig_params"] = True
        config["sync_module_states"] = True
    return config
