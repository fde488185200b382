"""Trainer callbacks: progress records (JSONL + FineTuneJob status), checkpoint completion markers, uploads, graceful
stop. The divergence guard is in divergence.py."""

import json
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from finetune_operator.api import constants as c
from finetune_trainer.errors import EARLY_STOPS
from finetune_trainer.outputs import checkpoints
from finetune_trainer.outputs.status_report import StatusReporter
from finetune_trainer.training import throughput


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def format_eta(seconds: float | None) -> str | None:
    if seconds is None or seconds < 0 or math.isinf(seconds) or math.isnan(seconds):
        return None
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# TRL's preference metrics -> our progress record and status.progress. RewardTrainer names a reward model's score
# margin and accuracy (chosen scored above rejected) without the prefix. An evaluation's (eval_*) are the held-out
# preference: what a preference objective has instead of a perplexity.
REWARD_LOGS = {"rewards/margins": "rewardsMargin", "rewards/accuracies": "rewardsAccuracy",
               "rewards/chosen": "rewardsChosen", "rewards/rejected": "rewardsRejected",
               "margin": "rewardsMargin", "accuracy": "rewardsAccuracy",
               "eval_rewards/margins": "evalRewardsMargin", "eval_rewards/accuracies": "evalRewardsAccuracy",
               "eval_margin": "evalRewardsMargin", "eval_accuracy": "evalRewardsAccuracy"}


