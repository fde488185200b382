"""Why a gang does not run, said in the status: a quota or capacity it can never have (on its first pass), an
attempt the apiserver refused or whose children's names are taken, pods that wait (from their state and the Job's
events, looked at only while they wait), and the partial gang torn down after scheduleTimeoutSeconds."""

from datetime import datetime
from typing import Any

from ..api import constants as c
from ..api.validation import ValidatedJob
from ..render.preflight import PREFLIGHT_ATTEMPT
from . import capacity, queueing
from .in_place import nodes_text
from .observed import (
    ATTEMPT_REFUSED,
    NAME_CONFLICT,
    WAITING_REASONS,
    attempt_nodes,
    parse_time,
    ready_pods,
    succeeded_pods,
    waiting_reason,
)
from .planning import Observed, Plan, finish, finished

# A gang not fully running this long after its Job was created is looked at (its pods, its Job's events) to say
# why; then every WAIT_RECHECK_SECONDS while it waits. No pod watch: only waiting jobs cost reads.
WAIT_GRACE_SECONDS = 10.0
WAIT_RECHECK_SECONDS = 15.0
# A gang the nodes cannot hold (runPolicy.capacityShortage: wait) is looked at again this often (the operator's
# view of the nodes is at most a minute old).
CAPACITY_RECHECK_SECONDS = 30.0


