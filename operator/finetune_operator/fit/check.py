"""The fit check the preflight runs, `finetune validate` prints and the trainer repeats before it loads weights:
what the stack cannot build, the estimate against one GPU's memory, and offloaded states against the pod's."""

from dataclasses import dataclass, field, replace
from typing import Any

from ..api.spec import FineTuneJobSpec
from .advice import Suggestion, what_fits
from .buildable import cannot_build
from .estimate import GIB, WARN_FRACTION, MemoryEstimate, estimate
from .gpus import capacity_gib
from .host import host_shortfall
from .shape import ModelShape
from .vllm import vllm_share, vllm_shortfall


@dataclass(frozen=True)
class FitVerdict:
    estimate: MemoryEstimate
    capacity_gib: float | None
    capacity_source: str  # where the capacity comes from, or why there is none
    suggestions: list[Suggestion] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what cannot be built at all
    host: str | None = None  # why the pod's memory cannot hold the offloaded states

    @property
    def suggestion(self) -> Suggestion | None:
        return self.suggestions[0] if self.suggestions else None

    @property
    def gpu_fits(self) -> bool:
        return self.capacity_gib is None or self.estimate.needed <= self.capacity_gib * GIB

    @property
    def fits(self) -> bool:
        """Buildable, within the GPU (when its memory is known) and, with offload, within the pod's memory."""
        return not self.problems and self.gpu_fits and self.host is None

    @property
    def checked(self) -> bool:
        """Compared with a known GPU memory (or found unbuildable): False means the estimate could only report."""
        return (self.capacity_gib is not None and not self.estimate.uncounted) or bool(self.problems)

    @property
    def tight(self) -> bool:
        """Fits, but above 90% of the GPU: a longer batch than the data showed so far could still tip it over."""
        return self.fits and self.capacity_gib is not None and self.estimate.needed > WARN_FRACTION * \
            self.capacity_gib * GIB

    def message(self) -> str:
        if self.problems:
            return "cannot be built: " + "; ".join(self.problems)
        est, cap = self.estimate, self.capacity_gib
        needed = f"{est.needed / GIB:.1f} GiB per GPU"
        largest = f"largest term: {est.largest} {est.terms[est.largest] / GIB:.1f} GiB"
        if cap is None:
            return f"predicted {needed} ({largest}); not checked: {self.capacity_source}"
        if self.gpu_fits and self.host is None and est.uncounted:
            return (f"predicted {needed} of {cap:g} GiB ({largest}), without {'; '.join(est.uncounted)}: not "
                    "checked, the job may need more")
        share = f"{needed} of {cap:g} GiB ({self.capacity_source})"
        if not self.gpu_fits:
            remedies = [s.describe(cap) for s in self.suggestions]
            remedy = ("what fits: " + "; or ".join(remedies) if remedies else
                      "nothing we know of fits one GPU of this size: more GPUs (ZeRO-3 shards states over them) "
                      "or a GPU with more memory")
            return f"does not fit: needs {share}; {largest}; {remedy}"
        if self.host is not None:
            return f"does not fit the pod: {self.host}; raise spec.resources.memory, or offload less"
        return f"predicted {share}, {100 * est.needed / GIB / cap:.0f}%; {largest}" + (
            " (above 90%: little room for longer batches)" if self.tight else "")

    def to_status(self) -> dict[str, Any]:
        out = self.estimate.to_status(self.capacity_gib)
        out["fits"] = self.fits
        if self.suggestions and not self.fits:
            out["suggestion"] = self.suggestions[0].change
            out["alternatives"] = [s.change for s in self.suggestions[1:]]
        return out


def check_fit(spec: FineTuneJobSpec, config: dict[str, Any], capacity: tuple[float, str] | None = None,
              tokenizer_vocab: int | None = None) -> FitVerdict:
    """`config`: the model's config.json; `capacity`: (GiB, where from) of the GPU when known better than the spec
    says (the trainer's own device); `tokenizer_vocab`: the tokenizer's size where known, which grows the embedding
    and head when larger (they then train). Raises UnknownShape for a config we cannot read a transformer from. With
    GRPO's vLLM, training is checked against what vLLM's share leaves, and the share against what vLLM needs."""
    shape = ModelShape.from_config(config)
    if tokenizer_vocab is not None and tokenizer_vocab > shape.vocab:
        shape = replace(shape, vocab=tokenizer_vocab, embeddings_grown=True)
    est = estimate(spec, shape)
    if spec.distributed.gpus_per_node == 0:
        cap, source = None, "a CPU job"
    else:
        cap, source = capacity if capacity is not None else capacity_gib(spec)
    problems = cannot_build(spec, shape)
    share = vllm_share(spec)
    if cap is not None and share is not None:
        shortfall = vllm_shortfall(spec, shape, cap * share)
        problems += [shortfall] if shortfall else []
        cap, source = round(cap * (1 - share), 2), (f"{source}, less vLLM's {share:g} "
                                                     "(method.grpo.vllmGpuMemoryUtilization)")
    fits_gpu = cap is None or est.needed <= cap * GIB
    host = host_shortfall(spec, est)
    suggestions = what_fits(spec, shape, cap) if cap is not None and not fits_gpu else []
    return FitVerdict(est, cap, source, suggestions, problems, host)
