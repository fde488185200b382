"""The fit check the preflight runs and `finetune validate` prints: the estimate against one GPU's memory."""

from dataclasses import dataclass
from typing import Any

from ..api.spec import FineTuneJobSpec
from .advice import Suggestion, what_fits
from .estimate import GIB, WARN_FRACTION, MemoryEstimate, estimate
from .gpus import capacity_gib
from .shape import ModelShape


@dataclass(frozen=True)
class FitVerdict:
    estimate: MemoryEstimate
    capacity_gib: float | None
    capacity_source: str
    suggestion: Suggestion | None

    @property
    def fits(self) -> bool:
        return self.capacity_gib is None or self.estimate.needed <= self.capacity_gib * GIB

    @property
    def tight(self) -> bool:
        """Fits, but above 90% of the GPU: a longer batch than the data showed so far could still tip it over."""
        return self.fits and self.capacity_gib is not None and self.estimate.needed > WARN_FRACTION * \
            self.capacity_gib * GIB

    def message(self) -> str:
        est, cap = self.estimate, self.capacity_gib
        needed = f"{est.needed / GIB:.1f} GiB per GPU"
        largest = f"largest term: {est.largest} {est.terms[est.largest] / GIB:.1f} GiB"
        if cap is None:
            return f"predicted {needed} ({largest}); no GPU memory known to compare with: set " \
                   "spec.resources.gpuMemoryGiB or an nvidia.com/gpu.product node selector"
        share = f"{needed} of {cap:g} GiB ({self.capacity_source})"
        if self.fits:
            return f"predicted {share}, {100 * est.needed / GIB / cap:.0f}%; {largest}" + (
                " (above 90%: little room for longer batches)" if self.tight else "")
        remedy = (f"what fits: {self.suggestion.describe(cap)}" if self.suggestion else
                  "nothing we know of fits one GPU of this size: more GPUs (ZeRO-3 shards states over them) "
                  "or a GPU with more memory")
        return f"does not fit: needs {share}; {largest}; {remedy}"

    def to_status(self) -> dict[str, Any]:
        out = self.estimate.to_status(self.capacity_gib)
        out["fits"] = self.fits
        if self.suggestion is not None and not self.fits:
            out["suggestion"] = self.suggestion.change
        return out


def check_fit(spec: FineTuneJobSpec, config: dict[str, Any]) -> FitVerdict:
    """`config`: the model's config.json. Raises UnknownShape for a config we cannot read a transformer from."""
    shape = ModelShape.from_config(config)
    est = estimate(spec, shape)
    cap, source = capacity_gib(spec) if spec.distributed.gpus_per_node > 0 else (None, "")
    suggestion = what_fits(spec, shape, cap) if cap is not None and est.needed > cap * GIB else None
    return FitVerdict(est, cap, source, suggestion)
