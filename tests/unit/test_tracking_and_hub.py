"""The trainer's side of spec.tracking and spec.output.push that needs no run: the trackers' environment, the model
card, and which Hub failures are retried."""

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from finetune_operator.api.validation import validate_job
from finetune_trainer.config import TrainerConfig
from finetune_trainer.errors import PushFailed, PushRefused
from finetune_trainer.outputs import hub, hub_access, tracking
from tests.builders import make_job


def config(overrides: dict, tmp_path: Path) -> TrainerConfig:
    spec = validate_job(make_job(overrides)).spec
    return TrainerConfig(job_name="llama-sft", namespace="team-a", spec=spec, training_arguments={},
                         output_dir=tmp_path, resume_from=None)


TRACKED = {"spec.tracking": {"reportTo": ["wandb", "mlflow"], "mlflow": {"trackingUri": "http://mlflow:5000"},
                             "wandb": {"entity": "acme"}},
           "spec.pod.secretEnv": [{"name": "WANDB_API_KEY", "secretName": "wandb", "key": "key"}]}


def test_a_fresh_run_gets_new_tracker_runs_in_the_namespace_project(tmp_path):
    pod = dataclasses.replace(config(TRACKED, tmp_path / "output"), pod_cache_dir=tmp_path / "cache")  # as in a pod
    env = tracking.tracker_environment(pod, recorded={})
    assert env["WANDB_PROJECT"] == env["MLFLOW_EXPERIMENT_NAME"] == "team-a"
    assert env["WANDB_ENTITY"] == "acme" and env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    # Online: the run's files (and the settings wandb reads there) in the pod's own cache, never on the output volume.
    assert env["WANDB_DIR"] == env["WANDB_CONFIG_DIR"] == str(tmp_path / "cache" / "wandb")
    assert env["WANDB_RESUME"] == "allow" and len(env["WANDB_RUN_ID"]) == 12
    assert "MLFLOW_RUN_ID" not in env and "MLFLOW_ALLOW_FILE_STORE" not in env and "WANDB_MODE" not in env
    assert yaml.safe_load(env["MLFLOW_TAGS"]) == {"finetunejob.name": "llama-sft", "finetunejob.namespace": "team-a"}


def test_an_offline_run_is_written_beside_the_model(tmp_path):
    offline = {**TRACKED, "spec.tracking": {**TRACKED["spec.tracking"], "wandb": {"offline": True}}}
    env = tracking.tracker_environment(config(offline, tmp_path), recorded={})
    assert env["WANDB_DIR"] == str(tmp_path) and env["WANDB_MODE"] == "offline"


def test_a_resumed_run_continues_the_recorded_runs_and_keeps_its_parameters(tmp_path):
    env = tracking.tracker_environment(config(TRACKED, tmp_path), recorded={"wandb": "abc", "mlflow": "f00"})
    assert env["WANDB_RUN_ID"] == "abc" and env["MLFLOW_RUN_ID"] == "f00" and env["MLFLOW_MAX_LOG_PARAMS"] == "0"


def test_only_a_resumed_attempt_reads_the_recorded_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "environ", {})  # configure() sets the trackers' variables: not in this process's
    cfg = config(TRACKED, tmp_path)
    tracking.write_runs(tmp_path, {"wandb": "old", "mlflow": "old"})  # a deleted job of the same name left them
    fresh = tracking.configure(cfg, resuming=False, rank=0)
    assert fresh["wandb"] != "old" and "mlflow" not in fresh and tracking.read_runs(tmp_path) == fresh
    resumed = tracking.configure(cfg, resuming=True, rank=0)
    assert resumed == fresh


@pytest.mark.parametrize("resuming", [False, True])
def test_an_mlflow_run_id_from_the_pods_environment_is_never_continued(tmp_path, monkeypatch, resuming):
    """A Secret variable of the job's (MLFLOW_RUN_ID=<another team's run>) would log into that run, whatever the
    experiment, with the credentials the runtime lends: only the job's own recorded run is continued."""
    monkeypatch.setattr(os, "environ", {"MLFLOW_RUN_ID": "another-teams-run"})
    tracking.configure(config(TRACKED, tmp_path), resuming=resuming, rank=1)  # rank 1: MLflow is not asked
    assert "MLFLOW_RUN_ID" not in os.environ


