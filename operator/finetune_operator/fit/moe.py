"""What the stack does with a mixture-of-experts model, as the memory estimate must count it.

transformers 5 stores every MoE layer's experts as fused 3-D parameters (gate_up_proj: experts x 2 intermediate x
hidden, down_proj: experts x hidden x intermediate) and its router as a module of its own, neither an nn.Linear. So:
- bitsandbytes quantizes nn.Linear layers only: the experts, nearly all of a MoE's weights, stay in 16 bits, and
  peft's prepare_model_for_kbit_training then upcasts them to fp32 with every other non-quantized parameter;
- peft's "all-linear" finds the attention projections only, but its v4->v5 conversion maps the old expert and router
  names onto the fused parameters for the model types below, and wraps them (lora.ParamWrapper): then each layer
  builds W + BA for its experts in the forward and keeps it for the backward (parameter-sized, per layer), and
  peft refuses lora_dropout != 0 ("lora.ParamWrapper does not work with lora_dropout != 0").

PEFT_EXPERT_TARGETS mirrors peft.utils.transformers_weight_conversion (its _MODEL_TO_CONVERSION_PATTERN narrowed to
the patterns of _MOE_TARGET_MODULE_MAPPING): the old module name a target list may use -> what it adapts.
tests/unit/test_fit_moe.py compares it with the installed peft."""

_MIXTRAL = {"gate": "router", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"}
_QWEN2_MOE = {"gate": "router", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}

PEFT_EXPERT_TARGETS: dict[str, dict[str, str]] = {
    **dict.fromkeys(("minimax", "minimax_m2", "mixtral"), _MIXTRAL),
    **dict.fromkeys((
        "Dots3NoteTextModel", "UnlimitedOcrTextModel", "afmoe", "beam", "cohere2_moe", "deepseek_v2", "deepseek_v3",
        "deepseek_v32", "dots1", "ernie4_5_moe", "exaone_moe", "flex_olmo", "glm4_moe", "glm4_moe_lite", "glm4v_moe",
        "glm_moe_dsa", "hunyuan_v1_moe", "longcat_flash", "mellum", "olmoe", "qwen3_moe", "qwen3_next",
        "qwen3_omni_moe", "qwen3_omni_moe_text", "qwen3_omni_moe_thinker", "solar_open"), _QWEN2_MOE),
}
