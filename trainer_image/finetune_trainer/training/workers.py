"""The worker group torchrun formed, told to the operator: an attempt that restarts in place (api/elastic.py)
re-forms its group after a failed worker, a lost node or a joining one, and each new group's rank 0 reports it
after its first optimizer step (status.workers, and a line of workers.jsonl in the output directory): its nodes,
the accumulation that keeps the global batch, why the group before it ended, the steps it redid and how long
the recovery took, phase by phase (the callback: worker_report.py).

Why the group before ended is in what its workers left: each worker's result file (main.write_result) stays in
the launcher's result directory of its pod, where the next worker of the same local rank takes it over at start
(renamed, so a worker killed without a word leaves none, and the next one knows it). Every rank's share is
gathered to rank 0 once the group trains.

A group can end before it trains: on a loaded machine a crash's recovery formed a group without an agent that
missed the round, then stopped it at once for that agent to join. Such a group's workers leave, beside their own
ending, what ended the last group that trained (`before`), and their successors read that instead: the group that
trains next reports the crash that started the recovery, its time and the steps it cost, not the stop between.
"""

import json
import os
import time
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.api import exit_codes

# When this process started (as near as the trainer can tell): the recovery timeline's "workers started". A worker
# forked from the agent (agent.py) imported this long before it existed: its start is its fork.
PROCESS_STARTED = time.time()
_IMPORTED_BY = os.getpid()


def started() -> float:
    """When this worker process started: its import of this module, or its fork from the process that did."""
    if os.getpid() != _IMPORTED_BY:
        try:  # the process's own start, from /proc (clock ticks since boot)
            ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
            boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                        if line.startswith("btime"))
            return boot + ticks / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, StopIteration):
            return time.time()
    return PROCESS_STARTED
WORKERS_FILE = "workers.jsonl"
# The optimizer step this process reached, for its result file (how far the group got before it ended).
REACHED: dict[str, int] = {"step": 0}
# This process's group trained (its first optimizer step done; worker_report.py), and what ended the last group
# that did, as this worker's predecessor left it: carried on by a worker whose group ends before training.
TRAINED: dict[str, bool] = {"yes": False}
CARRIED: dict[str, Any] = {}
SILENT = {"silent": True}  # carried for a predecessor that ended without a word (killed)
# Errors that say a peer vanished, not what went wrong: the cause of a group's end is looked for elsewhere first.
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote process exited",
             "connection refused", "Socket Timeout", "timed out")
# ... raised by torch's collectives and store (gloo's as RuntimeError): a Hub download or an upload that timed out
# (requests' ReadTimeout, botocore's, an OSError) is the worker's own failure, never a lost peer.
PEER_ERRORS = ("RuntimeError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError")


def iso(seconds: float) -> str:
    """A wall-clock time as the status writes it, to the millisecond (a recovery takes seconds)."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{whole}.{int(seconds % 1 * 1000):03d}Z"


def parse_iso(text: str) -> float:
    import calendar

    whole, _, fraction = text.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + (float(f"0.{fraction}") if fraction else 0)


def take_predecessor(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The result the previous worker of this local rank left on this pod (None: this is the first, or it was
    killed without writing one); renamed so that the next worker does not read it again."""
    env = dict(os.environ) if env is None else env
    directory = env.get(c.ENV_RESULT_DIR)
    if not directory:
        return None
    rank = env.get(c.ENV_LOCAL_RANK, "0")
    path = Path(directory, f"result-{rank}.json")
    taken = Path(directory, f"previous-{rank}.json")
    try:
        os.replace(path, taken)
        result = json.loads(taken.read_text())
    except (OSError, ValueError):
        result = None
    # A predecessor whose group never trained stands for the one before it (see the module's docstring).
    ended = result.get("before", result) if isinstance(result, dict) else None
    ended = None if ended == SILENT else ended
    restarted = int(env.get(c.ENV_TORCHELASTIC_RESTART_COUNT, "0") or 0) > 0
    CARRIED.clear()
    CARRIED.update(ended or (SILENT if restarted else {}))
    return ended


def result_fields(result: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a worker's result adds for its successor: how far it got and when it ended; for a worker whose group
    never trained and that ended by being stopped or losing a peer (not by a failure of its own), what ended the
    last group that trained (`before`)."""
    fields: dict[str, Any] = {"step": REACHED["step"], "endedAt": iso(time.time()),
                              "restartCount": int(os.environ.get(c.ENV_TORCHELASTIC_RESTART_COUNT, "0") or 0)}
    own = result or {}
    passed_on = own.get("exitCode") == exit_codes.INTERRUPTED or _peer_lost(own)
    if CARRIED and not TRAINED["yes"] and passed_on:
        fields["before"] = dict(CARRIED)
    return fields


def _peer_lost(result: dict[str, Any]) -> bool:
    kind, said, text = str(result.get("message", "")).partition(": ")  # errors.outcome: "Type: message"
    return bool(said) and kind in PEER_ERRORS and any(word.lower() in text.lower() for word in PEER_LOST)


def _text(result: dict[str, Any]) -> str:
    return f"{result.get('reason') or 'Error'} (exit {result.get('exitCode')}): {result.get('message', '')}"


def describe(shares: list[dict[str, Any]]) -> dict[str, Any] | None:
    """From every rank's share (its predecessor's result or None, its agent's restart count): why the group before
    ended, when, and how far it got; None for an attempt's first group. The origin is a failure that is no lost
    peer, else a worker that ended without a word (killed), else a peer that went away (a lost node, whose workers
    are in no share), else the workers stopped to re-form the group."""
    ended = [s["predecessor"] for s in shares if s.get("predecessor")]
    silent = sum(1 for s in shares if not s.get("predecessor") and s.get("restartCount", 0) > 0)
    if not ended and not silent:
        return None
    failed = sorted((r for r in ended if r.get("exitCode") not in (0, None)), key=lambda r: r.get("endedAt") or "")
    own = [r for r in failed if not _peer_lost(r)]
    killed = f"{silent} worker(s) ended without a word (killed: SIGKILL, or the OOM killer)"
    lost = [r for r in failed if _peer_lost(r)]
    if own:
        cause = _text(own[0]) + (f"; {killed}" if silent else "")
    elif silent:
        cause = killed + (f", and the others lost them: {_text(lost[0])}" if lost else "")
    elif lost:
        cause = f"a peer went away (a node lost, or its workers): {_text(lost[0])}"
    else:
        cause = "the workers were stopped to re-form the group (a node joined or left)"
    times = [parse_iso(r["endedAt"]) for r in ended if r.get("endedAt")]
    return {"cause": cause[:1000], "failedAt": min(times) if times else None,
            "reached": max([int(r.get("step") or 0) for r in ended] or [0])}


def last_progress(output_dir: Path) -> tuple[int, float] | None:
    """(step, time) of the newest progress record: how far a group got when its rank 0 left no result."""
    try:
        with (output_dir / c.PROGRESS_FILE).open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "step" in record and record.get("time"):
            return int(record["step"]), parse_iso(record["time"])
    return None
