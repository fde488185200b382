"""Keeps the libraries a job cannot use out of its process.

transformers, accelerate and peft import DeepSpeed and bitsandbytes whenever they are installed (as they are in
the trainer image), and each costs seconds of CPU at start-up in every training process (DeepSpeed ~2 s, pulled in
by accelerate's model unwrapping; bitsandbytes ~2-3 s with the torch.compile machinery it loads): time before the
first step on every attempt and every restart. A None entry in sys.modules is Python's documented way to make a
module unimportable: `importlib.util.find_spec` answers None, so the libraries' own availability checks say "not
installed" and take the paths they take without it."""

import json
import logging
import sys
from pathlib import Path

from finetune_operator.api.spec import FineTuneJobSpec

log = logging.getLogger(__name__)


def unused_libraries(spec: FineTuneJobSpec) -> list[str]:
    """The optional libraries this job cannot use: DeepSpeed unless its strategy is deepspeed; bitsandbytes on a
    CPU job that quantizes nothing and loads no checkpoint that was saved quantized (validation refuses
    bitsandbytes quantization without GPUs; a quantized checkpoint would need it to load)."""
    unused = []
    if spec.distributed.strategy != "deepspeed" and spec.distributed.deepspeed is None:
        unused.append("deepspeed")
    if (spec.distributed.gpus_per_node == 0 and spec.model.quantization == "none"
            and not _saved_quantized(spec.model.name)):
        unused.append("bitsandbytes")
    return unused


def leave_out(names: list[str]) -> None:
    """Makes each named library unimportable in this process; one already imported stays (nothing to save)."""
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
    if names:
        log.debug("not loading %s: this job does not use them", ", ".join(names))


def _saved_quantized(model: str) -> bool:
    """A local checkpoint whose config says it was saved quantized. A Hub id is not looked up (no download
    before the job needs one): a quantized checkpoint is a GPU job's anyway."""
    config = Path(model) / "config.json"
    try:
        return "quantization_config" in json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
