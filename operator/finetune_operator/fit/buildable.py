"""What the stack cannot build for a spec and a model's config: refused before any GPU is held (the preflight,
`finetune validate`), and again by the trainer before it loads weights, each with the field, the value and the fix.
Only what the installed libraries are known to refuse (tests/unit/test_fit_moe.py checks each against them)."""

from ..api.spec import FineTuneJobSpec
from .shape import ModelShape

# Architectures transformers has no sdpa attention for: loading one with attn_implementation sdpa raises.
NO_SDPA = frozenset({"gemma2"})


def cannot_build(spec: FineTuneJobSpec, shape: ModelShape) -> list[str]:
    problems = []
    lora = spec.method.lora
    adapted = shape.expert_targets(lora.target_modules) if spec.method.type in ("lora", "qlora") else set()
    if adapted and lora.dropout > 0:
        problems.append(
            f"spec.method.lora.dropout: {lora.dropout:g} cannot be built for {shape.model_type}: peft adapts its fused "
            f"experts ({', '.join(sorted(adapted))}) through a ParamWrapper, which refuses lora_dropout != 0; fix: set "
            "method.lora.dropout: 0, or method.lora.targetModules that leave the experts out "
            "([q_proj, k_proj, v_proj, o_proj])")
    if adapted and lora.use_dora:
        problems.append(
            f"spec.method.lora.useDora: true cannot be built for {shape.model_type}: peft adapts its fused experts "
            f"({', '.join(sorted(adapted))}) through a ParamWrapper, which does not work with DoRA; fix: set "
            "method.lora.useDora: false, or method.lora.targetModules that leave the experts out "
            "([q_proj, k_proj, v_proj, o_proj])")
    if shape.model_type in NO_SDPA and spec.model.attn_implementation == "sdpa":
        problems.append(
            f"spec.model.attnImplementation: sdpa cannot be built for {shape.model_type}: transformers has no sdpa "
            "attention for it (its softcapped scores); fix: set model.attnImplementation: eager")
    return problems
