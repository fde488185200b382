"""Checkpoint uploads of output.uri, in the background: one uploader per node, in the node's first process.

Each checkpoint is snapshotted at once by hard links under `.uploading/node-<i>/` (the Trainer may rotate the
directory away while the upload runs; a directory per node, because nodes may share the output directory: a
`finetune run` of several nodes, a ReadWriteMany claim), then a thread uploads the snapshot. A node whose output
directory is node 0's uploads nothing: node 0's snapshot already holds its files. Every other node writes
`checkpoint-N/.nodes/node-<i>` when its files are up; node 0, once all those marks are there, writes
FINETUNE_COMPLETE last and applies checkpoints.keep in the bucket.

An outage is retried for as long as it lasts (training never waits); any other error a few times, then the
checkpoint is given up (said in the summary; its partial upload is removed once a later one is complete). While
uploads fall behind, only the newest checkpoints.keep stay queued: older ones would be rotated out of the bucket as
soon as they were complete."""

import json
import logging
import os
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
from finetune_trainer.outputs.bucket import NODES_DIR, remote_checkpoints

log = logging.getLogger(__name__)
SNAPSHOTS = ".uploading"
FINAL_ATTEMPTS = 8  # the final upload's retries (backoff up to a minute): ~5 minutes, then exit 74, retried
OTHER_ERROR_ATTEMPTS = 4  # an error that is not an outage: tried this often, then the checkpoint is given up


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class Superseded(Exception):
    """checkpoints.keep newer checkpoints are waiting: this one would be rotated out of the bucket once complete."""


class GivenUp(Exception):
    """A checkpoint's upload failed for a reason other than an outage (or another node's did)."""


@dataclass(frozen=True)
class NodeLayout:
    """Which node this is, of how many, and which nodes see node 0's output directory (their files are in node
    0's snapshot), with the token that tells this run's node marks from an earlier attempt's."""

    node: int
    nodes: int
    sharing: frozenset[int] = frozenset()
    token: str = ""

    @property
    def uploads(self) -> bool:
        return self.node == 0 or self.node not in self.sharing

    @property
    def awaited(self) -> list[int]:
        """The nodes whose marks node 0 waits for before it marks a checkpoint complete."""
        return [n for n in range(1, self.nodes) if n not in self.sharing]


@dataclass
class UploadState:
    """What node 0 tells the status: the newest complete checkpoint in the bucket and how far uploads are behind."""

    complete_step: int | None = None
    pending: list[int] = field(default_factory=list)  # saved here, not yet complete in the bucket
    behind_since: float | None = None  # since when a checkpoint waits for another's upload, or an upload retries
    last_error: str | None = None
    retries: int = 0
    skipped: list[int] = field(default_factory=list)  # superseded while uploads were behind (checkpoints.keep)

    def as_status(self, uri: str) -> dict[str, Any]:
        """status.upload, sent as a merge patch: a key that no longer applies is null (left out, the status would
        keep the old one: uploads "behind" for good after a recovery)."""
        out: dict[str, Any] = {"uri": uri, "pending": len(self.pending)}
        if self.complete_step is not None:
            out["completeStep"] = self.complete_step
        out["behindSince"] = _utc(self.behind_since) if self.behind_since is not None else None
        out["lastError"] = self.last_error[:500] if self.last_error else None
        return out


