"""Memory of one GPU, from the product label GPU feature discovery puts on nodes (nvidia.com/gpu.product) or from
the spec (resources.gpuMemoryGiB, which wins). GiB as nvidia-smi reports the total (MiB / 1024).

A label names one product: the names below are matched as whole dash-separated words, longest first, so GH200 is
not an H200 and A100-SXM4-40GB not the 80 GB A100. A MIG slice (…-MIG-1g.10gb, GPU feature discovery's "single"
strategy) is the slice's memory, not the card's. A label we do not know gives no capacity, said as such (the check
cannot compare), never a guess."""

import re

from ..api.spec import FineTuneJobSpec

PRODUCT_LABEL = "nvidia.com/gpu.product"

# (product words, GiB). nvidia-smi totals where known; newer parts from their HBM/GDDR size at B200's visible share
# (179.1 of 192 GB) or a little below. A longer name wins over a shorter one it contains.
GPU_MEMORY_GIB: tuple[tuple[str, float], ...] = (
    ("GB300", 268.0), ("B300", 268.0), ("GB200", 184.0), ("B200", 179.1), ("B100", 179.1),
    ("GH200-144G", 140.4), ("GH200", 95.6), ("H200", 140.4), ("H100-NVL", 93.6), ("H100", 79.6), ("H800", 79.6),
    ("H20", 95.6), ("A100-SXM4-40GB", 40.0), ("A100-PCIE-40GB", 40.0), ("A100-40GB", 40.0), ("A100", 80.0),
    ("A800", 80.0), ("A40", 45.0), ("A30", 24.0), ("A16", 15.0), ("A10G", 22.5), ("A10", 22.5), ("A2", 15.0),
    ("L40S", 45.0), ("L40", 45.0), ("L20", 45.0), ("L4", 22.5),
    ("RTX-PRO-6000", 95.6), ("RTX-6000-Ada", 48.0), ("RTX-A6000", 48.0), ("A6000", 48.0), ("RTX-5090", 31.8),
    ("RTX-4090", 24.0), ("RTX-3090", 24.0), ("4090", 24.0), ("3090", 24.0),
    ("V100-SXM2-32GB", 32.0), ("V100-PCIE-32GB", 32.0), ("V100S", 32.0), ("V100-32GB", 32.0), ("V100", 16.0),
    ("T4", 15.0), ("MI355X", 288.0), ("MI325X", 256.0), ("MI300X", 192.0),
    ("MI250X", 64.0), ("MI250", 64.0),  # one GCD a device
)
_MIG = re.compile(r"-MIG-(\d+)g\.(\d+)gb", re.IGNORECASE)
# A MIG profile's name rounds its memory up (an A100-80GB's 1g.10gb has 9.5 GiB, its 3g.40gb 39.25): counted at 95%.
MIG_SHARE = 0.95


def _words(label: str) -> list[str]:
    return [w for w in re.split(r"[-_ ]+", label.upper()) if w]


def _contains(words: list[str], name: str) -> bool:
    wanted = _words(name)
    return any(words[i:i + len(wanted)] == wanted for i in range(len(words) - len(wanted) + 1))


def gpu_memory_gib(product: str) -> float | None:
    """GiB of one GPU (or MIG slice) of a product label; None for a product we do not know."""
    mig = _MIG.search(product)
    if mig:
        return round(int(mig.group(2)) * MIG_SHARE, 2)
    words = _words(product)
    for name, gib in sorted(GPU_MEMORY_GIB, key=lambda item: -len(_words(item[0]))):
        if _contains(words, name):
            return gib
    return None


def capacity_gib(spec: FineTuneJobSpec) -> tuple[float | None, str]:
    """(GiB of one GPU, where that figure comes from, or why there is none)."""
    if spec.resources.gpu_memory_gib is not None:
        return spec.resources.gpu_memory_gib, "spec.resources.gpuMemoryGiB"
    product = spec.pod.node_selector.get(PRODUCT_LABEL)
    if product:
        gib = gpu_memory_gib(product)
        if gib is not None:
            return gib, f"spec.pod.nodeSelector {PRODUCT_LABEL}={product}"
        return None, (f"the node selector's {PRODUCT_LABEL}={product} is a GPU whose memory we do not know: set "
                      "spec.resources.gpuMemoryGiB")
    return None, ("no GPU memory known to compare with: set spec.resources.gpuMemoryGiB or an "
                  f"{PRODUCT_LABEL} node selector")
