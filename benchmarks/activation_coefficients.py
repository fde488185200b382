"""Where the activation coefficients of finetune_operator/fit/activations.py come from: decoder layers of each
architecture family, built from small configs on CPU, run forward under torch's saved-tensor hooks (every storage
autograd keeps for backward counted once, in the layer that saved it: tests/support/memory_probe.saved_by_layer),
at shapes that vary hidden, query width, key/value width, intermediate, heads (and experts, top-k, LoRA rank)
independently; a least-squares fit of the bytes per token of one middle layer over those widths gives the
coefficients, with the largest residual beside them (bytes per token).

Sixteen-bit rows run under torch.autocast, as accelerate runs the Trainer's forward. "lora" keeps CPU's dropout
(a mask in the input's dtype), "lora-cuda" CUDA's (a bool mask, ATen's native_dropout), "lora-nodrop" none.
MoE rows also fit the bytes kept per layer whatever the tokens (peft's ParamWrapper keeps W + BA of the experts),
per expert parameter. Family rows fit what a family keeps beyond the shared coefficients (DeepSeek's latent
attention, Qwen2-MoE's shared-expert gate, GLM-4-MoE). Usage:
  .venv/bin/python benchmarks/activation_coefficients.py [--only llama,gemma2,...]    (a few minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

SEQ = 64
DENSE_SHAPES = [  # hidden, heads, head_dim, kv heads, intermediate, LoRA rank
    (64, 4, 16, 2, 96, 4), (96, 4, 16, 2, 96, 8), (64, 4, 32, 1, 160, 4), (64, 2, 16, 2, 96, 16),
    (128, 8, 16, 4, 64, 8), (64, 4, 16, 4, 256, 4), (96, 6, 24, 3, 128, 4)]
MOE_SHAPES = [  # hidden, heads, head_dim, kv heads, intermediate, experts, top-k
    (64, 4, 16, 2, 96, 4, 2), (96, 4, 16, 2, 96, 4, 2), (64, 4, 16, 2, 160, 4, 2), (64, 4, 16, 2, 96, 8, 2),
    (64, 4, 16, 2, 96, 4, 1), (64, 4, 16, 2, 96, 8, 4), (128, 8, 16, 4, 64, 6, 3), (64, 4, 32, 1, 96, 4, 2)]
# (label, model_type, precision, kind, attention)
ROWS = [(f"{arch} {prec} {kind} {attn}", arch, prec, kind, attn)
        for arch, attns in (("llama", ("sdpa", "eager")), ("qwen3", ("sdpa",)), ("gemma2", ("eager",)))
        for prec in ("bf16", "fp32") for attn in attns
        for kind in (("full", "lora", "lora-cuda", "lora-nodrop") if arch == "llama" and attn == "sdpa" else ("full",))]
MOE_ROWS = [(f"{arch} {prec} {kind}", arch, prec, kind) for arch in ("mixtral", "qwen3_moe")
            for prec in ("bf16", "fp32") for kind in ("full", "lora-nodrop")]


def _ids(batch: int, vocab: int):
    import torch

    return torch.randint(0, vocab, (batch, SEQ), generator=torch.Generator().manual_seed(0))


def dense_fit(arch: str, prec: str, kind: str, attention: str) -> tuple[list[str], list[float], float]:
    import numpy as np
    import torch

    from tests.support.memory_probe import add_lora, build_model, cuda_dropout, model_config, saved_by_layer

    names = ["hidden", "q width", "kv width", "intermediate", "heads"] + (
        ["heads x seq"] if attention == "eager" else []) + (["rank x 7"] if kind.startswith("lora") else [])
    rows, ys = [], []
    dtype = torch.bfloat16 if prec == "bf16" else torch.float32
    for h, heads, hd, kv, i, r in DENSE_SHAPES:
        extra = {"query_pre_attn_scalar": hd, "sliding_window": 4096} if arch == "gemma2" else {}
        config = model_config(arch, hidden=h, layers=3, heads=heads, kv_heads=kv, intermediate=i, vocab=256,
                              head_dim=hd, attention=attention, **extra)
        model = build_model(config, dtype)
        if kind.startswith("lora"):
            model = add_lora(model, r=r, dropout=0.0 if kind == "lora-nodrop" else 0.05)
        with cuda_dropout() if kind == "lora-cuda" else contextlib.nullcontext():
            per_layer, _ = saved_by_layer(model, _ids(2, 256), autocast=torch.bfloat16 if prec == "bf16" else None)
        rows.append([h, heads * hd, kv * hd, i, heads] + ([heads * SEQ] if attention == "eager" else [])
                    + ([r * 7] if kind.startswith("lora") else []))
        ys.append(per_layer[1] / (2 * SEQ))
    a, y = np.array(rows, float), np.array(ys)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return names, list(coef), float(np.max(np.abs(a @ coef - y)))


def moe_fit(arch: str, prec: str, kind: str) -> tuple[list[str], list[float], float, float]:
    import numpy as np
    import torch

    from tests.support.memory_probe import add_lora, build_model, model_config, saved_by_layer

    names = ["hidden", "q width", "kv width", "intermediate x top-k", "hidden x top-k", "experts", "heads"]
    rows, ys, per_param = [], [], []
    dtype = torch.bfloat16 if prec == "bf16" else torch.float32
    for h, heads, hd, kv, i, e, k in MOE_SHAPES:
        config = model_config(arch, hidden=h, layers=3, heads=heads, kv_heads=kv, intermediate=i, vocab=256,
                              head_dim=hd, experts=e, top_k=k)
        kept = []
        for batch in (2, 4):
            model = build_model(config, dtype)
            if kind.startswith("lora"):
                model = add_lora(model, r=4, dropout=0.0)
            per_layer, _ = saved_by_layer(model, _ids(batch, 256), autocast=torch.bfloat16 if prec == "bf16" else None)
            kept.append(per_layer[1])
        slope = (kept[1] - kept[0]) / (2 * SEQ)
        rows.append([h, heads * hd, kv * hd, i * k, h * k, e, heads])
        ys.append(slope)
        per_param.append((kept[0] - slope * 2 * SEQ) / (e * 3 * h * i))
    a, y = np.array(rows, float), np.array(ys)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return names, list(coef), float(np.max(np.abs(a @ coef - y))), max(per_param)


# Family extras on top of the shared coefficients: (label, model_type, layer, the extra's constants in
# activations.py, regressor names, shapes). Each shape is the config's own keys; the fit is of what that layer keeps
# beyond what the estimate counts with those constants set to zero.
_MLA_BASE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, n_shared_experts=1,
                 first_k_dense_replace=1, n_group=1, topk_group=1, num_hidden_layers=1, hidden_size=256,
                 intermediate_size=512)
FAMILY_ROWS = [
    ("deepseek_v3 latent attention (dense layer)", "deepseek_v3", 0, ("_MLA", "MLA_MATH_SDPA_SCORE_BYTES"),
     ["q_lora_rank", "kv_lora_rank", "heads x (nope + rope)", "heads x v", "heads x seq"],
     [{**_MLA_BASE, "q_lora_rank": q or None, "kv_lora_rank": kv, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
       "v_head_dim": v, "num_attention_heads": heads, "num_key_value_heads": heads}
      for q, kv, nope, v, rope, heads in [(0, 64, 32, 32, 16, 8), (96, 64, 32, 32, 16, 8), (192, 64, 32, 32, 16, 8),
                                          (96, 128, 32, 32, 16, 8), (96, 64, 64, 32, 16, 8), (96, 64, 32, 64, 16, 8),
                                          (96, 64, 32, 32, 32, 8), (96, 64, 32, 32, 16, 4), (0, 128, 64, 64, 32, 4)]]),
    ("qwen2_moe shared expert gate (MoE layer)", "qwen2_moe", 0, ("_SHARED_GATE_H",), ["hidden"],
     [dict(num_hidden_layers=1, hidden_size=h, num_attention_heads=4, num_key_value_heads=2, num_experts=e,
           num_experts_per_tok=2, moe_intermediate_size=i, shared_expert_intermediate_size=sh, intermediate_size=512)
      for h, sh, i, e in [(256, 256, 128, 4), (128, 256, 128, 4), (256, 512, 128, 4), (256, 256, 64, 8),
                          (192, 128, 96, 4)]]),
    ("glm4_moe query copy (dense layer)", "glm4_moe", 0, ("_QUERY_COPY",), ["q width", "kv width"],
     [{**_MLA_BASE, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
       "partial_rotary_factor": prf} for heads, kv, hd, prf in [(8, 8, 32, .5), (8, 2, 32, .5), (4, 2, 32, .5),
                                                                 (8, 4, 64, .5), (8, 4, 32, .25), (8, 4, 32, 1.)]]),
    ("glm4_moe sigmoid router (MoE layer)", "glm4_moe", 0, ("_SIGMOID_ROUTER_H",), ["hidden"],
     [{**_MLA_BASE, "first_k_dense_replace": 0, "hidden_size": h, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 32, "moe_intermediate_size": i, "n_routed_experts": e}
      for h, i, e in [(256, 128, 4), (128, 128, 4), (256, 64, 8)]]),
]


def family_fit(model_type: str, layer: int, zeroed: tuple[str, ...], names: list[str], shapes: list[dict],
               prec: str):
    """What one layer keeps beyond the estimate with the family's extra (`zeroed`) set to zero, fitted over the
    regressors."""
    from unittest import mock

    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from finetune_operator.fit import ModelShape
    from finetune_operator.fit import activations as act
    from tests.support.memory_probe import saved_by_layer

    dtype, compute = (torch.bfloat16, 2) if prec == "bf16" else (torch.float32, 4)
    def zeros(value):
        return {k: zeros(v) for k, v in value.items()} if isinstance(value, dict) else (
            tuple(0.0 for _ in value) if isinstance(value, tuple) else 0.0)

    zero = {name: zeros(getattr(act, name)) for name in zeroed}
    rows, ys = [], []
    for extra in shapes:
        config = AutoConfig.for_model(model_type, **{"vocab_size": 4000, "tie_word_embeddings": False,
                                                     "use_cache": False, **extra})
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype)
        shape = ModelShape.from_config({**config.to_dict(), "torch_dtype": "float32"})
        per_layer, _ = saved_by_layer(model, _ids(2, 4000), autocast=torch.bfloat16 if prec == "bf16" else None)
        with mock.patch.multiple(act, **zero):
            base = act.layer_bytes_per_token(shape, compute, "sdpa", SEQ, moe=layer >= shape.dense_layers, gpu=False)
        qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
        regressors = {"q_lora_rank": shape.q_lora_rank, "kv_lora_rank": shape.kv_lora_rank,
                      "heads x (nope + rope)": shape.heads * qk, "heads x v": shape.heads * shape.v_head_dim,
                      "heads x seq": shape.heads * SEQ, "hidden": shape.hidden, "q width": shape.q_width,
                      "kv width": shape.kv_width}
        rows.append([regressors[n] for n in names])
        ys.append(per_layer[layer] / (2 * SEQ) - base)
    a, y = np.array(rows, float), np.array(ys)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return list(coef), float(np.max(np.abs(a @ coef - y)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated model types")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    only = set(args.only.split(",")) if args.only else None
    for label, arch, prec, kind, attention in ROWS:
        if only is None or arch in only:
            names, coef, residual = dense_fit(arch, prec, kind, attention)
            print(f"{label}: " + ", ".join(f"{n} {c:.2f}" for n, c in zip(names, coef, strict=True))
                  + f" (largest residual {residual:.1f} B/token)", flush=True)
    for label, arch, prec, kind in MOE_ROWS:
        if only is None or arch in only:
            names, coef, residual, per_param = moe_fit(arch, prec, kind)
            print(f"{label}: " + ", ".join(f"{n} {c:.2f}" for n, c in zip(names, coef, strict=True))
                  + f" (largest residual {residual:.1f} B/token); kept per layer: {per_param:.3f} B per expert "
                    "parameter", flush=True)
    for label, model_type, layer, zeroed, names, shapes in FAMILY_ROWS:
        if only is None or model_type in only:
            for prec in ("bf16", "fp32"):
                coef, residual = family_fit(model_type, layer, zeroed, names, shapes, prec)
                print(f"{label} {prec}, beyond the shared coefficients: "
                      + ", ".join(f"{n} {c:.2f}" for n, c in zip(names, coef, strict=True))
                      + f" (largest residual {residual:.1f} B/token)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
