"""The CPU threads of each training process: as many as the container's CPU limit gives it, not the node's cores.

torch sizes its thread pools (OpenMP, intra-op) from the CPUs the process may be scheduled on, which in a pod is
every core of the node: a pod limited to 2 CPUs on a 64-core node runs 64 threads in a quota of 2, and the kernel
throttles all of them at every parallel region. Oversubscribed the same way (2 threads on 2 cores that other work
kept busy), one process of the tiny example took 2.4x the time and 2x the CPU of one with 1 thread. torchrun sets
OMP_NUM_THREADS=1 only when a node runs several processes, and a single process runs without torchrun. So the
launcher gives each process its share of the limit: floor(limit / processes per node), at least 1. A limit above
the CPUs the process may run on (a pod whose limit is above its node's cores, a container on a cpuset) counts as
those CPUs: torch's own choice there, and more threads than cores would only take turns. `finetune run` starts
every node's launcher in one limit (a CI container): each node's processes get their share of it. A value the user
set (spec.pod.env) is kept, and without a limit (a machine, a pod without one) nothing is set."""

import os
from collections.abc import Mapping
from pathlib import Path

from finetune_operator.api import constants as c

THREAD_VARIABLES = ("OMP_NUM_THREADS",)  # torch, MKL and OpenBLAS read OpenMP's
CGROUP = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def cpu_limit(root: Path = CGROUP, membership: Path = SELF_CGROUP) -> float | None:
    """This container's CPU limit in CPUs (cgroup v2's cpu.max, else v1's CFS quota); None when it has none.
    With cgroup v2 the process's own group and every group above it count (the smallest limit wins): a container
    without a cgroup namespace sees the host's hierarchy at `root`, its own group deeper in it."""
    v2 = _cpu_max(root / "cpu.max")
    own = _own_v2_group(membership)
    if own:
        limits = [_cpu_max(root / Path(*own.parts[:i]) / "cpu.max") for i in range(1, len(own.parts) + 1)]
        v2 = min((x for x in [v2, *limits] if x is not None), default=None)
    if v2 is not None or (root / "cpu.max").exists():
        return v2
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        try:
            quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
            period_us = int((v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    return None


def _cpu_max(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _own_v2_group(membership: Path) -> Path | None:
    """The process's cgroup v2 path below the root ("0::/kubepods/.../cri-containerd-1.scope"), None at the root."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = Path(line[3:].strip().lstrip("/"))
            return path if path.parts else None
    return None


def usable_cpus() -> int:
    """The CPUs this process may be scheduled on (its affinity: a cpuset, else the node's cores)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def thread_env(env: Mapping[str, str], limit: float | None, cpus: int) -> dict[str, str]:
    """OMP_NUM_THREADS for the training processes of this node from its CPU limit and the `cpus` it may run on,
    unless set already or there is no limit."""
    if limit is None or any(name in env for name in THREAD_VARIABLES):
        return {}
    try:
        processes = max(1, int(env.get(c.ENV_PET_NPROC_PER_NODE, "1")))
        processes *= max(1, int(env.get(c.ENV_NODES_SHARING_CPUS) or "1"))  # `finetune run`: its nodes, one limit
    except ValueError:  # torchrun's "gpu" or "auto" (never rendered by us): no count to divide by
        return {}
    return {"OMP_NUM_THREADS": str(max(1, int(min(limit, cpus) // processes)))}
