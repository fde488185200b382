"""The memory fit check again in each attempt, before its weights load: the preflight (spec.runPolicy.preflight)
checks before any GPU is held, but is off by default; this runs whatever the spec says, against the GPU the
process actually got (torch's total, no label needed).

- What the stack cannot build (finetune_operator.fit.buildable) is refused (78), as the preflight would have.
- A job whose predicted peak, without the estimate's margin, exceeds the GPU's whole memory cannot fit: refused
  (78) with the numbers and the changes that fit, instead of a CUDA out-of-memory error after the load and the
  first step. Where the estimate does not model what the job runs (torch_compile), only a warning.
- Above the GPU with the margin and the CUDA context, but not certainly: a warning (MemoryTight)."""

from typing import Any

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.errors import ConfigError


def device_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30


def model_config(spec: FineTuneJobSpec) -> dict[str, Any] | None:
    """The model's config.json as the estimate reads it (None where transformers cannot load it: the load itself
    will say why)."""
    from transformers import AutoConfig

    from finetune_trainer.training.model import _revision, source

    m = spec.model
    name = source(m.name, configs_only=True)
    try:
        config = AutoConfig.from_pretrained(name, revision=_revision(name, m.revision),
                                            trust_remote_code=m.trust_remote_code)
    except (OSError, ValueError):
        return None
    return config.to_dict()


def check_before_loading(spec: FineTuneJobSpec, vocab_size: int, warn) -> None:
    from finetune_operator.fit import GIB, UnknownShape, check_fit
    from finetune_operator.fit.estimate import ESTIMATE_MARGIN

    config = model_config(spec)
    if config is None:
        return
    gib = device_gib() if spec.distributed.gpus_per_node > 0 else None
    try:
        verdict = check_fit(spec, config, capacity=(gib, "this GPU, as torch reports it") if gib else None,
                            tokenizer_vocab=vocab_size)
    except UnknownShape:
        return
    if verdict.problems:
        raise ConfigError(f"memory: {verdict.message()}")
    if gib is None or verdict.gpu_fits:
        return
    central = verdict.estimate.peak / (1 + ESTIMATE_MARGIN)
    if central > gib * GIB and verdict.estimate.complete:
        raise ConfigError(f"memory: {verdict.message()}")
    warn("MemoryTight", f"this GPU may run out of memory: {verdict.message()}")
