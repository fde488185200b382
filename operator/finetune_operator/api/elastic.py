"""Elastic size and in-place restarts: what a range of nodes (distributed.minNodes..numNodes) and
runPolicy.inPlaceRestarts mean for the rest of the spec, and the rules they must keep.

An attempt that restarts in place runs torchrun with its c10d rendezvous (render/env.py): a worker that fails is
restarted on its pod and the group re-forms, with fewer nodes when one was lost (down to minNodes) and more when
one joins (up to numNodes). The global batch stays what the spec says at numNodes: each world size gets the
gradient accumulation that keeps it, which must be a whole number for every size in the range.
"""

import math
from typing import Any

from .errors import FieldError

# runPolicy.inPlaceRestarts when unset: an elastic job continues through lost nodes by restarting its workers.
DEFAULT_ELASTIC_IN_PLACE_RESTARTS = 3


def in_place_restart_limit(spec: Any) -> int:
    """torchrun's --max-restarts per pod, and the pods of an attempt that may fail by themselves and be replaced
    alone; 0: every failure restarts the gang (the fixed gang's behaviour)."""
    limit = spec.run_policy.in_place_restarts
    if limit is None:
        return DEFAULT_ELASTIC_IN_PLACE_RESTARTS if spec.distributed.elastic else 0
    return int(limit)


def restarts_in_place(spec: Any) -> bool:
    """The attempt runs torchrun's c10d rendezvous and survives a failed worker or a lost pod."""
    return spec.distributed.elastic or in_place_restart_limit(spec) > 0


def accumulation_steps(spec: Any, world_size: int) -> int | None:
    """Gradient accumulation that keeps the spec's global batch on `world_size` processes; None when no whole
    number does."""
    per_step = spec.training.per_device_train_batch_size * world_size
    global_batch = global_batch_size(spec)
    return global_batch // per_step if global_batch % per_step == 0 and global_batch >= per_step else None


def global_batch_size(spec: Any) -> int:
    """Sequences per optimizer step as the spec says (at numNodes); what every size of an elastic job keeps."""
    t, d = spec.training, spec.distributed
    return int(t.per_device_train_batch_size * t.gradient_accumulation_steps * d.world_size)


def node_range(spec: Any) -> range:
    d = spec.distributed
    return range(d.fewest_nodes, d.num_nodes + 1)


def elastic_rules(spec: Any) -> list[FieldError]:
    """Refused at apply: a range whose sizes cannot keep the global batch, an elastic or in-place job whose nodes
    would not find one another's checkpoints, an elastic job with nothing to resume from."""
    errors: list[FieldError] = []
    d, t = spec.distributed, spec.training
    if d.elastic:
        odd = [n for n in node_range(spec) if accumulation_steps(spec, n * d.processes_per_node) is None]
        if odd:
            sizes = [n * d.processes_per_node * t.per_device_train_batch_size for n in node_range(spec)]
            works = math.lcm(*sizes)
            errors.append(FieldError(
                "distributed.minNodes", d.min_nodes,
                f"the global batch {global_batch_size(spec)} (perDeviceTrainBatchSize {t.per_device_train_batch_size} "
                f"x gradientAccumulationSteps {t.gradient_accumulation_steps} x {d.world_size} processes) cannot "
                f"stay the same on {_listed(odd)} node(s): no whole gradient accumulation gives it",
                f"make it a multiple of {works} (e.g. gradientAccumulationSteps "
                f"{works // (t.per_device_train_batch_size * d.world_size)}), or narrow the range"))
        if spec.run_policy.in_place_restarts == 0:
            errors.append(FieldError("runPolicy.inPlaceRestarts", 0, "an elastic job shrinks and grows by restarting "
                                     "its workers on the pods that are left", "allow at least 1 (unset: "
                                     f"{DEFAULT_ELASTIC_IN_PLACE_RESTARTS}), or remove distributed.minNodes"))
        if spec.checkpoints.save_strategy == "no":
            errors.append(FieldError("checkpoints.saveStrategy", "no", "an elastic job continues on the survivors "
                                     "from its newest checkpoint", "set saveStrategy: steps (with saveSteps)"))
    if restarts_in_place(spec) and d.num_nodes > 1 and spec.output.claim_name is None:
        errors.append(FieldError(
            "output.claimName", None, "a job that restarts in place or is elastic resumes each re-formed group from "
            "the newest checkpoint, which every node must read where rank 0 wrote it (rank 0 may move to another "
            "node)", "set output.claimName to a ReadWriteMany claim, or runPolicy.inPlaceRestarts: 0 (gang restarts "
            "only) and no distributed.minNodes"))
    return errors


def _listed(values: list[int]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
