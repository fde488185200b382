"""Why a queued gang waits, read from Kueue's own words: the messages below are built with the format strings of
Kueue v0.17's flavor assigner (pkg/scheduler/flavorassigner/flavorassigner.go), one per resource the gang asks for."""

import itertools

import pytest

from finetune_operator.controller.queueing import waiting

GPU = "nvidia.com/gpu"
FIELD = {"cpu": "resources.cpu per pod", "memory": "resources.memory per pod",
         "ephemeral-storage": "resources.ephemeralStorage per pod", GPU: "distributed.numNodes x gpusPerNode",
         "nvidia.com/mig-1g.10gb": "distributed.numNodes x gpusPerNode", "pods": "fewer pods (distributed.numNodes)",
         "rdma/hca": "less rdma/hca"}


def over_capacity(resource: str) -> str:
    return (f"insufficient quota for {resource} in flavor default-flavor, previously considered podsets requests (0) "
            f"+ current podset request (24) > maximum capacity (16)")


def busy(resource: str) -> str:
    return f"insufficient unused quota for {resource} in flavor default-flavor, 8 more needed"


def uncovered(resource: str) -> str:
    return f"resource {resource} unavailable in ClusterQueue"


def workload(*reasons: str) -> dict:
    # Status.Message: the reasons of one pod set sorted and joined by ", " (flavorassigner.go).
    text = "couldn't assign flavors to pod set main: " + ", ".join(sorted(reasons))
    return {"name": "job-a1-abc", "active": True, "conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": text}]}


@pytest.mark.parametrize("resource", sorted(FIELD))
def test_a_resource_over_the_queues_capacity_names_the_field_that_asks_for_it(resource):
    reason, message = waiting(workload(over_capacity(resource)))
    assert reason == "QueueTooSmall" and "will wait forever" in message
    assert FIELD[resource] in message, message
    assert ("fewer GPUs" in message) is ("gpu" in resource or "mig" in resource), message


@pytest.mark.parametrize("resource", ["cpu", "memory", "ephemeral-storage", GPU])
def test_a_resource_the_queue_does_not_cover_is_never_admitted_and_says_how_to_fix_it(resource):
    """Kueue waits forever for a resource no resource group covers (a job with resources.ephemeralStorage under a
    ClusterQueue of cpu, memory and GPUs): not a plain Queued."""
    reason, message = waiting(workload(uncovered(resource)))
    assert reason == "QueueTooSmall" and "will wait forever" in message and "coveredResources" in message
    assert f"asks for {resource}," in message, message
    # A GPU job cannot leave its GPUs out.
    assert ("leave resources." in message) is (resource != GPU), message


@pytest.mark.parametrize("first,second", list(itertools.permutations(["cpu", "ephemeral-storage", GPU], 2)))
def test_every_resource_short_is_named_whatever_kueue_lists_first(first, second):
    _, message = waiting(workload(over_capacity(first), over_capacity(second)))
    assert FIELD[first] in message and FIELD[second] in message and "resources.memory" not in message, message


@pytest.mark.parametrize("first", [0, 1])
def test_a_gang_too_big_for_one_flavor_but_waiting_for_another_is_queued_not_too_small(first):
    """Kueue lists every flavor it tried (in the order it tried them, which rotates): a gang one flavor can hold
    once it is free waits, no more."""
    reasons = [over_capacity(GPU).replace("default-flavor", "h100"), busy(GPU).replace("default-flavor", "a100")]
    text = "couldn't assign flavors to pod set main: " + ", ".join(reasons[first:] + reasons[:first])
    kueue = {"name": "w", "active": True, "conditions": [{"type": "QuotaReserved", "status": "False",
                                                          "message": text}]}
    assert waiting(kueue)[0] == "Queued"
    # Another flavor busy for another resource (Kueue names a flavor's first misfit only): it may fit once free.
    other = workload(over_capacity(GPU).replace("default-flavor", "a100"),
                     busy("cpu").replace("default-flavor", "h100"))
    assert waiting(other)[0] == "Queued"
    # Every flavor over capacity (one for the GPUs, the other for cpu): too small.
    both = workload(over_capacity(GPU).replace("default-flavor", "a100"),
                    over_capacity("cpu").replace("default-flavor", "h100"))
    assert waiting(both)[0] == "QueueTooSmall" and FIELD["cpu"] in waiting(both)[1]


def test_a_busy_queue_is_plain_queued():
    assert waiting(workload(busy(GPU), busy("cpu")))[0] == "Queued"
