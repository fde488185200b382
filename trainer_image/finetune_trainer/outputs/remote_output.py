"""output.uri: checkpoints, progress and the final model in object storage, so a job needs no shared volume.

Every checkpoint is written locally first (the Trainer's own save), then each node uploads the files it wrote in
the background: the node's first process takes a hard-link snapshot at once (the Trainer may rotate the directory
away while the upload runs) and a thread uploads it, retrying with backoff while the store is unreachable; training
never waits. Each node then writes `checkpoint-N/.nodes/node-<i>`; node 0, once every node's mark is there, writes
FINETUNE_COMPLETE last, so a partial upload (a gang killed mid-way) is never chosen for resume, and applies
checkpoints.keep in the bucket. A new attempt (or `finetune run` in an empty directory) downloads the newest
complete checkpoint before the first step. The final model is uploaded before the trainer reports success."""

import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.api import exit_codes
from finetune_trainer import objectstore
from finetune_trainer.errors import StorageRefused, UploadFailed
from finetune_trainer.outputs import checkpoints

log = logging.getLogger(__name__)
NODES_DIR = ".nodes"
SNAPSHOTS = ".uploading"
FINAL_ATTEMPTS = 8  # the final upload's retries (backoff up to a minute): ~5 minutes, then exit 74, retried


def node_rank() -> int:
    """This process's node: torchrun's GROUP_RANK (PET_NODE_RANK in a pod), 0 for a single node."""
    return int(os.environ.get("GROUP_RANK") or os.environ.get(c.ENV_PET_NODE_RANK, "0") or 0)


def local_rank() -> int:
    return int(os.environ.get(c.ENV_LOCAL_RANK, "0") or 0)


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


# --- in the bucket -----------------------------------------------------------------------------------------------
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


# --- uploads ------------------------------------------------------------------------------------------------------
@dataclass
class UploadState:
    """What node 0 tells the status: the newest complete checkpoint in the bucket and how far uploads are behind."""

    complete_step: int | None = None
    pending: list[int] = field(default_factory=list)  # saved here, not yet complete in the bucket
    behind_since: float | None = None  # since when a checkpoint waits for another's upload, or an upload retries
    last_error: str | None = None
    retries: int = 0

    def as_status(self, uri: str) -> dict[str, Any]:
        out: dict[str, Any] = {"uri": uri, "pending": len(self.pending)}
        if self.complete_step is not None:
            out["completeStep"] = self.complete_step
        if self.behind_since is not None:
            out["behindSince"] = _utc(self.behind_since)
        if self.last_error:
            out["lastError"] = self.last_error[:500]
        return out