def gang_waiting(workload: dict[str, Any], now: datetime) -> bool:
    """The attempt's Job exists, is neither finished nor suspended, not every node runs, and it was created more
    than WAIT_GRACE_SECONDS ago: worth reading its pods and events to say why."""
    if finished(workload) or (workload.get("spec") or {}).get("suspend"):
        return False
    if ready_pods(workload) + succeeded_pods(workload) >= attempt_nodes(workload, 1):
        return False
    created = parse_time((workload.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and (now - created).total_seconds() >= WAIT_GRACE_SECONDS


def never_fits(p: Plan, job: ValidatedJob, obs: Observed) -> bool:
    """Before the first attempt, what the gang cannot get says so at once instead of after scheduleTimeoutSeconds
    and a retry after each: a ResourceQuota below its GPUs fails the job (True); too few GPUs on the nodes its pods
    may use (their nodeSelector and tolerations), or no node big enough for one pod, is a Warning, and (True,
    runPolicy.capacityShortage: wait) nothing is created until the nodes can hold it, or (False, create) the
    attempt is created for a cluster autoscaler to see."""
    st, d, resource = p.status, job.spec.distributed, job.spec.resources.gpu_resource_name
    # An elastic job needs minNodes of them to start (and takes more when they come).
    gang = d.fewest_nodes * d.gpus_per_node
    quota = capacity.quota_limit(obs.quotas or [], resource) if gang else None
    if quota is not None and gang > quota[1]:
        finish(p, obs, "Failed", "QuotaTooSmall", (
            f"the gang needs {gang} {resource} ({d.fewest_nodes} node(s) x {d.gpus_per_node}), but ResourceQuota "
            f"{quota[0]} of this namespace allows {quota[1]}: it can never run here; ask for at most {quota[1]} "
            f"(numNodes x gpusPerNode) or have the quota raised"))
        return True
    if obs.nodes is None or not gang:
        return False
    pod = job.spec.pod
    cap = capacity.capacity(obs.nodes, resource, dict(pod.node_selector or {}),
                            [t.model_dump(by_alias=True, exclude_none=True) for t in pod.tolerations], d.gpus_per_node)
    where = "the nodes its pods may use (nodeSelector, tolerations)" if pod.node_selector or pod.tolerations else \
        "the cluster's nodes"
    # A job queued through Kueue holds nothing while Kueue keeps it suspended, and Kueue says why it waits.
    wait = job.spec.run_policy.capacity_shortage == "wait" and c.LABEL_KUEUE_QUEUE not in job.labels
    then = (f"nothing is created and no GPU held until they can (looked at again every "
            f"{CAPACITY_RECHECK_SECONDS:.0f} s; runPolicy.capacityShortage: create lets a cluster autoscaler see its "
            "pods)") if wait else (
        f"the attempt is created for a cluster autoscaler to see (runPolicy.capacityShortage: create) and retried at "
        f"most runPolicy.scheduleRetryLimit={job.spec.run_policy.schedule_retry_limit} time(s)")
    if cap.largest is not None and d.gpus_per_node > cap.largest[1]:
        node, most = cap.largest
        st.update(reason="Unschedulable", message=(
            f"spec.distributed.gpusPerNode is {d.gpus_per_node}, but the largest of {where} ({node}) has {most} "
            f"{resource} allocatable: no node can run a pod of this job; ask for at most {most} per node (e.g. "
            f"numNodes {-(-gang // most)} x gpusPerNode {most}) or add nodes with more GPUs; {then}"))
    elif cap.slots < d.fewest_nodes:
        st.update(reason="InsufficientCapacity", message=(
            f"the gang needs {d.fewest_nodes} pod(s) of {d.gpus_per_node} {resource} ({gang} in all), but {where} "
            f"hold {cap.slots} such pod(s) ({cap.total} {resource} on {cap.nodes} node(s)): it cannot run until "
            f"nodes are added; {then}"))
    else:
        return False
    if not wait:
        return False
    # Not started: no attempt, no start time; only the reason, and a look again.
    for key in ("attempt", "restarts", "startTime"):
        st.pop(key, None)
    p.requeue(CAPACITY_RECHECK_SECONDS)
    return True


CREATE_REFUSALS = (ATTEMPT_REFUSED, NAME_CONFLICT)


def refused(p: Plan, obs: Observed, attempt: int) -> None:
    """The attempt about to be created was refused last time: say why while it is retried (a policy or webhook
    refusing Jobs or pods' specs, or a child's name taken by an object that is not ours; nothing else shows a write
    that never happened)."""
    if obs.refused is None or obs.refused[0] != attempt:
        return
    _, reason, why = obs.refused
    what = "the preflight" if attempt == PREFLIGHT_ATTEMPT else f"attempt {attempt}"
    if reason == NAME_CONFLICT:  # `why` ends with what to do (kube.NameConflict)
        message = f"{what} was not created: {why} (looked at again every 15 s)"
    else:
        message = (f"the apiserver refused to create {what}'s Job or its children ({why}); retried until it is "
                   "allowed: change the admission policy or webhook that refuses it, or the job's spec")
    p.status.update(reason=reason, message=message)
    if p.status.get("phase") != "Restarting":
        p.status["phase"] = "Pending"


def waiting(p: Plan, job: ValidatedJob, obs: Observed, workload: dict[str, Any], running: int, nodes: int,
            fewest: int | None = None, timeout_applies: bool = True) -> None:
    """Not every node runs (not minNodes of an elastic attempt): say why (from the pods and the Job's events, once
    they were read), give up on a partial gang after scheduleTimeoutSeconds, and look again soon: no pod watch
    tells us when things change."""
    st = p.status
    why = waiting_reason(obs.pods, obs.events)
    created = parse_time((workload.get("metadata") or {}).get("creationTimestamp"))
    age = (obs.now - created).total_seconds() if created is not None else 0.0
    timeout = job.spec.run_policy.schedule_timeout_seconds if timeout_applies else None
    count = nodes_text(running, nodes, fewest or nodes)
    queued = queueing.managed(workload, queueing.kueue_workload(obs.kueue_workloads, workload))
    if timeout and not queued and created is not None and age >= timeout:
        schedule_timeout(p, job, obs, workload, running, nodes, why)
        return
    p.requeue(WAIT_RECHECK_SECONDS if age >= WAIT_GRACE_SECONDS else WAIT_GRACE_SECONDS - age)
    if timeout and not queued and created is not None:
        p.requeue(timeout - age)
    if why is not None:
        st.update(phase="Pending", reason=why[0], message=f"attempt {st['attempt']}: {count} node(s) running; "
                  f"{why[1]}")
    elif (not obs.looked and st.get("phase") == "Pending" and st.get("reason") in WAITING_REASONS
          and st.get("reason") not in CREATE_REFUSALS):  # a refusal is over once the Job exists
        return  # not looked at this pass: the reason found last time stands until the next look
    elif st.get("phase") != "Restarting" or running:  # a restarted gang reads Restarting until its pods run
        keep = st.get("reason") if st.get("phase") == "Pending" and st.get("reason") not in WAITING_REASONS else None
        st.update(phase="Pending", reason=keep or "Pending",
                  message=f"attempt {st['attempt']}: {count} node(s) running")


def schedule_timeout(p: Plan, job: ValidatedJob, obs: Observed, workload: dict[str, Any], running: int,
                      nodes: int, why: tuple[str, str] | None) -> None:
    """A partial gang holds GPUs and trains nothing: tear it down, retry with backoff. Counted in scheduleRetries,
    not against backoffLimit (nothing failed); Kueue-managed jobs are left to Kueue."""
    st = p.status
    timeout = job.spec.run_policy.schedule_timeout_seconds
    limit = job.spec.run_policy.schedule_retry_limit
    if st.get("scheduleRetries", 0) >= limit:
        detail = f"; {why[1]}" if why else ""
        finish(p, obs, "Failed", "ScheduleRetriesExhausted", (
            f"attempt {st['attempt']}: {running}/{nodes} node(s) ran within scheduleTimeoutSeconds={timeout} after "
            f"{limit} retries (runPolicy.scheduleRetryLimit){detail}; its pods were deleted"))
        p.delete_workloads.append(workload["metadata"]["name"])
        return
    st["scheduleRetries"] = st.get("scheduleRetries", 0) + 1
    st["attempt"] = st["attempt"] + 1
    p.delete_workloads.append(workload["metadata"]["name"])
    detail = f"; {why[1]}" if why else ""
    st.update(phase="Restarting", reason="ScheduleTimeout",
              message=f"attempt {st['attempt'] - 1}: {running}/{nodes} node(s) ran within scheduleTimeoutSeconds="
                      f"{timeout}{detail}; its pods were deleted to free their GPUs, retry "
                      f"{st['scheduleRetries']} starts after a backoff")
    p.rescheduled = True
