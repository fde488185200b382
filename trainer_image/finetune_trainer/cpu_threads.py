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


def cpu_limit(root: Path = CGROUP) -> float | None:
    """This container's CPU limit in CPUs (cgroup v2's cpu.max, else v1's CFS quota); None when it has none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        try:
            quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
            period_us = int((v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
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
