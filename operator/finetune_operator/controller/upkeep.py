"""Status upkeep on every pass, whatever the phase: the active clock (what activeDeadlineSeconds limits), a stopped
attempt's stale progress, and the trainer's latest notice as an Event."""

from datetime import datetime
from typing import Any

from .observed import format_time, parse_time
from .planning import Event, Observed, Plan

# Phases in which no attempt trains: the trainer's last progress is marked as the last attempt's and has no ETA.
STOPPED_PHASES = ("Queued", "Suspended", "Restarting", "Failed")


def stale_progress(p: Plan, obs: Observed) -> None:
    """The one trainer-owned field the operator touches: a stopped attempt's ETA would read as if it were running
    (ETA 4s on a preempted job), so it is cleared and the progress marked Stopped, once."""
    progress = obs.status.get("progress") or {}
    if p.status.get("phase") in STOPPED_PHASES and progress and progress.get("phase") != "Stopped":
        p.status["progress"] = {"phase": "Stopped", "eta": None,
                                "message": f"the last report of attempt {obs.status.get('attempt')}, which is not "
                                           "running"}


# Phases whose time counts against runPolicy.activeDeadlineSeconds: not the time a job waits in Kueue's queue or
# is suspended.
COUNTED_PHASES = ("Pending", "Running", "Restarting")


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
        st["activeSince"] = st.get("startTime") if "activeSeconds" not in st else format_time(obs.now)


def post_notice(p: Plan, obs: Observed) -> None:
    """The trainer's latest warning (status.notice: it may only write its own status) as a Warning Event, once."""
    notice = obs.status.get("notice") or {}
    if notice.get("time") and notice.get("time") != obs.status.get("noticePosted"):
        p.events.append(Event("Warning", str(notice.get("reason") or "TrainerWarning"), str(notice.get("message"))))
        p.status["noticePosted"] = notice["time"]
