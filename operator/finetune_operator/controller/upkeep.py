"""Status upkeep on every pass, whatever the phase: a stopped attempt's stale progress, and the trainer's latest notice
as an Event (the active clock is deadlines.py's)."""

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
    elif p.status.get("phase") == "Succeeded" and progress.get("eta"):
        # The trainer's last report may be a few steps before the end (reports are at most one per 10 s): a
        # finished job shows no time left, in the same write as its phase.
        p.status["progress"] = {"eta": None}


def post_notice(p: Plan, obs: Observed) -> None:
    """The trainer's latest warning (status.notice: it may only write its own status) as a Warning Event, once."""
    notice = obs.status.get("notice") or {}
    if notice.get("time") and notice.get("time") != obs.status.get("noticePosted"):
        p.events.append(Event("Warning", str(notice.get("reason") or "TrainerWarning"), str(notice.get("message"))))
        p.status["noticePosted"] = notice["time"]
