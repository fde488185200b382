"""Checkpoints are data: nothing a trainer process loads may run code while it is unpickled.

A run resumes from its output (a claim, a bucket prefix), which people and pods other than the trainer may write:
whoever can write there must not run code beside the credentials a runtime lends the job. `torch.load` runs no code
with `weights_only=True`, and transformers, accelerate and peft ask for it; DeepSpeed does not
(`TorchCheckpointEngine` and its universal checkpoints pass `weights_only=False`), nor does
`torch.distributed.checkpoint` (FSDP's sharded checkpoints: `pickle.load` of `.metadata`, `weights_only=False` for
the entries it stores as bytes). So every `torch.load` of the process is made weights-only (torch's own switch,
inherited by every child process), the classes DeepSpeed's checkpoints hold are allowed by name, and the sharded
checkpoints' metadata is read through torch's weights-only unpickler with its classes allowed the same way.
"""

import os
import pickle
from typing import IO, Any

FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
# torch raises when both are set; this one is dropped (the operator refuses it in pod.env).
UNFORCE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def deepspeed_classes() -> list[Any]:
    """The non-tensor classes DeepSpeed's ZeRO checkpoints hold: plain data, built from their fields, no method of
    theirs runs while loading."""
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:  # no DeepSpeed in this process's image: nothing of it to load
        return []
    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


# What torch.distributed.checkpoint's .metadata holds besides containers and primitives (and torch's dtypes).
DCP_METADATA_NAMES = frozenset({
    "torch.Size", "torch.serialization._get_layout", "pathlib.PosixPath", "pathlib.PurePosixPath",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    *(f"torch.distributed.checkpoint.metadata.{name}" for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")),
})


class DataOnlyUnpickler(pickle.Unpickler):
    """An unpickler that builds only the classes named above: a pickle naming any other callable (os.system, a
    module's function, a class with side effects) is refused before anything of it runs."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if f"{module}.{name}" in DCP_METADATA_NAMES or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not data a checkpoint's metadata holds; the file was not "
                                     "written by torch.distributed.checkpoint and is not loaded")


class _DataOnlyPickle:
    """What torch.distributed.checkpoint.filesystem calls `pickle`: writes as pickle does, reads data only."""

    dump = staticmethod(pickle.dump)
    dumps = staticmethod(pickle.dumps)
    UnpicklingError = pickle.UnpicklingError
    HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL

    @staticmethod
    def load(file: IO[bytes], **_: Any) -> Any:
        return DataOnlyUnpickler(file).load()


def enforce() -> None:
    """Makes every later load of this process (and the torch.load of its children) data only. Idempotent."""
    os.environ[FORCE] = "1"
    os.environ.pop(UNFORCE, None)
    import torch
    import torch.distributed.checkpoint.filesystem as dcp_filesystem

    torch.serialization.add_safe_globals(deepspeed_classes())
    dcp_filesystem.pickle = _DataOnlyPickle  # type: ignore[assignment]


REFUSALS = ("Weights only load failed", "is not data a checkpoint's metadata holds")


def refusal(exc: BaseException) -> str | None:
    """The loader's refusal of something that is not data, when `exc` (or what it wraps: DeepSpeed and
    torch.distributed.checkpoint re-raise) is one; else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        for marker in REFUSALS:
            if marker in text:
                lines = text.splitlines()  # torch names the class it refused on a line of its own
                line = next((ln for ln in lines if "GLOBAL" in ln), None) or next(ln for ln in lines if marker in ln)
                return line.strip()[:300]
        current = current.__cause__ or current.__context__
    return None


def not_data(checkpoint: str, why: str) -> str:
    return (f"the checkpoint {checkpoint} holds something other than tensors and plain data ({why}); it was not "
            "loaded and nothing in it ran. This trainer never writes such a file: someone or something else wrote "
            "into the job's output. Find out who can write there, then delete that checkpoint or set "
            "checkpoints.resume: never")