class CheckpointUploader:
    """One per node, in the node's first process: snapshots and uploads checkpoints in a background thread."""

    def __init__(self, uri: str, output_dir: Path, layout: NodeLayout, keep: int,
                 report: Callable[[Callable[[], dict[str, Any]]], None] | None = None, owner: Any = None):
        self.uri, self.output_dir, self.layout, self.keep = uri.rstrip("/"), output_dir, layout, keep
        self.node, self.nodes = layout.node, layout.nodes
        self.report, self.owner = report, owner  # owner: an OwnerRecord, checked before every upload
        self.state = UploadState(complete_step=None)
        self.failures: list[str] = []
        self.staging = output_dir / SNAPSHOTS / f"node-{layout.node}"
        self._clear_leftovers()
        self._queue: list[Path] = []
        self._closed = False
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="checkpoint-uploads", daemon=True)
        self._thread.start()

    def _clear_leftovers(self) -> None:
        """Snapshots an earlier process of this node left (killed, or ended while the store was down): the
        checkpoints still owed are handed over again by RemoteOutput.catch_up, within checkpoints.keep."""
        shutil.rmtree(self.staging, ignore_errors=True)
        if self.node == 0:  # the layout before per-node staging: .uploading/checkpoint-N
            for old in (self.output_dir / SNAPSHOTS).glob("checkpoint-*"):
                shutil.rmtree(old, ignore_errors=True)

    def submit(self, directory: Path) -> None:
        """A checkpoint this node just saved: snapshotted (hard links) now, uploaded in the background."""
        step = checkpoints.step_of(directory)
        if step is None or not directory.is_dir() or not self.layout.uploads:
            return
        snapshot = self.staging / directory.name
        shutil.rmtree(snapshot, ignore_errors=True)
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(directory, snapshot, copy_function=os.link)
        with self._lock:
            self._idle.clear()
            # Behind: a checkpoint saved before the previous one is up (or an upload retried, _retry).
            if self.state.pending and self.state.behind_since is None:
                self.state.behind_since = time.time()
            self.state.pending.append(step)
            self._queue.append(snapshot)
            self._drop_superseded()
            self._lock.notify()
        self._report()

    def _drop_superseded(self) -> None:
        """Under the lock: queued snapshots older than the newest checkpoints.keep pending ones go (the one being
        uploaded gives up at its next retry, _retry)."""
        for snapshot in [s for s in self._queue if self._superseded(checkpoints.step_of(s) or 0)]:
            step = checkpoints.step_of(snapshot) or 0
            self._queue.remove(snapshot)
            self.state.pending.remove(step)
            self.state.skipped.append(step)
            shutil.rmtree(snapshot, ignore_errors=True)
            log.warning("checkpoint-%d is not uploaded: %d newer checkpoint(s) wait (checkpoints.keep)", step,
                        self.keep)

    def _superseded(self, step: int) -> bool:
        return step not in sorted(self.state.pending)[-self.keep:]

    def wait(self, timeout: float) -> bool:
        """True once every submitted checkpoint is uploaded (and, on node 0, marked complete) or given up."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if not self._queue:
                    return
                snapshot = self._queue.pop(0)
            step = checkpoints.step_of(snapshot) or 0
            try:
                self._upload(snapshot, step)
            except Superseded:
                self.state.skipped.append(step)
                log.warning("checkpoint-%d is not uploaded: %d newer checkpoint(s) wait (checkpoints.keep)", step,
                            self.keep)
            except (StorageRefused, GivenUp) as exc:  # credentials revoked, a file gone: said, never fatal here
                self.failures.append(str(exc))
                self.state.last_error = str(exc)
            except Exception as exc:  # OwnershipLost (another run took the prefix over), or a bug: said
                self.failures.append(str(exc))
                self.state.last_error = str(exc)
                log.error("checkpoint-%d not uploaded: %s", step, exc)
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)
                with self._lock:
                    if step in self.state.pending:
                        self.state.pending.remove(step)
                    if not self.state.pending:
                        self.state.behind_since = None
                        self._idle.set()
                self._report()

    def _retry(self, action: Callable[[], Any], step: int) -> Any:
        """Until it works while the store is down (training goes on meanwhile); a few times for anything else;
        given up at once when newer checkpoints made this one pointless."""
        def note(attempt: int, exc: BaseException) -> None:
            with self._lock:
                if self._superseded(step):
                    raise Superseded(step) from exc
            self.state.retries += 1
            self.state.behind_since = self.state.behind_since or time.time()
            self.state.last_error = objectstore.explain(exc, self.uri)
            log.warning("checkpoint upload retry %d: %s", attempt, self.state.last_error)
            self._report()

        try:
            return objectstore.with_retries(action, attempts=10**6, first_wait=1.0, max_wait=60.0, on_retry=note,
                                            other_errors=OTHER_ERROR_ATTEMPTS)
        except Superseded:
            raise
        except Exception as exc:
            if objectstore.refused(exc):
                raise StorageRefused(objectstore.explain(exc, self.uri)) from exc
            raise GivenUp(f"checkpoint-{step}: {objectstore.explain(exc, self.uri)}") from exc

    def _upload(self, snapshot: Path, step: int) -> None:
        if self.owner is not None:
            self.owner.verify()
        target = f"{self.uri}/checkpoint-{step}"
        names = [str(p.relative_to(snapshot)) for p in sorted(snapshot.rglob("*")) if p.is_file()
                 and p.name != checkpoints.COMPLETE_MARKER]
        fs = objectstore.filesystem()
        mark = f"{target}/{NODES_DIR}/node-{self.node}"
        try:
            self._retry(lambda: upload_niced(snapshot, target, names), step)
        except GivenUp as exc:
            if self.node != 0:  # node 0 must not wait for these files
                failed = self._mark(failed=str(exc))
                self._retry(lambda: fs.pipe_file(mark, failed), step)
            raise
        if self.node != 0:
            self._retry(lambda: fs.pipe_file(mark, self._mark(files=len(names))), step)
            self._prune_local()
            return
        self._await_nodes(target, step)
        marker = snapshot / checkpoints.COMPLETE_MARKER
        body = marker.read_bytes() if marker.exists() else json.dumps({"step": step}).encode()
        self._retry(lambda: fs.pipe_file(f"{target}/{checkpoints.COMPLETE_MARKER}", body), step)  # last: complete
        self.state.complete_step = step
        self.state.last_error = None
        self._retry(self._prune_remote, step)
        self._retry(self._upload_progress, step)

    def _mark(self, **body: Any) -> bytes:
        return json.dumps({"token": self.layout.token, **body}).encode()

    def _await_nodes(self, target: str, step: int) -> None:
        """Until every other uploading node's mark of this checkpoint (this run's, by its token) is there. A node
        uploads in order: its mark of a later checkpoint means it left this one out (checkpoints.keep while it was
        behind), so node 0 does too."""
        waiting = set(self.layout.awaited)
        while waiting:
            for n in sorted(waiting):
                mark = self._read_mark(f"{target}/{NODES_DIR}/node-{n}", step)
                if mark is None:
                    if self._moved_past(n, step):
                        raise Superseded(step)
                    continue
                if mark.get("failed"):
                    raise GivenUp(f"checkpoint-{step}: node {n}'s upload failed: {mark['failed']}")
                waiting.discard(n)
            if waiting:
                time.sleep(1.0)  # the other nodes' uploads of this checkpoint are still running

    def _read_mark(self, path: str, step: int) -> dict[str, Any] | None:
        """A node's mark written by this run (an earlier attempt's, at the same step, does not count)."""
        fs = objectstore.filesystem()
        if not self._retry(lambda: fs.exists(path), step):
            return None
        try:
            mark = json.loads(self._retry(lambda: fs.cat_file(path), step))
        except ValueError:
            return None
        return mark if isinstance(mark, dict) and mark.get("token") == self.layout.token else None

    def _moved_past(self, node: int, step: int) -> bool:
        with self._lock:
            later = [s for s in self.state.pending if s > step]
        return any(self._read_mark(f"{self.uri}/checkpoint-{s}/{NODES_DIR}/node-{node}", step) is not None
                   for s in later)

    def _upload_progress(self) -> None:
        progress = self.output_dir / c.PROGRESS_FILE
        if progress.exists():
            objectstore.filesystem().put_file(str(progress), f"{self.uri}/{c.PROGRESS_FILE}")

    def _prune_remote(self) -> None:
        """checkpoints.keep complete ones stay; older partial uploads (killed attempts, given up) go too."""
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
        """A node with a directory of its own never rotates its checkpoints (only the main process does): keep the
        newest."""
        local = sorted((d for d in self.output_dir.glob("checkpoint-*") if checkpoints.step_of(d) is not None),
                       key=lambda d: checkpoints.step_of(d) or 0)
        for directory in local[: -self.keep]:
            shutil.rmtree(directory, ignore_errors=True)

    def _report(self) -> None:
        if self.report is not None and self.node == 0:  # read when sent: a state built earlier may be older
            self.report(lambda: self.state.as_status(self.uri))


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


def upload_final(uri: str, output_dir: Path, names: list[str], attempts: int | None = None) -> int:
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
            sent += objectstore.with_retries(lambda n=name: one(n), attempts=attempts or FINAL_ATTEMPTS)
        except Exception as exc:  # s3fs and botocore raise many types
            if objectstore.refused(exc):
                raise StorageRefused(objectstore.explain(exc, uri)) from exc
            raise UploadFailed(f"{output_dir / name} is saved but its upload to {uri} failed: "
                               f"{objectstore.explain(exc, uri)}; the next attempt only uploads") from exc
    return sent
