"""Memory of one GPU, from the product label GPU feature discovery puts on nodes (nvidia.com/gpu.product) or from
the spec (resources.gpuMemoryGiB, which wins). GiB as nvidia-smi reports the total (MiB / 1024)."""

from ..api.spec import FineTuneJobSpec

PRODUCT_LABEL = "nvidia.com/gpu.product"

# First match wins: more specific names first. (substring of the label, GiB)
GPU_MEMORY_GIB: tuple[tuple[str, float], ...] = (
    ("GB200", 184.0), ("B200", 179.1), ("H200", 140.4), ("GH200", 95.6), ("H100-NVL", 93.6), ("H100", 79.6),
    ("H800", 79.6), ("H20", 95.6), ("A100-SXM4-40GB", 40.0), ("A100-PCIE-40GB", 40.0), ("A100", 80.0),
    ("A800", 80.0), ("L40S", 45.0), ("L40", 45.0), ("L4", 22.5), ("A10G", 22.5), ("A10", 22.5),
    ("RTX-6000-Ada", 48.0), ("A6000", 48.0), ("4090", 24.0), ("3090", 24.0), ("V100-SXM2-32GB", 32.0),
    ("V100", 16.0), ("T4", 15.0), ("MI300X", 192.0), ("MI250", 64.0),
)


def gpu_memory_gib(product: str) -> float | None:
    normalised = product.replace(" ", "-")
    for name, gib in GPU_MEMORY_GIB:
        if name.lower() in normalised.lower():
            return gib
    return None


def capacity_gib(spec: FineTuneJobSpec) -> tuple[float | None, str]:
    """(GiB of one GPU, where that figure comes from); None when neither the spec nor a product label says."""
    if spec.resources.gpu_memory_gib is not None:
        return spec.resources.gpu_memory_gib, "spec.resources.gpuMemoryGiB"
    product = spec.pod.node_selector.get(PRODUCT_LABEL)
    if product:
        gib = gpu_memory_gib(product)
        if gib is not None:
            return gib, f"spec.pod.nodeSelector {PRODUCT_LABEL}={product}"
    return None, ""
