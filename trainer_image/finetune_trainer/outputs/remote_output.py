"""output.uri: checkpoints, progress and the final model in object storage, so a job needs no shared volume.

What a run does with its bucket, in order: claim the prefix (outputs/owner.py: one writer at a time), check that
it takes writes, restore the newest complete checkpoint (outputs/bucket.py), upload every checkpoint in the
background (outputs/uploads.py), drain the uploads on a stop, and upload the final model before the trainer
reports success."""

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_trainer import objectstore
from finetune_trainer.errors import Interrupted, stop_cause
from finetune_trainer.outputs import checkpoints
from finetune_trainer.outputs.bucket import remote_checkpoints, restore
from finetune_trainer.outputs.owner import OwnerRecord, OwnershipLost, take_over_asked, writer_of
from finetune_trainer.outputs.uploads import CheckpointUploader, NodeLayout, upload_final

log = logging.getLogger(__name__)
DRAIN_SECONDS = 240.0  # after a stop signal: within the pod's 300 s grace, the SIGTERM checkpoint reaches the bucket
FINISH_WAIT_SECONDS = 600.0  # at the end: the last checkpoints' uploads, before the final model's
NODE_ZERO_FILE = ".finetune-node-0"  # node 0's token in its output directory: who else sees it shares it


def node_rank() -> int:
    """This process's node: torchrun's GROUP_RANK (PET_NODE_RANK in a pod), 0 for a single node."""
    return int(os.environ.get("GROUP_RANK") or os.environ.get(c.ENV_PET_NODE_RANK, "0") or 0)


def local_rank() -> int:
    return int(os.environ.get(c.ENV_LOCAL_RANK, "0") or 0)


def node_layout(output_dir: Path, nodes: int) -> NodeLayout:
    """Which nodes see node 0's output directory (a `finetune run` of several nodes, a ReadWriteMany claim), by a
    token node 0 writes there and hands every process: one collective, so every process of the gang calls it."""
    node = node_rank()
    if nodes == 1:
        return NodeLayout(node, nodes, frozenset(), uuid.uuid4().hex)
    import torch.distributed as dist

    token = None
    if dist.get_rank() == 0:
        token = uuid.uuid4().hex
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / NODE_ZERO_FILE).write_text(token)
    shared = [token]
    dist.broadcast_object_list(shared)
    token = shared[0]
    try:
        sees = (output_dir / NODE_ZERO_FILE).read_text() == token
    except OSError:
        sees = False
    seen: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (node, sees))
    return NodeLayout(node, nodes, frozenset(n for n, s in seen if s and n != 0), token)


@dataclass(frozen=True)
class Claimed:
    """The run's owner record (who this run is), and what claiming the prefix had to say."""

    owner: OwnerRecord
    notes: list[str]


def claim_prefix(cfg: Any, is_main: bool) -> Claimed:
    """Before anything is loaded, torch.distributed included: on the main process, the bucket exists and takes
    writes (refused or missing: exit 77) and no other run writes this prefix (exit 78, outputs/owner.py)."""
    owner = OwnerRecord(cfg.spec.output.uri, writer_of(cfg.job_name, cfg.namespace, cfg.job_uid, cfg.output_dir),
                        take_over=take_over_asked())
    if not is_main:
        return Claimed(owner, [])
    objectstore.check_bucket(cfg.spec.output.uri)
    note = owner.claim()
    return Claimed(owner, [note] if note is not None else [])