class CheckpointUploader:
    """One per node, in the node's first process: snapshots and uploads checkpoints in a background thread."""

    def __init__(self, uri: str, output_dir: Path, node: int, nodes: int, keep: int,
                 report: Callable[[dict[str, Any]], None] | None = None):
        self.uri, self.output_dir, self.node, self.nodes, self.keep = uri.rstrip("/"), output_dir, node, nodes, keep
        self.report = report
        self.state = UploadState(complete_step=None)
        self.failures: list[str] = []
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="checkpoint-uploads", daemon=True)
        self._thread.start()

    def submit(self, directory: Path) -> None:
        """A checkpoint this node just saved: snapshotted (hard links) now, uploaded in the background."""
        step = checkpoints.step_of(directory)
        if step is None or not directory.is_dir():
            return
        snapshot = self.output_dir / SNAPSHOTS / directory.name
        shutil.rmtree(snapshot, ignore_errors=True)
        shutil.copytree(directory, snapshot, copy_function=os.link)
        with self._lock:
            self._idle.clear()
            # Behind: a checkpoint saved before the previous one is up (or an upload retried, _retry).
            if self.state.pending and self.state.behind_since is None:
                self.state.behind_since = time.time()
            self.state.pending.append(step)
        self._queue.put(snapshot)
        self._report()

    def wait(self, timeout: float) -> bool:
        """True once every submitted checkpoint is uploaded (and, on node 0, marked complete)."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            snapshot = self._queue.get()
            if snapshot is None:
                return
            step = checkpoints.step_of(snapshot) or 0
            try:
                self._upload(snapshot, step)
            except StorageRefused as exc:  # credentials revoked mid-run: nothing to retry; said, never fatal here
                self.failures.append(str(exc))
                self.state.last_error = str(exc)
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)
                with self._lock:
                    if step in self.state.pending:
                        self.state.pending.remove(step)
                    if not self.state.pending:
                        self.state.behind_since = None
                        self._idle.set()
                self._report()

    def _retry(self, action: Callable[[], Any]) -> Any:
        """Until it works: the store may be down for a while; training goes on meanwhile."""
        def note(attempt: int, exc: BaseException) -> None:
            self.state.retries += 1
            self.state.behind_since = self.state.behind_since or time.time()
            self.state.last_error = objectstore.explain(exc, self.uri)
            log.warning("checkpoint upload retry %d: %s", attempt, self.state.last_error)
            self._report()

        try:
            return objectstore.with_retries(action, attempts=10**6, first_wait=1.0, max_wait=60.0, on_retry=note)
        except Exception as exc:
            if objectstore.refused(exc):
                raise StorageRefused(objectstore.explain(exc, self.uri)) from exc
            raise

    def _upload(self, snapshot: Path, step: int) -> None:
        target = f"{self.uri}/checkpoint-{step}"
        names = [str(p.relative_to(snapshot)) for p in sorted(snapshot.rglob("*")) if p.is_file()
                 and p.name != checkpoints.COMPLETE_MARKER]
        self._retry(lambda: upload_niced(snapshot, target, names))
        self._retry(lambda: objectstore.filesystem().pipe_file(f"{target}/{NODES_DIR}/node-{self.node}", b"{}"))
        if self.node != 0:
            self._prune_local()
            return
        fs = objectstore.filesystem()
        while not all(self._retry(lambda n=n: fs.exists(f"{target}/{NODES_DIR}/node-{n}"))
                      for n in range(self.nodes)):
            time.sleep(1.0)  # the other nodes' uploads of this checkpoint are still running
        marker = snapshot / checkpoints.COMPLETE_MARKER
        body = marker.read_bytes() if marker.exists() else json.dumps({"step": step}).encode()
        self._retry(lambda: fs.pipe_file(f"{target}/{checkpoints.COMPLETE_MARKER}", body))  # last: complete now
        self.state.complete_step = step
        self.state.last_error = None
        self._retry(self._prune_remote)
        self._retry(self._upload_progress)

    def _upload_progress(self) -> None:
        progress = self.output_dir / c.PROGRESS_FILE
        if progress.exists():
            objectstore.filesystem().put_file(str(progress), f"{self.uri}/{c.PROGRESS_FILE}")

    def _prune_remote(self) -> None:
        """checkpoints.keep complete ones stay; older partial uploads (killed attempts) go too."""
        steps = remote_checkpoints(self.uri)
        complete = sorted((s for s, done in steps.items() if done), reverse=True)
        if not complete:
            return
        kept = set(complete[: self.keep])
        fs = objectstore.filesystem()
        for step, done in steps.items():
            if step not in kept and (done or step < complete[0]):
                fs.rm(f"{self.uri}/checkpoint-{step}", recursive=True)

    def _prune_local(self) -> None:
        """A node other than 0 never rotates its own checkpoints (only the main process does): keep the newest."""
        local = sorted((d for d in self.output_dir.glob("checkpoint-*") if checkpoints.step_of(d) is not None),
                       key=lambda d: checkpoints.step_of(d) or 0)
        for directory in local[: -self.keep]:
            shutil.rmtree(directory, ignore_errors=True)

    def _report(self) -> None:
        if self.report is not None and self.node == 0:
            self.report(self.state.as_status(self.uri))


class UploadProcessFailed(OSError):
    """upload_files exited non-zero: refused (77) or unreachable (74), as objectstore.refused/unreachable read."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        if code == exit_codes.PUSH_REFUSED:
            self.response = {"Error": {"Code": "AccessDenied"}}
        elif code == exit_codes.PUSH_FAILED:
            self.response = {"Error": {"Code": "ServiceUnavailable"}}


