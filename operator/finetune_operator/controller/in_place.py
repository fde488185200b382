"""An attempt that restarts in place (api/elastic.py), as the operator follows it.

Its Job replaces a failed or deleted pod alone (same index, same name), so the operator does not restart the gang:
it reads each newly failed pod once (status.recovery counts what it read), says what happened (NodeLost), fails
the job on a permanent error as ever, and restarts the gang only when more pods failed by themselves than
runPolicy.inPlaceRestarts allows. The trainer tells each worker group torchrun formed (status.workers, after the
group's first step): a smaller group Shrunk, a larger one Grew, one of the same size after a failure
RestartedInPlace; each with its cause, the steps it redid and how long the recovery took, which goodput counts.
"""

from typing import Any

from ..api import exit_codes
from ..api.validation import ValidatedJob
from . import goodput
from .observed import DISRUPTED, classify_failure, failed_pods, min_nodes_of, restarts_in_place_of
from .planning import Event, Observed, Plan


def nodes_text(running: int, nodes: int, fewest: int) -> str:
    """status.nodes: running/requested, and an elastic attempt's minimum: 3/4 (min 2)."""
    return f"{running}/{nodes}" + (f" (min {fewest})" if fewest < nodes else "")


def _recovery(st: dict[str, Any]) -> dict[str, Any]:
    """The current attempt's account (a new attempt starts a new one)."""
    rec = st.get("recovery") or {}
    return dict(rec) if rec.get("attempt") == st.get("attempt") else {"attempt": st.get("attempt"), "podsFailed": 0,
                                                                       "podFailures": 0}


def pods_needed(workload: dict[str, Any], status: dict[str, Any]) -> bool:
    """A pod of an attempt that restarts in place failed since the last look: its pods tell which and why."""
    if restarts_in_place_of(workload) is None:
        return False
    rec = status.get("recovery") or {}
    seen = rec.get("podsFailed", 0) if rec.get("attempt") == status.get("attempt") else 0
    return failed_pods(workload) > seen


def _finished_at(pod: dict[str, Any]) -> str:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        finished = ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")
        if finished:
            return str(finished)
    return ""


Failure = tuple[int | None, str, str]  # (exit code, reason, message), as classify_failure gives them


def lost_pods(p: Plan, job: ValidatedJob, obs: Observed, workload: dict[str, Any]) -> Failure | None:
    """Newly failed pods of the attempt: NodeLost for each. The failure that ends the attempt, if one does (a
    permanent error fails the job; more pods that failed by themselves than runPolicy.inPlaceRestarts restart the
    gang), for the caller to act on as on a gang's failure."""
    st = p.status
    rec = _recovery(st)
    failed = failed_pods(workload)
    new = failed - rec["podsFailed"]
    if new <= 0:
        return None
    limit = restarts_in_place_of(workload) or 0
    nodes = (workload.get("spec") or {}).get("parallelism") or job.spec.distributed.num_nodes
    fewest = min_nodes_of(workload, nodes)
    ended = sorted((pod for pod in obs.pods if (pod.get("status") or {}).get("phase") == "Failed"),
                   key=_finished_at)[-new:]
    causes = [classify_failure([pod]) for pod in ended]
    causes += [classify_failure([])] * (new - len(causes))  # deleted before it could say why
    rec["podsFailed"] = failed
    st["recovery"] = rec
    for code, reason, message in causes:
        if code is not None and exit_codes.is_permanent(code):
            return code, reason, message
    for code, reason, message in causes:
        st["nodesLost"] = int(st.get("nodesLost") or 0) + 1
        counted = reason != DISRUPTED
        if counted:
            rec["podFailures"] += 1
        if rec["podFailures"] > limit:
            return code, reason, (f"{message} (pod failure {rec['podFailures']} of attempt {st['attempt']}; "
                                  f"runPolicy.inPlaceRestarts allows {limit} before the gang restarts)")
        then = (f"the others train on while it is replaced alone (the group may shrink to {fewest} node(s), and "
                "grows back when the replacement runs)" if fewest < nodes else
                "it is replaced alone; the others wait for it to rejoin, then resume from the newest checkpoint")
        budget = f"; pod failure {rec['podFailures']}/{limit} of this attempt" if counted else \
            " (stopped from outside: not counted against runPolicy.inPlaceRestarts)"
        p.events.append(Event("Warning", "NodeLost", f"{message}; {then}{budget}"))
    return None


def announce_workers(p: Plan, job: ValidatedJob, obs: Observed) -> None:
    """The trainer's report of a worker group it has not announced yet: an Event, the counts and goodput."""
    st = p.status
    workers = obs.status.get("workers") or {}
    rec = _recovery(st)
    if not workers.get("generation") or workers.get("attempt") != st.get("attempt") \
            or workers.get("generation") == rec.get("generation"):
        return
    before = rec.get("nodes")
    nodes = int(workers.get("nodes") or 1)
    rec.update(generation=workers["generation"], nodes=nodes)
    st["recovery"] = rec
    gpus_before = st.get("gpus") or 0
    st["gpus"] = nodes * job.spec.distributed.gpus_per_node
    cause = workers.get("cause")
    if before is None:
        # The attempt's first group to train (groups that re-formed before a first step, such as an elastic start
        # with minNodes joined by a late node, are its start, not restarts).
        st["goodput"] = goodput.regrouped(st.get("goodput"), obs.now, gpus_before, st["gpus"], 0.0, 0)
        return
    recovery, lost = float(workers.get("recoverySeconds") or 0.0), int(workers.get("lostSteps") or 0)
    st["goodput"] = goodput.regrouped(st.get("goodput"), obs.now, gpus_before, st["gpus"], recovery, lost)
    d = job.spec.distributed
    batch = (f"{workers.get('worldSize')} process(es) x {workers.get('gradientAccumulationSteps')} accumulation "
             f"keep the global batch at {workers.get('globalBatchSize')}")
    after = (f"resumed from step {workers.get('resumedStep', 0)} ({lost} step(s) redone), its first step "
             f"{recovery:.1f}s after the failure")
    if before is not None and nodes > before:
        p.events.append(Event("Normal", "Grew", f"training continues on {nodes} node(s) (was {before}; at most "
                              f"{d.num_nodes}): {batch}; {after}"))
        return
    st["restartsInPlace"] = int(st.get("restartsInPlace") or 0) + 1
    why = f": {cause}" if cause else ""
    if before is not None and nodes < before:
        p.events.append(Event("Warning", "Shrunk", f"training continues on the {nodes} surviving node(s) (was "
                              f"{before}; at least {d.fewest_nodes}), their pods kept{why}; {batch}; {after}"))
    else:
        p.events.append(Event("Warning", "RestartedInPlace", f"the workers restarted on the same {nodes} pod(s) "
                              f"(restart in place {st['restartsInPlace']}){why}; {after}"))
