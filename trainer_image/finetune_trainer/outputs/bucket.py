"""What a run's output.uri holds, read back: its checkpoints (complete or not), and the restore of the newest
complete one (with the run's history) into a fresh output directory."""

import json
import logging
import os
import shutil
from pathlib import Path

from finetune_operator.api import constants as c
from finetune_trainer import objectstore
from finetune_trainer.outputs import checkpoints

log = logging.getLogger(__name__)
NODES_DIR = ".nodes"  # checkpoint-N/.nodes/node-<i>: node i's files of that checkpoint are uploaded


def remote_checkpoints(uri: str) -> dict[int, bool]:
    """step -> complete (FINETUNE_COMPLETE present) for every checkpoint-N under `uri`."""
    fs = objectstore.filesystem()
    prefix = uri.rstrip("/")
    try:
        entries = fs.ls(prefix, detail=False, refresh=True)
    except FileNotFoundError:
        return {}
    steps: dict[int, bool] = {}
    for entry in entries:
        step = checkpoints.step_of(Path(entry.rstrip("/")))
        if step is not None:
            steps[step] = fs.exists(f"{prefix}/checkpoint-{step}/{checkpoints.COMPLETE_MARKER}")
    return steps


def newest_remote(uri: str) -> int | None:
    complete = [step for step, done in remote_checkpoints(uri).items() if done]
    return max(complete) if complete else None


def restore(uri: str, output_dir: Path) -> Path | None:
    """The newest complete checkpoint of the bucket in `output_dir` (downloaded unless a complete local copy of it
    or of a newer one is there), plus progress.jsonl when the directory has none. Every process of a node may call
    it: a file lock lets the first download while the others wait. Returns the local checkpoint or None."""
    import fcntl

    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / ".restore.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            step = newest_remote(uri)
            _restore_history(uri, output_dir / c.PROGRESS_FILE, step)
        except Exception as exc:  # s3fs and botocore raise many types
            raise objectstore.failure(exc, uri) from exc
        if step is None:
            return None
        local = checkpoints.newest_complete(output_dir)
        if local is not None and (checkpoints.step_of(local) or 0) >= step:
            return local
        target = output_dir / f"checkpoint-{step}"
        source = f"{uri.rstrip('/')}/checkpoint-{step}"
        files = [f for f in objectstore.listing(source)
                 if not objectstore.relative(f, source).startswith(NODES_DIR + "/")]
        partial = output_dir / f".restoring-checkpoint-{step}"
        objectstore.with_retries(lambda: objectstore.download(files, source, partial), attempts=6)
        (partial / ".s3-manifest.json").unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
        log.info("restored %s from %s (%d files)", target, source, len(files))
        return target


def _restore_history(uri: str, progress: Path, step: int | None) -> None:
    """The run's progress.jsonl from the bucket, when this directory holds no step of it yet (a rerun in an empty
    directory, a gang restarted on fresh volumes), so the history and loss.png go on from the start instead of from
    the resumed step. Only the steps up to the checkpoint that is resumed (the later ones are trained again),
    appended after what this process already wrote (the data preparation's heartbeat, which has no step)."""
    here = progress.read_text(encoding="utf-8").splitlines() if progress.exists() else []
    if any('"step"' in line for line in here):
        return
    remote = f"{uri.rstrip('/')}/{c.PROGRESS_FILE}"
    if not objectstore.filesystem().exists(remote):
        return
    kept = []
    for line in objectstore.filesystem().cat_file(remote).decode("utf-8").splitlines():
        try:
            at = json.loads(line).get("step")
        except ValueError:
            continue  # a line cut by an upload that was interrupted
        if isinstance(at, int) and (step is None or at <= step):
            kept.append(line)
    progress.parent.mkdir(parents=True, exist_ok=True)
    with progress.open("a", encoding="utf-8") as f:  # appended, never rewritten: `finetune run` follows the file
        f.write("".join(f"{line}\n" for line in kept))