def test_no_trackers_no_environment(tmp_path):
    assert tracking.configure(config({}, tmp_path), resuming=True, rank=0) == {}
    assert not (tmp_path / tracking.RUNS_FILE).exists()


PUSH = {"spec.output.push": {"repo": "acme/llama-sft", "tokenSecret": {"name": "hf"}},
        "spec.data.train": [{"hub": {"name": "tatsu-lab/alpaca"}}]}


def test_the_model_card_has_hub_metadata_settings_metrics_and_the_spec(tmp_path):
    card = hub.model_card(config(PUSH, tmp_path), {"steps": 100, "finalLoss": 1.23456, "evalLoss": None})
    _, front, body = card.split("---", 2)
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "peft" and meta["datasets"] == ["tatsu-lab/alpaca"]
    assert meta["pipeline_tag"] == "text-generation" and "finetunejob" in meta["tags"]
    assert "| final train loss | 1.235 |" in body and "eval loss" not in body.split("## Configuration")[0]
    assert "FineTuneJob `team-a/llama-sft`" in body
    config_block = body.split("```yaml")[1].split("```")[0]
    assert set(yaml.safe_load(config_block)) == {"model", "data", "method", "training", "evaluation"}  # no pod


class HubError(Exception):
    def __init__(self, status: int):
        super().__init__(f"{status} Client Error")
        self.response = type("Response", (), {"status_code": status})()


@pytest.mark.parametrize(("status", "error", "calls"), [
    (403, PushRefused, 1), (401, PushRefused, 1), (503, PushFailed, hub_access.TRIES),
    (429, PushFailed, hub_access.TRIES), (None, PushFailed, hub_access.TRIES)])
def test_refusals_fail_at_once_and_outages_are_retried(monkeypatch, status, error, calls):
    monkeypatch.setattr(hub_access, "RETRY_SECONDS", 0)
    attempts = []

    def push() -> str:
        attempts.append(1)
        raise HubError(status) if status else ConnectionError("connection refused")

    with pytest.raises(error, match="the model is saved"):
        hub_access.with_retries(push, "pushing final/")
    assert len(attempts) == calls


def test_an_outage_that_ends_is_retried_to_success(monkeypatch):
    monkeypatch.setattr(hub_access, "RETRY_SECONDS", 0)
    outcomes = iter([HubError(502), "http://hub/commit/1"])

    def push() -> str:
        result = next(outcomes)
        if isinstance(result, Exception):
            raise result
        return result

    assert hub_access.with_retries(push, "pushing") == "http://hub/commit/1"


def test_the_token_role_is_read_from_whoami_and_unknown_when_it_cannot_be():
    """A Hub-compatible server without whoami, or a network error, leaves the role unknown: never a refusal."""
    from finetune_trainer.outputs.hub_access import token_role

    class Api:
        def __init__(self, answer):
            self.answer = answer

        def whoami(self):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    assert token_role(Api({"auth": {"accessToken": {"role": "read"}}})) == "read"
    assert token_role(Api({"auth": {"accessToken": {"role": "fineGrained"}}})) == "fineGrained"
    assert token_role(Api({"name": "acme", "auth": {"type": "oauth"}})) is None
    assert token_role(Api(OSError("connection refused"))) is None


WANDB_RUN = r"""
import json, sys
from pathlib import Path
from finetune_trainer.config import load_config
from finetune_trainer.outputs import tracking
tracking.configure(load_config(sys.argv[1]), resuming=False, rank=0)
removed = not (Path.cwd() / "wandb" / "settings").exists()
# Planted again after the removal, before wandb starts: the environment must still win.
(Path.cwd() / "wandb" / "settings").write_text("[default]\nbase_url = http://127.0.0.1:9/planted\n")
import wandb
run = wandb.init()
print(json.dumps({"removed": removed, "base_url": run.settings.base_url}))
run.finish()
"""


