"""The callback that reports a worker group (workers.py): every rank's share gathered when training begins, rank 0's
report after the group's first optimizer step."""

import json
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from finetune_operator.api import constants as c
from finetune_trainer.training.workers import REACHED, TRAINED, WORKERS_FILE, describe, iso, last_progress


class WorkerGroupReport(TrainerCallback):
    """Gathers every rank's share at the start of training; after the first step, rank 0 reports the group."""

    def __init__(self, output_dir: Path, reporter: Any, predecessor: dict[str, Any] | None, attempt: int | None,
                 marks: dict[str, float]):
        self.output_dir, self.reporter, self.attempt = output_dir, reporter, attempt
        self.share = {"predecessor": predecessor,
                      "restartCount": int(os.environ.get(c.ENV_TORCHELASTIC_RESTART_COUNT, "0") or 0)}
        self.marks = marks  # wall-clock times: modelLoaded (set by main), checkpointLoaded, firstStep
        self.shares: list[dict[str, Any]] = [self.share]
        self.resumed_step = 0
        self.reported = False

    def on_train_begin(self, args, state, control, **kwargs):
        import torch.distributed as dist

        self.marks["checkpointLoaded"] = time.time()
        self.resumed_step = state.global_step
        REACHED["step"] = state.global_step
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, self.share)
            self.shares = gathered

    def on_step_end(self, args, state, control, **kwargs):
        REACHED["step"] = state.global_step
        TRAINED["yes"] = True
        if self.reported:
            return
        self.reported = True
        self.marks["firstStep"] = time.time()
        if state.is_world_process_zero:
            self._report(args)

    def _report(self, args) -> None:
        world = args.world_size
        # torchrun sets both; a process started without it (a debugger, `python -m finetune_trainer`) is its own group.
        per_node = int(os.environ.get(c.ENV_LOCAL_WORLD_SIZE) or 1)
        nodes = int(os.environ.get(c.ENV_GROUP_WORLD_SIZE) or max(1, world // max(1, per_node)))
        record: dict[str, Any] = {
            "attempt": self.attempt, "generation": iso(self.marks["started"]), "nodes": nodes, "worldSize": world,
            "gradientAccumulationSteps": args.gradient_accumulation_steps,
            "globalBatchSize": args.per_device_train_batch_size * args.gradient_accumulation_steps * world,
            "restartCount": self.share["restartCount"], "resumedStep": self.resumed_step,
            # When each phase of this group's start ended, on the wall clock (a benchmark lines them up with a kill).
            "at": {name: iso(self.marks[key]) for name, key in (
                ("workersStarted", "started"), ("modelLoaded", "modelLoaded"), ("checkpointLoaded", "checkpointLoaded"),
                ("firstStep", "firstStep")) if key in self.marks}}
        before = describe(self.shares)
        if before is not None:
            progress = last_progress(self.output_dir)
            reached = max(before["reached"], progress[0] if progress else 0)
            failed_at = before["failedAt"] or (progress[1] if progress else None)
            record.update(cause=before["cause"], lostSteps=max(0, reached - self.resumed_step))
            if failed_at is not None:
                record["failedAt"] = iso(failed_at)
                record["recoverySeconds"] = round(self.marks["firstStep"] - failed_at, 3)
                record["timeline"] = {name: round(self.marks[key] - failed_at, 3) for name, key in (
                    ("workersStarted", "started"), ("modelLoaded", "modelLoaded"),
                    ("checkpointLoaded", "checkpointLoaded"), ("firstStep", "firstStep")) if key in self.marks}
        with (self.output_dir / WORKERS_FILE).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.reporter is not None:
            self.reporter.report({"workers": record}, force=True)
