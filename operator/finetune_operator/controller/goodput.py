"""status.goodput: what a job cost and what its failures cost, from the phase transitions the operator writes.

Updated only when the phase changes (a status write happens then anyway), so accounting adds no API request:
- gpuHours: GPU time of the gang while all of its nodes ran, for the periods that have ended; while Running,
  `runningSince` marks the open period (now - runningSince) x gpus is still to be added.
- restartDowntimeSeconds: wall time from each detected failure until the next gang ran again.
- stepsRedone: optimizer steps done twice because of restarts: the step the failed attempt reported last minus
  the step of the checkpoint the next attempt resumes from (only if that report came from the failed attempt);
  for a worker group re-formed in place, the steps its trainer says it redid.
- inPlaceRecoverySeconds: from each failure to the first step of the worker group re-formed in place (the trainer's
  figure, controller/in_place.py); a group of another size also closes the GPU-hours period at the old size.
- checkpointStallSeconds: what each new checkpoint (status.checkpoint.stallSeconds) held training up.
"""

from datetime import datetime
from typing import Any

from .observed import format_time, parse_time

SECONDS_PER_HOUR = 3600.0
NOTHING_YET = {"gpuHours": 0.0, "restartDowntimeSeconds": 0, "stepsRedone": 0}  # not written until it changes


def account(status: dict[str, Any], before: dict[str, Any], now: datetime, gpus: int, restarted: bool,
            resumed_step: int | None) -> None:
    """Updates status["goodput"] in place from the phase change before -> status (both operator status dicts)."""
    was, phase = before.get("phase"), status.get("phase")
    # What the pass already changed (a re-formed worker group, lifecycle.py), else what the status held.
    goodput = dict(status.get("goodput") or before.get("goodput") or NOTHING_YET)
    _checkpoint_stall(goodput, before.get("checkpoint") or {})
    if was == "Running" and phase != "Running":
        since = parse_time(goodput.pop("runningSince", None))
        if since is not None:
            hours = max((now - since).total_seconds(), 0.0) * gpus / SECONDS_PER_HOUR
            goodput["gpuHours"] = round(goodput.get("gpuHours", 0.0) + hours, 4)
    if phase == "Running" and was != "Running":
        goodput["runningSince"] = format_time(now)
        failed = parse_time(goodput.pop("failedAt", None))
        if failed is not None:
            downtime = int(max((now - failed).total_seconds(), 0))
            goodput["restartDowntimeSeconds"] = goodput.get("restartDowntimeSeconds", 0) + downtime
    if restarted:
        goodput.setdefault("failedAt", format_time(now))  # a failure while restarting keeps the first one
        progress = before.get("progress") or {}
        attempt_since = parse_time(goodput.get("attemptSince"))
        reported = parse_time(progress.get("updatedAt"))
        if attempt_since is None or (reported is not None and reported >= attempt_since):
            lost = (progress.get("step") or 0) - (resumed_step or 0)
            goodput["stepsRedone"] = goodput.get("stepsRedone", 0) + max(lost, 0)
        goodput["attemptSince"] = format_time(now)  # later reports belong to the next attempt
    if goodput != NOTHING_YET or before.get("goodput"):
        status["goodput"] = goodput


def _checkpoint_stall(goodput: dict[str, Any], checkpoint: dict[str, Any]) -> None:
    """Adds the stall of a checkpoint not counted yet (the trainer reports each one's)."""
    step, stall = checkpoint.get("step"), checkpoint.get("stallSeconds")
    if step is None or stall is None or step == goodput.get("checkpointStep"):
        return
    goodput["checkpointStep"] = step
    goodput["checkpointStallSeconds"] = round(goodput.get("checkpointStallSeconds", 0.0) + float(stall), 3)


def regrouped(goodput: dict[str, Any] | None, now: datetime, gpus_before: int, gpus_after: int, recovery: float,
              lost_steps: int) -> dict[str, Any]:
    """A worker group re-formed in place: its recovery and redone steps added; another size closes the running
    period at the old size (GPU-hours count the GPUs that trained)."""
    goodput = dict(goodput or NOTHING_YET)
    if recovery or lost_steps:
        goodput["inPlaceRecoverySeconds"] = round(goodput.get("inPlaceRecoverySeconds", 0.0) + recovery, 3)
        goodput["stepsRedone"] = goodput.get("stepsRedone", 0) + lost_steps
    since = parse_time(goodput.get("runningSince"))
    if since is not None and gpus_before != gpus_after:
        hours = max((now - since).total_seconds(), 0.0) * gpus_before / SECONDS_PER_HOUR
        goodput["gpuHours"] = round(goodput.get("gpuHours", 0.0) + hours, 4)
        goodput["runningSince"] = format_time(now)
    return goodput