def upload_niced(local: Path, uri: str, names: list[str]) -> None:
    """The files, uploaded by `python -m finetune_trainer.outputs.upload_files` at nice 19 (argv, no shell)."""
    from finetune_trainer.outputs.upload_files import ENV_S3

    env = {**os.environ, ENV_S3: json.dumps(objectstore.settings().model_dump(mode="json", by_alias=True))}
    # The idle I/O class too, where util-linux's ionice is there: reading a checkpoint must not slow the next save.
    idle_io = ["ionice", "-c", "3"] if shutil.which("ionice") else []
    proc = subprocess.run([*idle_io, sys.executable, "-m", "finetune_trainer.outputs.upload_files", str(local), uri,
                           *names], env=env, capture_output=True, text=True, preexec_fn=_lowest_priority, check=False)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise UploadProcessFailed(proc.returncode, lines[-1] if lines else f"upload_files exited {proc.returncode}")


def _lowest_priority() -> None:
    os.nice(19)


def upload_final(uri: str, output_dir: Path, names: list[str]) -> int:
    """final/ (merged/), loss.png, progress.jsonl and the summary under `uri`, before the trainer says it
    succeeded; an outage that outlasts the retries is UploadFailed (74): the next attempt resumes at the last
    step and only uploads."""
    def one(name: str) -> int:
        path = output_dir / name
        if path.is_dir():
            files = [str(p.relative_to(path)) for p in sorted(path.rglob("*")) if p.is_file()]
            return objectstore.upload(path, f"{uri.rstrip('/')}/{name}", files)
        return objectstore.upload(output_dir, uri, [name]) if path.exists() else 0

    sent = 0
    for name in names:
        try:
            sent += objectstore.with_retries(lambda n=name: one(n), attempts=FINAL_ATTEMPTS)
        except Exception as exc:  # s3fs and botocore raise many types
            if objectstore.refused(exc):
                raise StorageRefused(objectstore.explain(exc, uri)) from exc
            raise UploadFailed(f"{output_dir / name} is saved but its upload to {uri} failed: "
                               f"{objectstore.explain(exc, uri)}; the next attempt only uploads") from exc
    return sent


DRAIN_SECONDS = 240.0  # after a stop signal: within the pod's 300 s grace, the SIGTERM checkpoint reaches the bucket
FINISH_WAIT_SECONDS = 600.0  # at the end: the last checkpoints' uploads, before the final model's


