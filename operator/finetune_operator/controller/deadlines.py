"""runPolicy.activeDeadlineSeconds: the time a job is active (not queued or suspended), and the attempt Job's own
deadline, which ends an attempt that outlives its FineTuneJob's watch.

The operator fails a job whose active time reaches its deadline, and deletes its attempt. Each attempt's Job also
carries an activeDeadlineSeconds of its own, what was left of the job's when the attempt was created (and a few
seconds): a Job whose FineTuneJob is gone, or whose operator is down, still ends. The Job controller's clock counts
from the Job's start or last resume, so the operator keeps the Job's deadline at what is left counted from there:
an edit of the job's deadline reaches the running attempt's Job, and so does a resume (its clock starts again).
"""

import math
from datetime import datetime
from typing import Any

from .observed import format_time, has_condition, parse_time
from .planning import Observed, Plan

# Phases whose time counts against runPolicy.activeDeadlineSeconds: not the time a job waits in Kueue's queue or
# is suspended.
COUNTED_PHASES = ("Pending", "Running", "Restarting")
# Beyond what is left of the job's deadline: rounding of the two clocks, and the operator's own look at the
# deadline coming first when it is up.
JOB_DEADLINE_GRACE_SECONDS = 5
# A running Job's own deadline is lowered when it is this much more than what is left: a resumed Job's clock
# starts again (Kubernetes resets its startTime) with the deadline it had, and without this an attempt whose
# FineTuneJob is gone, or whose operator is down, would get its whole deadline again at every suspend and resume.
# Not for a second or two (a Job that started a moment after the job's active clock): a write per attempt for nothing.
LOWERED_PAST_SECONDS = JOB_DEADLINE_GRACE_SECONDS


def active_seconds(status: dict[str, Any], now: datetime) -> float:
    """Seconds the job has been active (not Queued or Suspended): what activeDeadlineSeconds limits."""
    if "activeSince" not in status and "activeSeconds" not in status:  # a job an older operator started
        since = parse_time(status.get("startTime"))
    else:
        since = parse_time(status.get("activeSince"))
    return float(status.get("activeSeconds") or 0) + ((now - since).total_seconds() if since else 0.0)


def active_clock(p: Plan, obs: Observed) -> None:
    st = p.status
    counting = st.get("phase") in COUNTED_PHASES
    if not counting and st.get("activeSince"):
        st["activeSeconds"] = int(active_seconds(st, obs.now))
        del st["activeSince"]
    elif counting and not st.get("activeSince"):
        st["activeSince"] = (st.get("startTime") if "activeSeconds" not in st else None) or format_time(obs.now)


def attempt_deadline(deadline: int | None, status: dict[str, Any], now: datetime,
                     job_started: datetime | None = None) -> int | None:
    """The activeDeadlineSeconds an attempt's Job needs (None: the job has no deadline): what is left of the
    job's, counted from the Job's own start (`job_started`: None for a Job being created or not started)."""
    if not deadline:
        return None
    ran = (now - job_started).total_seconds() if job_started is not None else 0.0
    # `now` cancels out of ran - active, whole seconds are left; the float sum is not exactly whole (a Job and a job
    # started together, 12.7 s on: 20.000000000000004, and its ceiling made a 20 s deadline's Job 26 s, not 25).
    left = round(ran + deadline - active_seconds(status, now), 3)
    return max(1, math.ceil(left)) + JOB_DEADLINE_GRACE_SECONDS


def follow_deadline(p: Plan, obs: Observed, deadline: int | None, workload: dict[str, Any]) -> None:
    """An attempt's Job whose own deadline would end it before the job's (an edit raised or removed the job's) is
    given the new one; so is one whose deadline is past what is left by more than LOWERED_PAST_SECONDS (a resumed
    Job's clock started again, or an edit lowered the job's). Otherwise both clocks run together."""
    have = (workload.get("spec") or {}).get("activeDeadlineSeconds")
    if have is None:
        return  # an attempt from an operator that set none: nothing of its own to end it early
    want = attempt_deadline(deadline, p.status, obs.now, job_clock_started(workload))
    if want is None or want > have or want < have - LOWERED_PAST_SECONDS:
        p.job_deadline = (workload["metadata"]["name"], want)


def job_clock_started(workload: dict[str, Any]) -> datetime | None:
    """When the Job controller's clock for activeDeadlineSeconds started; None while the Job is suspended (its clock
    starts again at the resume). Kubernetes before 1.36 keeps a suspended Job's old startTime until the resume: read
    as a start, the time spent suspended would raise the Job's deadline by as much. The Suspended condition is
    written with the new startTime, so it also covers the moment between an unsuspend and that write."""
    suspended = (workload.get("spec") or {}).get("suspend") or has_condition(workload, "Suspended")
    return None if suspended else parse_time((workload.get("status") or {}).get("startTime"))
