"""What torch holds, counted on CPU the way torch.cuda.max_memory_allocated counts on a GPU: every storage an op
creates, from its creation until it dies, and the peak of their sum. The memory fit estimate is measured against it
(tests/unit/test_fit_measured.py, benchmarks/memory_measured.py).

`PeakTracker` is a TorchDispatchMode: it sees every aten op of the thread that entered it (forward, the autograd
engine's backward on CPU, optimizer steps, DeepSpeed's flat buffers, collectives' buffers), notes each new output
storage once and drops it from the live sum when the storage is freed (a weak reference's callback). Tensors that
existed before it was entered are counted with `track`. Slow (a Python call per op): small models, few steps."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakTracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def track(self, tensors: Iterable[Any]) -> None:
        """Count tensors (or anything with tensors inside: a module's parameters, an optimizer's state) that exist
        already."""
        for t in tensors:
            self._note(t)

    def reset_peak(self) -> None:
        self.peak = self.live

    def restart(self, tensors: Iterable[Any]) -> None:
        """Forget everything counted so far and count `tensors`: what exists on the device when training starts.
        On a GPU, the loaded checkpoint's CPU tensors and the tokenized data were never device memory; on CPU they
        would be counted too."""
        self._sizes.clear()
        self.live = 0
        self.track(tensors)
        self.reset_peak()

    def _note(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta" or t.is_sparse:
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
            return
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._sizes:
            return
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self._note(t)
        return out


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> list[torch.Tensor]:
    """Parameters (ZeRO-3's partitions too), buffers, gradients and optimizer states: what exists between steps."""
    out = [*model.parameters(), *model.buffers()]
    out += [p.ds_tensor for p in model.parameters() if getattr(p, "ds_tensor", None) is not None]
    out += [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        out += [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return out


# --- models of a given architecture, built from small configs ------------------------------------------------------
def model_config(model_type: str, *, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                 vocab: int, head_dim: int | None = None, experts: int = 0, top_k: int = 2,
                 attention: str = "sdpa", **extra: Any):
    """A transformers config of `model_type` with this shape (MoE keys by the names each architecture uses)."""
    from transformers import AutoConfig

    kwargs: dict[str, Any] = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                  num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                                  tie_word_embeddings=False, use_cache=False, max_position_embeddings=8192)
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    if experts:
        if model_type == "mixtral":
            kwargs.update(num_local_experts=experts, num_experts_per_tok=top_k)
        else:  # qwen2_moe, qwen3_moe, olmoe: the experts' own width
            kwargs.update(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=intermediate)
            if model_type == "qwen2_moe":
                kwargs["shared_expert_intermediate_size"] = intermediate
    config = AutoConfig.for_model(model_type, **{**kwargs, **extra})
    config._attn_implementation = attention
    return config


def build_model(config, dtype=None):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=config._attn_implementation)
    return model.to(dtype) if dtype is not None else model


def add_lora(model, r: int = 8, dropout: float = 0.05, targets: str | list[str] = "all-linear"):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=dropout, target_modules=targets,
                                            task_type="CAUSAL_LM"))


class cuda_dropout:
    """Dropout as CUDA runs it (ATen's native_dropout: a bool mask), where CPU's dropout keeps its mask in the
    input's dtype: what a GPU job keeps, measured on CPU."""

    def __enter__(self):
        self._original = torch.nn.Dropout.forward
        torch.nn.Dropout.forward = lambda module, x: (torch.native_dropout(x, module.p, module.training)[0]
                                                      if module.training and module.p > 0 else x)
        return self

    def __exit__(self, *exc):
        torch.nn.Dropout.forward = self._original


def decoder_layers(model) -> list[torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.model.layers)


def saved_by_layer(model, ids: torch.Tensor, autocast: torch.dtype | None = None) -> tuple[list[int], int]:
    """(bytes autograd keeps for backward inside each decoder layer, bytes kept outside them: embeddings, final
    norm, head, loss) for one forward of `ids` with labels. Each storage is counted once, where it is first saved;
    parameters are not counted (they exist anyway)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    layers = decoder_layers(model)
    seen: set[int] = set()
    per_layer = [0] * len(layers)
    outside = 0
    current: list[int | None] = [None]

    def pack(t):
        nonlocal outside
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in params or key in seen or storage.nbytes() == 0:
            return t
        seen.add(key)
        if current[0] is None:
            outside += storage.nbytes()
        else:
            per_layer[current[0]] += storage.nbytes()
        return t

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda _m, _a, i=i: current.__setitem__(0, i)))
        handles.append(layer.register_forward_hook(lambda _m, _a, _o: current.__setitem__(0, None)))
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = model(input_ids=ids, labels=ids).loss
    finally:
        for h in handles:
            h.remove()
    del loss
    return per_layer, outside
