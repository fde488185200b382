"""spec.tracking -> the environment transformers' tracker callbacks read, and one tracker run per job: an attempt
that resumes a checkpoint continues the run the first attempt started (ids kept in tracking.json beside it)."""

import contextlib
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
DEFAULT_WANDB_BASE_URL = "https://api.wandb.ai"
# wandb reads settings (base_url among them) from <WANDB_DIR>/wandb/settings; nothing of ours writes that file.
WANDB_WORKSPACE_SETTINGS = ("wandb", "settings")


def tracker_environment(cfg: TrainerConfig, recorded: dict[str, str]) -> dict[str, str]:
    """The variables for the trackers in spec.tracking.reportTo; `recorded` holds the run ids to continue."""
    t = cfg.spec.tracking
    project = t.project or cfg.namespace
    env: dict[str, str] = {}
    if "wandb" in t.report_to:
        # An offline run's files beside the model (`wandb sync` uploads them from there); an online run's in the
        # pod's own cache, as its settings (the config directory) are: wandb reads <WANDB_DIR>/wandb/settings,
        # and one planted on the output volume (which others may write) between our removal of it and wandb.init
        # would choose the team (entity) the run, with the lent key, is written into. The root filesystem is
        # read-only; the server is always named.
        wandb_home = str((cfg.pod_cache_dir or cfg.cache) / "wandb")
        w = t.wandb
        offline = w is not None and w.offline
        env.update(WANDB_PROJECT=project, WANDB_DIR=str(cfg.output_dir) if offline else wandb_home,
                   WANDB_CACHE_DIR=wandb_home,
                   WANDB_CONFIG_DIR=wandb_home, WANDB_DATA_DIR=wandb_home,
                   WANDB_RUN_ID=recorded.get("wandb") or uuid.uuid4().hex[:12], WANDB_RESUME="allow",
                   WANDB_USE_DOT_WANDB="false",  # not <output>/.wandb, which it would use if someone made one
                   WANDB_BASE_URL=(w.base_url if w is not None and w.base_url else None)
                   or os.environ.get("WANDB_BASE_URL") or DEFAULT_WANDB_BASE_URL)
        if offline:
            env["WANDB_MODE"] = "offline"
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
    # The run to continue is only ever the job's own recorded one: an MLFLOW_RUN_ID from the pod's environment (a
    # Secret variable of the job's) would send the metrics, with the credentials the runtime lends, into any run.
    os.environ.pop("MLFLOW_RUN_ID", None)
    os.environ.update(tracker_environment(cfg, recorded))
    if rank == 0 and recorded.get("mlflow") and not own_mlflow_run(cfg, recorded["mlflow"]):
        # tracking.json sits on the output volume: a run id planted there would send this job's metrics (with the
        # credentials it has) into someone else's run. MLflow's run ids are global, so it must be this job's.
        log.warning("the recorded MLflow run %s is not this job's (experiment %s, tags finetunejob.name/namespace); "
                    "a new run starts", recorded["mlflow"], os.environ.get("MLFLOW_EXPERIMENT_NAME"))
        for name in ("MLFLOW_RUN_ID", "MLFLOW_MAX_LOG_PARAMS"):
            os.environ.pop(name, None)
        recorded = {k: v for k, v in recorded.items() if k != "mlflow"}
    if "wandb" in cfg.spec.tracking.report_to:
        remove_workspace_settings(cfg.output_dir)
    runs = {**recorded, **({"wandb": os.environ["WANDB_RUN_ID"]} if "wandb" in cfg.spec.tracking.report_to else {})}
    if rank == 0:
        write_runs(cfg.output_dir, runs)
    return runs


def remove_workspace_settings(output_dir: Path) -> None:
    """wandb reads <WANDB_DIR>/wandb/settings, which nothing of ours writes: one found on the output volume was put
    there by someone else, to choose the server (or proxy) that receives the API key. A link (the file's, or the
    wandb directory's) is removed, never followed; every rank may try at once."""
    for directory in (WANDB_WORKSPACE_SETTINGS[0], f".{WANDB_WORKSPACE_SETTINGS[0]}"):
        wandb_dir = output_dir / directory
        for path in (wandb_dir, wandb_dir / WANDB_WORKSPACE_SETTINGS[1]):
            if path.is_symlink() or (path != wandb_dir and path.is_file()):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                log.warning("removed %s: wandb would have taken its settings (such as the server it sends the API "
                            "key to) from the output volume; set spec.tracking.wandb instead", path)
                if path == wandb_dir:
                    break


def own_mlflow_run(cfg: TrainerConfig, run_id: str) -> bool:
    """Whether `run_id` is a run this job started: in its experiment, tagged with its name and namespace (as
    tracker_environment tags them). A server that cannot say counts as no."""
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        run = client.get_run(run_id)
        experiment = client.get_experiment(run.info.experiment_id)
    except Exception as exc:  # any failure to confirm it: a new run, not someone else's
        log.warning("cannot read MLflow run %s: %s", run_id, exc)
        return False
    tags = run.data.tags
    return (experiment.name == os.environ.get("MLFLOW_EXPERIMENT_NAME")
            and tags.get("finetunejob.name") == cfg.job_name and tags.get("finetunejob.namespace") == cfg.namespace)


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
