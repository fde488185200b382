"""Trainer callbacks: progress records (JSONL + FineTuneJob status), checkpoint completion markers, divergence."""

import json
import math
import signal
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from finetune_operator.api import constants as c
from finetune_trainer.errors import EARLY_STOPS
from finetune_trainer.outputs import checkpoints
from finetune_trainer.outputs.status_report import StatusReporter
from finetune_trainer.training import throughput

# The divergence guard's smoothing: a spike starts when the losses logged over this many optimizer steps average
# above the threshold (DivergenceWatch), so one hard batch in a mix of easy and hard rows never opens one.
LEVEL_WINDOW_STEPS = 10


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
        self.upload: dict[str, Any] | None = None  # output.uri: how far checkpoint uploads are behind
        self.last_record: dict[str, Any] = {}

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
        eta = per_step * (state.max_steps - state.global_step) if per_step is not None else None
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
        self.last_record = record
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self._report(record)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.checkpoint is not None:
            self._report(self.last_record, force=True)

    def attempt_totals(self, state, runtime_seconds: float | None) -> dict[str, Any]:
        """Steps and tokens of this process's training alone: a resumed attempt's rate must not count the tokens
        of the attempts before it (a run resumed at its last step trained nothing)."""
        steps, tokens = state.global_step - self.start_step, state.num_input_tokens_seen - self.start_tokens
        rate = tokens / runtime_seconds if steps > 0 and tokens > 0 and runtime_seconds else None
        return {"attemptSteps": steps, "attemptTokens": tokens, "tokensPerSecond": rate}

    def _report(self, record: dict[str, Any], force: bool = False) -> None:
        if self.reporter is None:
            return
        # phase Training replaces the Preparing heartbeat, and the merge patch's null drops its message.
        status: dict[str, Any] = {"progress": {**status_progress(record), "message": None}}
        if self.checkpoint is not None:
            status["checkpoint"] = self.checkpoint
        self.reporter.report(status, force=force)


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
    return {k: v for k, v in progress.items() if v is not None}


def _device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _peak_memory_gib() -> float | None:
    """This process's peak accelerator memory (rank 0 reports; ranks of one job hold about the same)."""
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


class CheckpointMarkerCallback(TrainerCallback):
    """After each save: verify the checkpoint and mark it complete (rank 0), then tell the progress callback."""

    def __init__(self, output_dir: Path, progress: ProgressCallback | None = None,
                 producer: dict[str, Any] | None = None):
        self.output_dir = output_dir
        self.progress = progress
        self.producer = producer  # what made the checkpoint (checkpoints.provenance), recorded in its marker

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        directory = self.output_dir / f"checkpoint-{state.global_step}"
        if not directory.is_dir():
            return
        # Raises IncompleteCheckpoint: a save that lost weights is fatal.
        checkpoints.mark_complete(directory, self.producer)
        if self.progress is not None:
            self.progress.checkpoint = {"step": state.global_step, "path": str(directory)}


