"""status.conditions from the planned status: one condition per type, its transition time kept while it holds."""

from typing import Any

from ..api import exit_codes
from .observed import ATTEMPT_REFUSED, NAME_CONFLICT, WAITING_REASONS, format_time, has_condition
from .planning import CONDITION_TYPES, Observed, Plan


def set_conditions(p: Plan, obs: Observed) -> None:
    st = p.status
    phase = st.get("phase")
    wanted = {
        # Not while the attempt's creation is refused (a name clash, an admission policy): nothing was created.
        "Created": bool(st.get("attempt")) and st.get("reason") not in (ATTEMPT_REFUSED, NAME_CONFLICT),
        "Waiting": phase == "Pending" and st.get("reason") in WAITING_REASONS,
        "Running": phase == "Running",
        "Restarting": phase == "Restarting",
        "Suspended": phase in ("Suspended", "Queued"),
        "Stalled": p.stalled or (phase == "Restarting" and has_condition({"status": obs.status}, "Stalled")),
        "TopologyChangePending": p.topology_change is not None,
        "Succeeded": phase == "Succeeded",
        "Failed": phase == "Failed",
    }
    old = {cd["type"]: cd for cd in obs.status.get("conditions") or []}
    conditions = []
    for kind in CONDITION_TYPES:
        value = "True" if wanted[kind] else "False"
        before = old.get(kind)
        if before is None and value == "False":
            continue
        # A new failure while already Restarting restarts the backoff clock, though the condition stays True.
        renewed = kind == "Restarting" and (p.restarted or p.rescheduled)
        if before is None or before.get("status") != value or renewed:
            since = format_time(obs.now)
        else:
            since = before.get("lastTransitionTime")
        reason, message = condition_text(kind, st, p)
        if value == "False":  # why it no longer holds: what the job is doing instead
            reason, message = condition_false(kind, st, before)
        conditions.append({
            "type": kind, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since,
            "observedGeneration": obs.generation,
        })
    st["conditions"] = conditions


def condition_false(kind: str, st: dict[str, Any], before: dict[str, Any] | None) -> tuple[str, str]:
    """A condition that stopped holding: the phase's reason and a short word on what the job does now."""
    phase = st.get("phase") or "Pending"
    if before is not None and before.get("status") == "False" and before.get("message"):
        return before.get("reason") or phase, before["message"]  # unchanged since it became False
    if kind == "Created":  # refused: the refusal says what was not created and why
        return st.get("reason") or phase, st.get("message") or f"attempt {st.get('attempt')} was not created"
    return st.get("reason") or phase, f"{kind} no longer holds: the job is {phase}" + (
        f" ({exit_codes.short(st['message'], 200)})" if st.get("message") else "")


def condition_text(kind: str, st: dict[str, Any], p: Plan) -> tuple[str, str]:
    """A condition keeps its own reason: Created says the attempt was created, not why the job now waits; the
    conditions that describe the current phase carry the phase's reason and message."""
    if kind == "Created":
        return "Created", f"attempt {st.get('attempt')} created"
    if kind == "Stalled":
        return "Stalled", "no progress heartbeat within spec.runPolicy.stallTimeoutSeconds"
    if kind == "TopologyChangePending":
        return kind, p.topology_change or ""
    if kind in ("Running", "Succeeded"):
        return kind, st.get("message") or ""
    return st.get("reason") or kind, st.get("message") or ""
