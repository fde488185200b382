"""CPU memory a node needs for what a job moves off its GPUs (DeepSpeed or FSDP offload), against the pod's memory
(spec.resources.memory): an offload that does not fit the pod fails the same way, in the kernel's OOM killer
instead of CUDA's."""

import re

from ..api.spec import FineTuneJobSpec
from .estimate import GIB, MemoryEstimate

# Beside what is offloaded, each training process holds its own runtime (Python, torch, CUDA libraries, pinned
# staging buffers, the tokenizer and a data loader): a stated allowance per process.
PROCESS_HOST_GIB = 4.0
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 10**-3,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_bytes(quantity: str) -> float:
    """A Kubernetes quantity (already checked against the apiserver's grammar by the spec) in bytes."""
    match = re.fullmatch(r"([+-]?[0-9.]+)(?:[eE]([+-]?[0-9]+))?([a-zA-Z]*)", quantity.strip())
    if not match or match.group(3) not in _UNITS:
        raise ValueError(f"not a memory quantity: {quantity}")
    number = float(match.group(1)) * (10 ** int(match.group(2)) if match.group(2) else 1)
    return number * _UNITS[match.group(3)]


def host_bytes_per_node(spec: FineTuneJobSpec, est: MemoryEstimate) -> float:
    """What offloading puts in one node's CPU memory, with each process's own allowance; 0 without offload."""
    offloaded = sum(est.offloaded.values())
    if not offloaded:
        return 0.0
    return (offloaded + PROCESS_HOST_GIB * GIB) * spec.distributed.processes_per_node


def host_shortfall(spec: FineTuneJobSpec, est: MemoryEstimate) -> str | None:
    """Why the pod's memory cannot hold what the job offloads, with the fix; None when it can or nothing is
    offloaded, or when the pod states no memory (then the node's is the limit, which the spec does not say)."""
    need = host_bytes_per_node(spec, est)
    memory = spec.resources.memory
    if not need or memory is None or need <= quantity_bytes(memory):
        return None
    return (f"the offloaded states need {need / GIB:.0f} GiB of CPU memory per node "
            f"({spec.distributed.processes_per_node} processes x {sum(est.offloaded.values()) / GIB:.1f} GiB offloaded"
            f" + {PROCESS_HOST_GIB:g} GiB each for the process) but spec.resources.memory is {memory}")