class DivergenceWatch(TrainerCallback):
    """Stops a run that diverged; main() then exits with DIVERGED (79, permanent: a retry diverges again).

    A NaN or infinite loss or gradient norm stops it at once. Otherwise the loss is compared with the run's early
    loss (`baseline`): the mean of the losses logged in the first warmupSteps optimizer steps, never above the loss
    of a uniform guess over the vocabulary (ln V), which stands in for it until the warm-up is over. A mean, because
    a mix of rows the model knows (loss ~0) and new ones (~ln V) is bimodal: a median lands in either mode, a mean is
    what later windows of the same mix average to; one easy first batch moves it by 1/N. A run that blows up inside
    the warm-up is measured against ln V.

    A spike starts when the mean of the losses logged over the last LEVEL_WINDOW_STEPS steps is above the threshold
    (a single hard batch is not one) and lasts while the logged losses stay above it. No checkpoint is saved while it
    lasts, so the checkpoints before it are never rotated out by diverged ones; a spike lasting `patience` optimizer
    steps (over at least two logged losses) is divergence (stop, or a warning with action: warn); one that comes back
    sooner, after at least a quarter of the patience and two logged losses, is a warning (a shorter one is a hard
    stretch of batches, not news), and the save that was due during it is made at the step the loss is back.
    Warnings go to `warn` (reason, message): the log and a Warning Event on the FineTuneJob. With action: off nothing
    is said or held back, but spikes are still tracked so that a NaN names the last good checkpoint."""

    def __init__(self, policy: Any, warn: Callable[[str, str], None] | None = None, vocab_size: int | None = None):
        self.policy = policy
        self.warn = warn or (lambda reason, message: None)
        self.chance = math.log(vocab_size) if vocab_size and vocab_size > 1 else None
        self.diverged_at: int | None = None
        self.value: float | None = None
        self.message: str | None = None
        self.early: list[float] = []  # losses logged in the warm-up window
        self.recent: deque[tuple[int, float]] = deque()  # (step, loss) logged in the last LEVEL_WINDOW_STEPS
        self.early_done = False
        self.spike: list[tuple[int, float]] = []
        self.last_good_step = 0  # the last logged step whose loss was under the threshold
        self.warned_persistent = False
        self.save_owed = False  # a save that fell inside a spike, made once the loss is back

    @property
    def acting(self) -> bool:
        return self.policy.action != "off"

    @property
    def baseline(self) -> float | None:
        """The early loss the threshold is relative to; None while neither it nor the vocabulary is known."""
        if not self.early_done:
            return self.chance
        mean = statistics.fmean(self.early)
        return mean if self.chance is None else min(mean, self.chance)

    @property
    def threshold(self) -> float | None:
        early = self.baseline
        return None if early is None else max(self.policy.factor * early, early + self.policy.min_increase)

    def _observe_early(self, step: int, loss: float) -> None:
        if self.early_done or not math.isfinite(loss):
            return
        self.early.append(loss)
        self.early_done = step >= self.policy.warmup_steps and len(self.early) >= 3

    def on_train_begin(self, args, state, control, **kwargs):
        # A resumed run keeps the early loss of the run it continues (the history is in the checkpoint).
        for entry in state.log_history:
            if isinstance(entry.get("loss"), (int, float)) and "train_loss" not in entry:
                self._observe_early(int(entry.get("step", 0)), float(entry["loss"]))
        self.last_good_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if self.spike and self.acting and control.should_save:
            control.should_save = False
            self.save_owed = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        for key in ("loss", "grad_norm"):
            value = logs.get(key)
            if isinstance(value, float) and not math.isfinite(value):
                self._stop(state, control, value, f"the {'loss' if key == 'loss' else 'gradient norm'} became "
                                                  f"{value} at step {state.global_step}")
                return
        loss = logs.get("loss")
        if not isinstance(loss, (int, float)) or "train_loss" in logs:
            return
        step, loss = state.global_step, float(loss)
        self._observe_early(step, loss)
        self.recent.append((step, loss))
        while self.recent[0][0] <= step - LEVEL_WINDOW_STEPS:
            self.recent.popleft()
        level = statistics.fmean(value for _, value in self.recent)
        threshold = self.threshold
        if threshold is None or loss <= threshold or (not self.spike and level <= threshold):
            if self.spike:
                self._spike_over(state, control, loss)
            self.last_good_step = step
            return
        self.spike.append((step, loss))
        if not self.acting:
            return
        control.should_save = False
        if len(self.spike) < 2 or step - self.last_good_step < self.policy.patience:
            return
        text = self._describe(step)
        if self.policy.action == "stop":
            self._stop(state, control, loss, text)
        elif not self.warned_persistent:
            self.warned_persistent = True
            self.warn("LossDiverging", text + " (runPolicy.divergence.action: warn, training goes on)")

    def _early_text(self) -> str:
        chance = f"ln(vocabulary size) = {self.chance:.4g}, the loss of a uniform guess"
        if not self.early_done:
            return chance + ", until the first warmupSteps are logged"
        mean = statistics.fmean(self.early)
        text = f"the mean of the {len(self.early)} losses logged in the first steps, {mean:.4g}"
        return text if self.chance is None or mean <= self.chance else f"{chance} (below {text})"

    def _describe(self, step: int) -> str:
        peak = max(value for _, value in self.spike)
        return (f"the loss diverged: every loss logged from step {self.spike[0][0]} to {step} "
                f"({step - self.last_good_step} optimizer steps, {len(self.spike)} logs) is above "
                f"{self.threshold:.4g} = max({self.policy.factor:g} x early, early + {self.policy.min_increase:g}), "
                f"early being {self._early_text()}; up to {peak:.4g}, now {self.spike[-1][1]:.4g}")

    def _spike_over(self, state, control, loss: float) -> None:
        steps = [s for s, _ in self.spike]
        peak = max(value for _, value in self.spike)
        lasted = steps[-1] - self.last_good_step
        if (self.acting and not self.warned_persistent and len(steps) >= 2
                and lasted >= max(2, self.policy.patience // 4)):
            self.warn("LossSpike", f"the loss spiked to {peak:.4g} at step {steps[0]}"
                      f"{'' if len(steps) == 1 else f'-{steps[-1]}'} (above {self.threshold:.4g}, {lasted} "
                      f"optimizer step(s); {self.policy.patience} stop the run) and came back to {loss:.4g} at step "
                      f"{state.global_step}; no checkpoint was saved during the spike")
        if self.save_owed and self.acting:
            control.should_save = True  # the Trainer saves after on_log: these weights are past the spike
        self.spike.clear()
        self.warned_persistent = self.save_owed = False

    def _stop(self, state, control, value: float, text: str) -> None:
        self.diverged_at, self.value, self.message = state.global_step, value, text
        control.should_training_stop = True
        control.should_save = False  # never checkpoint diverged weights over good ones


class GracefulStop(TrainerCallback):
    """SIGTERM/SIGINT (pod deletion, preemption, Ctrl-C in `finetune run`): finish the current step, save a
    checkpoint, stop. main() then exits with INTERRUPTED, and the next run resumes from that checkpoint."""

    def __init__(self):
        self.requested: int | None = None

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
            control.should_save = args.save_strategy != "no"
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
