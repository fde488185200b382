"""Suspend and resume as the attempt's owner understands them (our own spec.suspend, or Kueue's Workload), an edited
spec applied by a resume, and a queued attempt that follows its FineTuneJob's Kueue labels."""

from typing import Any

from ..api import constants as c
from ..render.workload import attempt_spec_hashes
from . import queueing
from .planning import Observed, Plan, finished


def suspension(p: Plan, obs: Observed, workload: dict, want_suspend: bool, is_suspended: bool) -> bool:
    """Suspend or resume the attempt the way its owner understands; True when Kueue manages it. A Kueue-managed
    Job's spec.suspend is Kueue's: the Workload is deactivated instead (Kueue evicts it, the pods get their SIGTERM
    checkpoint, the quota is released) and activated again to re-queue."""
    name = workload["metadata"]["name"]
    kueue = queueing.kueue_workload(obs.kueue_workloads, workload)
    if not queueing.managed(workload, kueue):
        if want_suspend and not is_suspended:
            p.suspend_workload = (name, True)
        elif not want_suspend and is_suspended:
            p.suspend_workload = (name, False)
        p.status.pop("kueueDeactivated", None)
        return False
    if want_suspend:
        if kueue is None:
            p.requeue(2)  # Kueue has not made the Workload yet: deactivate it once it has
        elif kueue.get("active", True):
            p.kueue_active = (kueue["name"], False)
            p.status["kueueDeactivated"] = True
    elif p.status.get("kueueDeactivated") and kueue is not None:
        if not kueue.get("active", True):
            p.kueue_active = (kueue["name"], True)
        else:
            p.status.pop("kueueDeactivated", None)
    return True


def edited(spec: Any, workload: dict[str, Any]) -> bool:
    """The attempt's Job was rendered from another spec than the current one (runPolicy and suspend aside); an
    attempt from an operator that wrote no such digest is taken as unedited."""
    rendered = ((workload.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_ATTEMPT_SPEC_HASH)
    return rendered is not None and rendered not in attempt_spec_hashes(spec)


def resuming(obs: Observed, workload: dict[str, Any], want_suspend: bool, is_suspended: bool) -> bool:
    """The user cleared spec.suspend of an attempt that is suspended because of it (by the operator, or through its
    deactivated Kueue Workload), not a Job merely waiting in Kueue's queue."""
    if want_suspend or finished(workload):
        return False
    if obs.status.get("kueueDeactivated"):
        return True
    return is_suspended and queueing.suspended_by_operator(workload)


def resume_edited(p: Plan, workload: dict[str, Any]) -> None:
    """Resumed after the spec was edited: the suspended attempt goes and the next one, rendered from the edited
    spec, resumes from the newest checkpoint (not a restart: nothing failed)."""
    st = p.status
    before = st["attempt"]
    st["attempt"] = before + 1
    st.pop("kueueDeactivated", None)
    st.update(phase="Pending", reason="SpecChanged", message=(
        f"resumed with an edited spec: attempt {before + 1} starts from the newest checkpoint with it (attempt "
        f"{before} ran the spec from before the edit)"))
    p.delete_workloads.append(workload["metadata"]["name"])


def follow_kueue_labels(p: Plan, obs: Observed, workload: dict[str, Any]) -> None:
    """A queued attempt follows the FineTuneJob's Kueue labels (a misspelled queue fixed with `kubectl label ftj`,
    a job moved to another queue or given a higher priority class): Kueue lets a waiting Job's queue and priority
    class change and updates its Workload. An admitted (running) attempt keeps its own; a label removed is not
    followed (Kueue still holds the Job)."""
    have = (workload.get("metadata") or {}).get("labels") or {}
    changed = {k: v for k, v in obs.labels.items() if k in c.KUEUE_JOB_LABELS and v and have.get(k) != v}
    if changed:
        p.kueue_labels = (workload["metadata"]["name"], changed, {k: have.get(k) for k in changed})