class RemoteOutput:
    """What a run does for output.uri: claim and check the bucket, restore the newest complete checkpoint, upload
    each checkpoint in the background (`callback`), drain on a stop, upload the final model before succeeding."""

    def __init__(self, uri: str, output_dir: Path, nodes: int, keep: int, is_main: bool, reporter: Any = None,
                 owner: OwnerRecord | None = None):
        self.uri, self.output_dir, self.is_main, self.reporter = uri.rstrip("/"), output_dir, is_main, reporter
        self.owner = owner
        self.lost = False  # set on every process when the gang learned at a save that the prefix was taken over
        self.notes: list[str] = []  # said on the console once the run's warnings exist
        self.progress: Any = None  # the ProgressCallback, whose records then carry the upload state
        self.layout = node_layout(output_dir, nodes)
        self.uploader = (CheckpointUploader(self.uri, output_dir, self.layout, keep, report=self._report, owner=owner)
                         if local_rank() == 0 else None)

    @classmethod
    def for_run(cls, cfg: Any, is_main: bool, claimed: "Claimed", reporter: Any = None) -> "RemoteOutput":
        """A trainer's: the job's output.uri, nodes and keep, and the owner record claim_prefix() checked. Every
        process of the gang calls it together (the node layout is a collective)."""
        spec = cfg.spec
        remote = cls(spec.output.uri, cfg.output_dir, spec.distributed.num_nodes, spec.checkpoints.keep, is_main,
                     reporter, claimed.owner)
        remote.notes += claimed.notes
        return remote

    def restore(self) -> Path | None:
        return restore(self.uri, self.output_dir)

    def callback(self, progress: Any = None) -> Any:
        from finetune_trainer.outputs.upload_callback import UploadCallback

        self.progress = progress
        return UploadCallback(self)

    def lost_here(self) -> bool:
        """Whether this process knows the prefix was taken over (the main process reads the owner record now)."""
        if self.owner is None:
            return False
        if self.is_main:
            try:
                self.owner.verify()
            except OwnershipLost:
                return True
        return self.owner.lost is not None

    def taken_over(self) -> OwnershipLost | None:
        """Why training stopped when the gang learned at a save that another run took the prefix over."""
        if not self.lost:
            return None
        return (self.owner.lost if self.owner is not None and self.owner.lost is not None else
                OwnershipLost(f"{self.uri} was taken over by another run: this run uploads nothing more there"))

    def catch_up(self) -> list[str]:
        """The complete checkpoints here that the bucket lacks (a run that exited 74 with uploads behind, a stop
        during an outage): handed to the uploader now, not forgotten. Returns their names. Node 0 of a run whose
        nodes all share its directory only: a node with a directory of its own (a fresh pod's) no longer has its
        part of an earlier checkpoint."""
        if self.uploader is None or self.layout.node != 0 or self.layout.awaited:
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

    def finish(self, names: list[str], say: Callable[[str], None] | None = None,
               stopped: Callable[[], int | None] | None = None) -> dict[str, Any]:
        """Every node's pending checkpoints (bounded), then, on the main process, `names` (final/, ...); while it
        waits, `say` hears every minute what is still behind and how long it may wait. A stop signal meanwhile
        (`stopped` returns it) ends the wait: Interrupted, saying that the model is saved here, not uploaded."""
        deadline = time.monotonic() + FINISH_WAIT_SECONDS
        next_word = time.monotonic() + 60.0
        drained = self.drain(min(1.0, FINISH_WAIT_SECONDS))
        while not drained and (left := deadline - time.monotonic()) > 0:
            self._interrupted(stopped)
            if time.monotonic() >= next_word:
                next_word += 60.0
                if say is not None and (behind := self.behind()) is not None:
                    say(f"still waiting for {behind}; at most {left / 60:.0f} more min")
            drained = self.drain(min(1.0, left))
        self._interrupted(stopped)
        out: dict[str, Any] = {"uri": self.uri}
        if self.uploader is not None:
            state = self.uploader.state
            out.update(checkpointUploadRetries=state.retries,
                       **({"completeStep": state.complete_step} if state.complete_step is not None else {}),
                       **({"checkpointsNotUploaded": list(state.pending)} if not drained else {}),
                       **({"checkpointsSkipped": sorted(state.skipped)} if state.skipped else {}),
                       **({"checkpointUploadFailures": self.uploader.failures} if self.uploader.failures else {}))
        if self.owner is not None:
            self.owner.verify()  # a run whose prefix was taken over uploads no final model over the new owner's
        if self.is_main:
            out["bytes"] = upload_final(self.uri, self.output_dir, names)
        if self.uploader is not None:
            self.uploader.close()
        return out

    def _interrupted(self, stopped: Callable[[], int | None] | None) -> None:
        signum = stopped() if stopped is not None else None
        if signum is None:
            return
        behind = self.behind()
        raise Interrupted(f"stopped by {stop_cause(signum)} after training had finished, while waiting for "
                          f"{behind or 'the uploads'}: the final model is saved in {self.output_dir} but not "
                          f"uploaded to {self.uri}; the next run resumes at the last step and only uploads")

    def _report(self, state: Callable[[], dict[str, Any]]) -> None:
        """Node 0's uploader: status.upload (`state`, read as it is sent), and status.checkpoint once a checkpoint
        is complete in the bucket."""
        if not self.is_main:
            return

        def update() -> dict[str, Any]:
            upload = state()
            out: dict[str, Any] = {"upload": upload}
            if upload.get("completeStep") is not None:
                step = upload["completeStep"]
                out["checkpoint"] = {"step": step, "path": f"{self.uri}/checkpoint-{step}"}
            return out

        if self.progress is not None:  # ordered with the loop's own reports
            self.progress.report_from_thread(update)
        elif self.reporter is not None:
            self.reporter.report(update(), force=True)