class ProgressCallback(TrainerCallback):
    """On rank 0: appends one JSON record per log step and forwards it to the FineTuneJob status."""

    def __init__(self, output_dir: Path, reporter: StatusReporter | None = None, precision: str = "fp32",
                 peak_tflops: float | None = None, attempt: int | None = None):
        self.path = output_dir / c.PROGRESS_FILE
        self.attempt = attempt  # with startStep in every record: loss.png marks where a restart or resume began
        self.reporter = reporter
        self.precision, self.peak_tflops = precision, peak_tflops
        self.counts: throughput.ParameterCounts | None = None
        self.peak: float | None = None
        self.started: float | None = None
        self.start_step = self.start_tokens = 0
        self.last_time: float | None = None
        self.last_tokens = 0
        self.checkpoint: dict[str, Any] | None = None
        self.sent_checkpoint: dict[str, Any] | None = None  # the one the status has (on_save sends only a newer one)
        self.upload: dict[str, Any] | None = None  # output.uri: how far checkpoint uploads are behind
        self.last_record: dict[str, Any] = {}
        # Reports come from the loop and from the threads that complete checkpoints (an overlapped write, the
        # upload): each is built and sent under this lock, so a loop report that read the older checkpoint can
        # never reach the apiserver after the newer one (the last patch wins).
        self._reporting = threading.Lock()

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = self.last_time = time.monotonic()
        self.start_step = state.global_step  # a resumed run's rate counts only steps done in this process
        self.start_tokens = self.last_tokens = state.num_input_tokens_seen
        if kwargs.get("model") is not None:
            self.counts = throughput.parameter_counts(kwargs["model"])
        self.peak = throughput.peak_flops(_device_name(), self.precision, self.peak_tflops)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or self.started is None:
            return
        if "train_loss" in logs:  # the end-of-training summary: the last step already has its record
            return
        now = time.monotonic()
        tokens = state.num_input_tokens_seen
        if tokens > self.last_tokens and now > self.last_time:
            tokens_per_second = (tokens - self.last_tokens) / (now - self.last_time)
            self.last_time, self.last_tokens = now, tokens
        else:  # an evaluation log between steps: no new tokens, keep the last measured rate
            tokens_per_second = self.last_record.get("tokensPerSecond")
        done = state.global_step - self.start_step
        per_step = (now - self.started) / done if done > 0 else None
        # No ETA once the last step is done: a finished job shows none (not "0m00s" beside Succeeded).
        left = state.max_steps - state.global_step
        eta = per_step * left if per_step is not None and left > 0 else None
        per_device = tokens_per_second / args.world_size if tokens_per_second is not None else None
        utilization = (throughput.mfu(per_device, self.counts, self.peak)
                       if per_device is not None and self.counts is not None else None)
        record = {
            "time": _utc_now(), "step": state.global_step, "maxSteps": state.max_steps, "epoch": state.epoch,
            "loss": logs.get("loss", self.last_record.get("loss")), "evalLoss": logs.get("eval_loss"),
            "evalPerplexity": logs.get("eval_perplexity"),
            "learningRate": logs.get("learning_rate", self.last_record.get("learningRate")),
            "tokensPerSecond": tokens_per_second, "tokensPerSecondPerDevice": per_device,
            "mfu": round(utilization, 4) if utilization is not None else None,
            "peakMemoryGiB": _peak_memory_gib(), "tokensSeen": tokens, "eta": format_eta(eta),
            "checkpoint": self.checkpoint, **({"upload": self.upload} if self.upload is not None else {}),
            "attempt": self.attempt, "startStep": self.start_step,
        }
        for key, name in REWARD_LOGS.items():  # preference objectives (TRL's trainers log them per step)
            if logs.get(key) is not None:
                record[name] = logs[key]
        for name in REWARD_LOGS.values():  # an evaluation's record keeps the last training values
            if name not in record and self.last_record.get(name) is not None:
                record[name] = self.last_record[name]
        if "reward" in logs or "reward" in self.last_record:  # GRPO (training/grpo.py)
            from finetune_trainer.training.grpo import grpo_record

            record.update(grpo_record(logs, self.last_record))
        self.last_record = record
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self._report(record)

    def on_save(self, args, state, control, **kwargs):
        # A synchronous save was just marked (CheckpointMarkerCallback, before this); an overlapped one is reported
        # by the writer's thread once written, and the one known here is already in the status.
        if state.is_world_process_zero and self.checkpoint is not None and self.checkpoint != self.sent_checkpoint:
            self._report(self.last_record, force=True)

    def on_train_end(self, args, state, control, **kwargs):
        # The last step's record may have been within the reporter's interval (not sent): a finished run's status
        # must say its last step.
        if state.is_world_process_zero and self.last_record:
            self._report(self.last_record, force=True)

    def report_from_thread(self, status: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """A checkpoint completed (or an upload's state) outside the loop, kept for the loop's next reports and
        sent at once with the last progress record, ordered after any loop report that read the old value.
        `status` may be a function, called under the same lock (a state read then is the newest)."""
        with self._reporting:
            status = status() if callable(status) else status
            if not status:
                return
            self.checkpoint = status.get("checkpoint", self.checkpoint)
            self.upload = status.get("upload", self.upload)
            if self.reporter is not None:
                progress = {"progress": {**status_progress(self.last_record), "message": None}} if (
                    "checkpoint" in status and self.last_record) else {}
                self._send({**progress, **status}, force=True)

    def report_restored(self, step: int, path: str, source: str) -> None:
        """The checkpoint this attempt resumed from (status.checkpoint.restoredFrom, `source`: its bucket copy with
        output.uri). An upload catching up in its thread may already have reported a newer checkpoint: that one
        stays the status's checkpoint, and restoredFrom is still said (else an earlier attempt's would stay: a merge
        patch keeps what it leaves out)."""
        def status() -> dict[str, Any]:
            known = self.checkpoint or {}
            if known.get("step", -1) > step:
                return {"checkpoint": {**known, "restoredFrom": source}}
            return {"checkpoint": {"step": step, "path": path, "restoredFrom": source}}

        self.report_from_thread(status)

    def attempt_totals(self, state, runtime_seconds: float | None) -> dict[str, Any]:
        """Steps and tokens of this process's training alone: a resumed attempt's rate must not count the tokens
        of the attempts before it (a run resumed at its last step trained nothing)."""
        steps, tokens = state.global_step - self.start_step, state.num_input_tokens_seen - self.start_tokens
        rate = tokens / runtime_seconds if steps > 0 and tokens > 0 and runtime_seconds else None
        return {"attemptSteps": steps, "attemptTokens": tokens, "tokensPerSecond": rate}

    def _report(self, record: dict[str, Any], force: bool = False) -> None:
        # A report the reporter would drop (within its interval) must not wait for another thread's on the wire.
        if self.reporter is None or not self.reporter.due(force):
            return
        with self._reporting:
            # phase Training replaces the Preparing heartbeat, and the merge patch's null drops its message.
            status: dict[str, Any] = {"progress": {**status_progress(record), "message": None}}
            if self.checkpoint is not None:
                status["checkpoint"] = self.checkpoint
            self._send(status, force=force)

    def _send(self, status: dict[str, Any], force: bool) -> None:
        """One patch (under _reporting); the checkpoint it carried is then the status's."""
        if self.reporter is not None and self.reporter.report(status, force=force) and "checkpoint" in status:
            self.sent_checkpoint = status["checkpoint"]


def _significant(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def status_progress(record: dict[str, Any]) -> dict[str, Any]:
    """status.progress from a progress.jsonl record, rounded for the columns people read (`kubectl get ftj`):
    losses to 4 significant digits, tokens/s to whole tokens. progress.jsonl keeps full precision."""
    percent = int(100 * record["step"] / record["maxSteps"]) if record.get("maxSteps") else None
    per_device = record.get("tokensPerSecondPerDevice")
    progress = {"phase": "Training", "step": record["step"], "maxSteps": record["maxSteps"],
                "epoch": _significant(record.get("epoch"), 6),
                "percent": percent, "loss": _significant(record["loss"]),
                "evalLoss": _significant(record.get("evalLoss")), "learningRate": _significant(record["learningRate"]),
                "tokensPerSecond": None if record["tokensPerSecond"] is None else round(record["tokensPerSecond"]),
                "tokensPerSecondPerDevice": None if per_device is None else round(per_device),
                "mfu": record.get("mfu"),
                "peakMemoryGiB": None if record.get("peakMemoryGiB") is None else round(record["peakMemoryGiB"], 2),
                "eta": record["eta"], "updatedAt": record["time"],
                **{name: _significant(record.get(name)) for name in REWARD_LOGS.values()}}
    if "reward" in record:  # GRPO
        from finetune_trainer.training.grpo import status_fields

        progress.update(status_fields(record, _significant))
    return {k: v for k, v in progress.items() if v is not None}


def _device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _peak_memory_gib() -> float | None:
    """This process's peak accelerator memory (rank 0 reports; ranks of one job hold about the same)."""
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


class CheckpointMarkerCallback(TrainerCallback):
    """After each save: verify the checkpoint and mark it complete (rank 0), then tell the progress callback. With
    overlapped saves (checkpoint_writer.py) the writer marks it once written (`deferred`), through complete()."""

    def __init__(self, output_dir: Path, progress: ProgressCallback | None = None,
                 producer: dict[str, Any] | None = None, deferred: bool = False):
        self.output_dir = output_dir
        self.progress = progress
        self.producer = producer  # what made the checkpoint (checkpoints.provenance), recorded in its marker
        self.deferred = deferred
        self.save_started: float | None = None  # set by the trainer as a save begins: the stall is measured from it

    def on_save(self, args, state, control, **kwargs):
        if self.deferred or not state.is_world_process_zero:
            return
        directory = self.output_dir / f"checkpoint-{state.global_step}"
        if not directory.is_dir():
            return
        took = time.monotonic() - self.save_started if self.save_started is not None else None
        self.complete(state.global_step, directory, stall=took, save=took)

    def complete(self, step: int, directory: Path, stall: float | None, save: float | None) -> None:
        """Marks `directory` complete, its timings in the marker and in status.checkpoint. Raises IncompleteCheckpoint:
        a save that lost weights is fatal."""
        timings = {k: round(v, 4) for k, v in (("stallSeconds", stall), ("saveSeconds", save)) if v is not None}
        checkpoints.mark_complete(directory, self.producer, timings)
        if self.progress is None:
            return
        checkpoint = {"step": step, "path": str(directory), **timings}
        if self.deferred:  # the writer's thread, after the loop's own on_save: said now
            self.progress.report_from_thread({"checkpoint": checkpoint})
        else:
            self.progress.checkpoint = checkpoint  # the loop's on_save, next, reports it


class LearningRateOnResume(TrainerCallback):
    """A resumed run whose spec.training.learningRate changed: the checkpoint's scheduler and optimizer state would
    silently keep the old rate (the Trainer loads them over the new one). The new one is honoured, as the peak of
    the same schedule at the same step, and said (LearningRateChanged)."""

    def __init__(self, warn: Callable[[str, str], None]):
        self.warn = warn

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate wraps it
        base = getattr(scheduler, "base_lrs", None)
        if state.global_step == 0 or optimizer is None or not base or not base[0]:
            return
        old, new = float(base[0]), float(args.learning_rate)
        if math.isclose(old, new, rel_tol=1e-9):
            return
        ratio = new / old
        scheduler.base_lrs = [lr * ratio for lr in base]
        for group in optimizer.param_groups:
            group["lr"] *= ratio
            if "initial_lr" in group:
                group["initial_lr"] *= ratio
        if hasattr(scheduler, "_last_lr"):
            scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
        self.warn("LearningRateChanged",
                  f"resuming at step {state.global_step}, trained with learningRate {old:g}, with learningRate "
                  f"{new:g}: the {args.lr_scheduler_type} schedule goes on from step {state.global_step} with its "
                  f"peak at {new:g} instead of {old:g} (the learning rate is now "
                  f"{optimizer.param_groups[0]['lr']:.4g}); to continue unchanged set spec.training.learningRate: "
                  f"{old:g}")


class GracefulStop(TrainerCallback):
    """SIGTERM/SIGINT (pod deletion, preemption, Ctrl-C in `finetune run`): finish the current step, save a
    checkpoint, stop. main() then exits with INTERRUPTED, and the next run resumes from that checkpoint."""

    def __init__(self, saves_withheld: Callable[[], bool] = lambda: False):
        self.requested: int | None = None
        # The divergence guard withholds saves while the loss is in a spike: a stop then saves nothing, and the
        # next run resumes from the last checkpoint before it (a save here would rotate good ones out).
        self.saves_withheld = saves_withheld
        self.withheld = False

    def on_train_begin(self, args, state, control, **kwargs):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._request)
        if EARLY_STOPS and self.requested is None:  # a stop during loading that some library swallowed
            self.requested = EARLY_STOPS[0]

    def _request(self, signum, _frame):
        self.requested = signum

    def on_step_end(self, args, state, control, **kwargs):
        # A collective decision: the signal reaches the ranks of a gang at different moments, and a rank that
        # stops a step before the others leaves them waiting in a collective (or saving half a checkpoint). Every
        # rank stops at the first step end at which any rank was asked to.
        if self._anyone_asked(args):
            self.requested = self.requested or signal.SIGTERM
            self.withheld = self.saves_withheld()
            control.should_save = args.save_strategy != "no" and not self.withheld
            control.should_training_stop = True

    def _anyone_asked(self, args) -> bool:
        import torch
        import torch.distributed as dist

        asked = self.requested is not None
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return asked
        flag = torch.tensor([1 if asked else 0], dtype=torch.int32, device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
