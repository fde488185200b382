"""spec.tracking -> the environment transformers' tracker callbacks read, and one tracker run per job: an attempt
that resumes a checkpoint continues the run the first attempt started (ids kept in tracking.json beside it)."""

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from finetune_trainer.config import TrainerConfig

log = logging.getLogger(__name__)
RUNS_FILE = "tracking.json"


def tracker_environment(cfg: TrainerConfig, recorded: dict[str, str]) -> dict[str, str]:
    """The variables for the trackers in spec.tracking.reportTo; `recorded` holds the run ids to continue."""
    t = cfg.spec.tracking
    project = t.project or cfg.namespace
    env: dict[str, str] = {}
    if "wandb" in t.report_to:
        # Run files beside the model (offline runs are synced from there); the root filesystem is read-only.
        wandb_home = str(cfg.output_dir / ".cache" / "wandb")
        env.update(WANDB_PROJECT=project, WANDB_DIR=str(cfg.output_dir), WANDB_CACHE_DIR=wandb_home,
                   WANDB_CONFIG_DIR=wandb_home, WANDB_DATA_DIR=wandb_home,
                   WANDB_RUN_ID=recorded.get("wandb") or uuid.uuid4().hex[:12], WANDB_RESUME="allow")
        w = t.wandb
        if w is not None and w.offline:
            env["WANDB_MODE"] = "offline"
        if w is not None and w.base_url:
            env["WANDB_BASE_URL"] = w.base_url
        if w is not None and w.entity:
            env["WANDB_ENTITY"] = w.entity
    if "mlflow" in t.report_to:
        env.update(MLFLOW_EXPERIMENT_NAME=project, MLFLOW_TAGS=json.dumps(
            {"finetunejob.name": cfg.job_name, "finetunejob.namespace": cfg.namespace}))
        if t.mlflow is not None:
            env["MLFLOW_TRACKING_URI"] = t.mlflow.tracking_uri
            if t.mlflow.tracking_uri.startswith("file:"):
                # MLflow keeps its file store only behind this switch; the user asked for one by its URI.
                env["MLFLOW_ALLOW_FILE_STORE"] = "true"
        if recorded.get("mlflow"):
            env["MLFLOW_RUN_ID"] = recorded["mlflow"]
            # MLflow refuses to change a logged parameter, and a resumed attempt may run with other arguments
            # (e.g. more maxSteps): the run keeps its first attempt's parameters.
            env["MLFLOW_MAX_LOG_PARAMS"] = "0"
    if "comet_ml" in t.report_to:
        env["COMET_PROJECT_NAME"] = project
    return env


def configure(cfg: TrainerConfig, resuming: bool, rank: int) -> dict[str, str]:
    """Sets the trackers' environment before training starts; returns the run ids known so far. A fresh start
    (no checkpoint resumed) is a new run even when an older job of the same name left its ids."""
    if not cfg.spec.tracking.report_to:
        return {}
    recorded = read_runs(cfg.output_dir) if resuming else {}
    os.environ.update(tracker_environment(cfg, recorded))
    runs = {**recorded, **({"wandb": os.environ["WANDB_RUN_ID"]} if "wandb" in cfg.spec.tracking.report_to else {})}
    if rank == 0:
        write_runs(cfg.output_dir, runs)
    return runs


def read_runs(output_dir: Path) -> dict[str, str]:
    try:
        return dict(json.loads((output_dir / RUNS_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def write_runs(output_dir: Path, runs: dict[str, str]) -> None:
    tmp = output_dir / f".{RUNS_FILE}.tmp"
    tmp.write_text(json.dumps(runs, indent=1))
    tmp.replace(output_dir / RUNS_FILE)


class TrackerRunRecorder(TrainerCallback):
    """Records the MLflow run id once MLflowCallback started the run (its on_train_begin runs before ours), so the
    next attempt continues it."""

    def __init__(self, output_dir: Path, runs: dict[str, str]):
        self.output_dir, self.runs = output_dir, runs

    def on_train_begin(self, args, state, control, **kwargs: Any) -> None:
        if not state.is_world_process_zero or "mlflow" not in args.report_to:
            return
        import mlflow

        active = mlflow.active_run()
        if active is not None and self.runs.get("mlflow") != active.info.run_id:
            self.runs["mlflow"] = active.info.run_id
            write_runs(self.output_dir, self.runs)
            log.info("MLflow run %s (experiment %s)", active.info.run_id, os.environ.get("MLFLOW_EXPERIMENT_NAME"))
