"""status.goodput: what a job cost and what its failures cost, from the phase transitions the operator writes.

Updated only when the phase changes (a status write happens then anyway), so accounting adds no API request:
- gpuHours: GPU time of the gang while all of its nodes ran, for the periods that have ended; while Running,
  `runningSince` marks the open period (now - runningSince) x gpus is still to be added.
- restartDowntimeSeconds: wall time from each detected failure until the next gang ran again.
- stepsRedone: optimizer steps done twice because of restarts: the step the failed attempt reported last minus
  the step of the checkpoint the next attempt resumes from (only if that report came from the failed attempt).
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
    goodput = dict(before.get("goodput") or NOTHING_YET)
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