def test_wandb_never_takes_its_server_from_a_settings_file_on_the_output_volume(tmp_path):
    """Real wandb (offline): a settings file anyone who can write the output volume planted would have sent the
    lent API key to its base_url. The file is removed and the server is named in the environment, which wins over
    any settings file (one planted again after the removal, too)."""
    import json
    import subprocess
    import sys

    from finetune_operator.render import RenderContext
    from finetune_operator.render.configmap import config_files

    output = tmp_path / "output"
    (output / "wandb").mkdir(parents=True)
    (output / "wandb" / "settings").write_text("[default]\nbase_url = http://127.0.0.1:9/planted\n")
    job = validate_job(make_job({"spec.tracking": {"reportTo": ["wandb"], "wandb": {"offline": True}}}))
    config = tmp_path / "trainer.json"
    config.write_text(config_files(job.spec, RenderContext(name=job.name, namespace="d", output_dir=str(output),
                                                           cache_dir=str(tmp_path / "cache")))["trainer.json"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    # One real wandb process (its start is seconds of CPU): the planted file is removed, then planted again.
    done = subprocess.run([sys.executable, "-c", WANDB_RUN, str(config)], cwd=output, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"removed": True, "base_url": tracking.DEFAULT_WANDB_BASE_URL}


@pytest.mark.parametrize("planted", ["file", "link", "the wandb directory, linked", "a directory", "nothing",
                                     "the .wandb directory"])
def test_a_planted_wandb_settings_file_is_removed_and_no_link_is_followed(tmp_path, planted):
    output, elsewhere = tmp_path / "output", tmp_path / "elsewhere"
    output.mkdir()
    elsewhere.mkdir()
    victim = elsewhere / "settings"
    victim.write_text("[default]\nbase_url = http://127.0.0.1:9/planted\n")
    if planted == "the wandb directory, linked":
        (output / "wandb").symlink_to(elsewhere, target_is_directory=True)
    else:
        (output / "wandb").mkdir()
    if planted == "file":
        (output / "wandb" / "settings").write_text(victim.read_text())
    elif planted == "link":
        (output / "wandb" / "settings").symlink_to(victim)
    elif planted == "a directory":  # configparser skips what it cannot open: harmless, and left alone
        (output / "wandb" / "settings").mkdir()
    elif planted == "the .wandb directory":  # wandb reads .wandb/settings instead once .wandb exists
        (output / ".wandb").mkdir()
        (output / ".wandb" / "settings").write_text(victim.read_text())
    for _ in range(2):  # every rank tries: the second finds nothing to remove
        tracking.remove_workspace_settings(output)
    assert not (output / "wandb").is_symlink() and not (output / "wandb" / "settings").is_symlink()
    assert (output / "wandb" / "settings").is_dir() is (planted == "a directory")
    assert not (output / "wandb" / "settings").is_file() and victim.is_file()
    assert not (output / ".wandb" / "settings").exists()


@pytest.mark.parametrize("recorded", ["this job's run", "another experiment's run", "another job's run in its project",
                                      "no such run"])
def test_a_resumed_attempt_continues_only_an_mlflow_run_of_its_own(tmp_path, monkeypatch, recorded):
    """tracking.json is on the output volume: a run id planted there would have sent this job's metrics into any
    run the job's MLflow credentials reach. Real MLflow, with a file store."""
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.setattr(os, "environ", dict(os.environ))
    store = f"file://{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    cfg = config({"spec.tracking": {"reportTo": ["mlflow"], "mlflow": {"trackingUri": store}}}, tmp_path / "out")
    cfg.output_dir.mkdir()
    client = MlflowClient(tracking_uri=store)
    experiment = {"this job's run": "team-a", "another experiment's run": "finance",
                  "another job's run in its project": "team-a"}.get(recorded)
    run_id = "0" * 32
    if experiment is not None:
        mlflow.set_tracking_uri(store)
        ids = {e.name: e.experiment_id for e in client.search_experiments()}
        exp_id = ids.get(experiment) or client.create_experiment(experiment)
        owner = "other-job" if recorded == "another job's run in its project" else "llama-sft"
        run_id = client.create_run(exp_id, tags={"finetunejob.name": owner,
                                                 "finetunejob.namespace": "team-a"}).info.run_id
    tracking.write_runs(cfg.output_dir, {"mlflow": run_id})
    runs = tracking.configure(cfg, resuming=True, rank=0)
    ours = recorded == "this job's run"
    assert (runs.get("mlflow") == run_id) is ours and (os.environ.get("MLFLOW_RUN_ID") == run_id) is ours
    assert (tracking.read_runs(cfg.output_dir).get("mlflow") == run_id) is ours
