"""Will it fit? Peak GPU memory of a FineTuneJob, predicted from the spec and the model's config.json."""

from .advice import Suggestion, what_fits
from .check import FitVerdict, check_fit
from .estimate import GIB, WARN_FRACTION, MemoryEstimate, estimate, sequence_length
from .gpus import capacity_gib, gpu_memory_gib
from .shape import ModelShape, UnknownShape

__all__ = ["GIB", "WARN_FRACTION", "FitVerdict", "MemoryEstimate", "ModelShape", "Suggestion", "UnknownShape",
           "capacity_gib", "check_fit", "estimate", "gpu_memory_gib", "sequence_length", "what_fits"]