class RemoteOutput:
    """What a run does for output.uri: check the bucket, restore the newest complete checkpoint, upload each
    checkpoint in the background (`callback`), drain on a stop, upload the final model before succeeding."""

    def __init__(self, uri: str, output_dir: Path, nodes: int, keep: int, is_main: bool, reporter: Any = None):
        self.uri, self.output_dir, self.is_main, self.reporter = uri.rstrip("/"), output_dir, is_main, reporter
        self.progress: Any = None  # the ProgressCallback, whose records then carry the upload state
        self.uploader = (CheckpointUploader(self.uri, output_dir, node_rank(), nodes, keep, report=self._report)
                         if local_rank() == 0 else None)

    def check(self) -> None:
        """Before anything is loaded: the bucket exists and takes writes (refused or missing: exit 77)."""
        if self.is_main:
            objectstore.check_bucket(self.uri)

    def restore(self) -> Path | None:
        return restore(self.uri, self.output_dir)

    def callback(self, progress: Any = None) -> Any:
        from finetune_trainer.training.callbacks import UploadCallback

        self.progress = progress
        return UploadCallback(self.uploader)

    def catch_up(self) -> list[str]:
        """The complete checkpoints here that the bucket lacks (a run that exited 74 with uploads behind, a stop
        during an outage): handed to the uploader now, not forgotten. Returns their names. One node only: a
        multi-node checkpoint needs every node's part, which fresh pods no longer have."""
        if self.uploader is None or self.uploader.nodes > 1:
            return []
        try:
            there = remote_checkpoints(self.uri)
        except Exception as exc:  # s3fs and botocore raise many types
            raise objectstore.failure(exc, self.uri) from exc
        behind = sorted((d for d in self.output_dir.glob("checkpoint-*")
                         if (step := checkpoints.step_of(d)) is not None and not there.get(step)
                         and (d / checkpoints.COMPLETE_MARKER).exists()), key=lambda d: checkpoints.step_of(d) or 0)
        kept = behind[-self.uploader.keep:]  # checkpoints.keep: older ones would be rotated out at once
        for directory in kept:
            self.uploader.submit(directory)
        return [d.name for d in kept]

    def bucket_copy(self, local: Path) -> str | None:
        """The bucket's URI of a local checkpoint when it is complete there too, else None (also when the store
        cannot say: a name is not worth failing a run for)."""
        step = checkpoints.step_of(local)
        try:
            complete = step is not None and remote_checkpoints(self.uri).get(step)
        except Exception:  # s3fs and botocore raise many types
            return None
        return f"{self.uri.rstrip('/')}/{local.name}" if complete else None

    def behind(self) -> str | None:
        """What the uploads still owe, in words (with the last error), or None when nothing is pending."""
        state = self.uploader.state if self.uploader is not None else None
        if state is None or not state.pending:
            return None
        why = f" (so far: {state.last_error[:200]})" if state.last_error else ""
        return f"{len(state.pending)} checkpoint upload(s) to reach the bucket{why}"

    def drain(self, timeout: float = DRAIN_SECONDS) -> bool:
        return self.uploader is None or self.uploader.wait(timeout)

    def finish(self, names: list[str], say: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Every node's pending checkpoints (bounded), then, on the main process, `names` (final/, ...); while it
        waits, `say` hears every minute what is still behind and how long it may wait."""
        deadline = time.monotonic() + FINISH_WAIT_SECONDS
        drained = self.drain(min(60.0, FINISH_WAIT_SECONDS))
        while not drained and (left := deadline - time.monotonic()) > 0:
            if say is not None and (behind := self.behind()) is not None:
                say(f"still waiting for {behind}; at most {left / 60:.0f} more min")
            drained = self.drain(min(60.0, left))
        out: dict[str, Any] = {"uri": self.uri}
        if self.uploader is not None:
            out.update(checkpointUploadRetries=self.uploader.state.retries,
                       **({"completeStep": self.uploader.state.complete_step}
                          if self.uploader.state.complete_step is not None else {}),
                       **({"checkpointsNotUploaded": list(self.uploader.state.pending)} if not drained else {}),
                       **({"checkpointUploadFailures": self.uploader.failures} if self.uploader.failures else {}))
        if self.is_main:
            out["bytes"] = upload_final(self.uri, self.output_dir, names)
        if self.uploader is not None:
            self.uploader.close()
        return out

    def _report(self, state: dict[str, Any]) -> None:
        """Node 0's uploader: status.upload, and status.checkpoint once a checkpoint is complete in the bucket."""
        if not self.is_main:
            return
        update: dict[str, Any] = {"upload": state}
        if state.get("completeStep") is not None:
            step = state["completeStep"]
            update["checkpoint"] = {"step": step, "path": f"{self.uri}/checkpoint-{step}"}
        if self.progress is not None:
            self.progress.upload = state
            if "checkpoint" in update:
                self.progress.checkpoint = update["checkpoint"]
        if self.reporter is not None:
            self.reporter.report(update, force=True)
