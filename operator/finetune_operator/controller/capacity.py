"""What the cluster can ever give a gang (pure): the GPUs of the nodes its pods may land on, and a namespace's
ResourceQuota. Read once, on a job's first pass, so that a gang that can never fit says so at once instead of
being torn down and retried after every scheduleTimeoutSeconds."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Capacity:
    largest: tuple[str, int] | None  # (node, allocatable GPUs) of the largest node the pods may use
    total: int  # allocatable GPUs over every node the pods may use
    nodes: int  # how many such nodes have any
    slots: int  # how many pods of `per_pod` GPUs those nodes hold together (a pod lives on one node)


def count(quantity: Any) -> int:
    try:
        return int(str(quantity or "0"))
    except ValueError:
        return 0


def tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    """The scheduler's rule for one NoSchedule/NoExecute taint (PreferNoSchedule never keeps a pod off)."""
    if taint.get("effect") == "PreferNoSchedule":
        return True
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def capacity(nodes: list[dict[str, Any]], resource: str, selector: dict[str, str],
             tolerations: list[dict[str, Any]], per_pod: int = 1) -> Capacity:
    """`nodes`: name, labels, taints, unschedulable and allocatable, as kube.py reads them."""
    usable = []
    for node in nodes:
        labels = node.get("labels") or {}
        if node.get("unschedulable") or any(labels.get(k) != v for k, v in selector.items()):
            continue
        if not all(tolerated(t, tolerations) for t in node.get("taints") or []):
            continue
        gpus = count((node.get("allocatable") or {}).get(resource))
        if gpus > 0:
            usable.append((node["name"], gpus))
    largest = max(usable, key=lambda n: n[1], default=None)
    return Capacity(largest, sum(g for _, g in usable), len(usable), sum(g // max(per_pod, 1) for _, g in usable))


def quota_limit(quotas: list[dict[str, Any]], resource: str) -> tuple[str, int] | None:
    """(quota, hard limit) of the tightest GPU limit among a namespace's ResourceQuotas, or None."""
    limits = []
    for quota in quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        for key in (f"requests.{resource}", f"limits.{resource}", resource):
            if key in hard:
                limits.append((quota["metadata"]["name"], count(hard[key])))
    return min(limits, key=lambda q: q[1], default=None)
