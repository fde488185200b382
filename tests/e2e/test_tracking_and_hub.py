"""Experiment trackers and the Hub through `finetune run`, as a user runs it: MLflow's own client reads the file store
the run wrote, wandb writes an offline run, and huggingface_hub pushes to a stand-in for the Hub's API."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from finetune_operator.api import exit_codes
from tests.conftest import ROOT
from tests.support.hub_server import Repo, StandInHub
from tests.support.trainer_run import trainer_loads

TINY = str(ROOT / "examples" / "tiny-cpu-sft.yaml")
# What the runs must get from the spec, not from the test's own environment.
OWN_SETTINGS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MLFLOW_ALLOW_FILE_STORE")


def finetune_run(model: Path, workdir: Path, *sets: str, env: dict[str, str] | None = None,
                 steps: int = 4) -> tuple[int, str]:
    """`finetune run` of the tiny example for `steps` steps; `env` is laid over this shell's (less OWN_SETTINGS)."""
    argv = [sys.executable, "-m", "finetune_operator", "run", TINY, "--output", str(workdir),
            "--set", f"spec.model.name={model}", "--set", f"spec.training.maxSteps={steps}",
            "--set", "spec.checkpoints.saveSteps=2"]
    for item in sets:
        argv += ["--set", item]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**{k: v for k, v in os.environ.items() if k not in OWN_SETTINGS},
                               "OMP_NUM_THREADS": "1", **(env or {})})
    return proc.returncode, proc.stdout + proc.stderr


def test_mlflow_and_wandb_receive_the_run_and_a_resumed_job_continues_the_same_runs(tiny_model_dir, tmp_path,
                                                                                      monkeypatch):
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    tracking = yaml.safe_dump({"reportTo": ["mlflow", "wandb"], "project": "tiny-experiments",
                               "mlflow": {"trackingUri": store.as_uri()}, "wandb": {"offline": True}},
                              default_flow_style=True).strip()
    code, out = finetune_run(tiny_model_dir, tmp_path, f"spec.tracking={tracking}")
    assert code == 0, out
    output = tmp_path / "output"
    runs = json.loads((output / "tracking.json").read_text())
    assert f"mlflow:     run {runs['mlflow']}" in out and f"wandb:      run {runs['wandb']}" in out

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this reader's own opt-in to MLflow's file store
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.get_run(runs["mlflow"])
    assert client.get_experiment(run.info.experiment_id).name == "tiny-experiments"
    assert run.info.run_name == "tiny-cpu-sft" and run.data.tags["finetunejob.name"] == "tiny-cpu-sft"
    assert run.data.params["learning_rate"] == "0.005"  # TrainingArguments, logged once
    # transformers logs to MLflow asynchronously (synchronous=False): on a loaded machine a step's line can land after
    # the next one's, and the history comes back in the order written. Each step once is what counts.
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == [1, 2, 3, 4]
    # TensorBoard stays on beside them.
    assert list((output / "runs").rglob("events.out.tfevents.*"))

    # wandb's offline run lies beside the model, under the recorded id, holding the logged metric.
    (wandb_run,) = (output / "wandb").glob(f"offline-run-*-{runs['wandb']}")
    assert b"train/loss" in (wandb_run / f"run-{runs['wandb']}.wandb").read_bytes()

    # The same job resumed for more steps continues both runs instead of starting new ones.
    code, out = finetune_run(tiny_model_dir, tmp_path, f"spec.tracking={tracking}", steps=6)
    assert code == 0, out
    assert "resumed:    from" in out
    assert json.loads((output / "tracking.json").read_text()) == runs
    history = client.get_metric_history(runs["mlflow"], "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6]
    assert len(list((output / "wandb").glob(f"offline-run-*-{runs['wandb']}"))) == 2  # one per attempt, one id


def push_spec(hub: StandInHub, strategy: str = "end") -> str:
    return "spec.output.push=" + yaml.safe_dump({"repo": "acme/tiny-sft", "endpoint": hub.url, "strategy": strategy,
                                                  "tokenSecret": {"name": "hf-write"}},
                                                 default_flow_style=True).strip()


def test_push_sends_the_adapter_tokenizer_template_and_a_model_card_never_the_cache(tiny_model_dir, tmp_path):
    with StandInHub(token="hf_write_token") as hub:
        code, out = finetune_run(tiny_model_dir, tmp_path, push_spec(hub, "checkpoint"),
                                 env={"HF_TOKEN": "hf_write_token"})
    assert code == 0, out
    assert "pushed:     acme/tiny-sft" in out
    assert hub.repos["acme/tiny-sft"].private  # private unless asked otherwise
    files = hub.files("acme/tiny-sft")
    final = tmp_path / "output" / "final"
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert files[name] == (final / name).read_bytes(), name
    template = final / "chat_template.jinja"
    if template.exists():  # the chat template goes with the tokenizer when it has one
        assert files["chat_template.jinja"] == template.read_bytes()
    assert (tmp_path / "output" / ".cache").is_dir()  # the output directory has a cache ...
    assert not [p for p in files if ".cache" in p.split("/")]  # ... which never reaches the Hub
    # strategy checkpoint: each checkpoint went to last-checkpoint/ as it was saved, then the final model.
    summaries = [c["summary"] for c in hub.repos["acme/tiny-sft"].commits]
    assert summaries == ["tiny-cpu-sft: checkpoint, step 2", "tiny-cpu-sft: checkpoint, step 4",
                         "tiny-cpu-sft: final model, step 4"]
    assert "last-checkpoint/trainer_state.json" in files
    card = files["README.md"].decode()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["base_model"] == str(tiny_model_dir) and meta["library_name"] == "peft"
    assert "| steps | 4 |" in card and "final train loss" in card and "learningRate: 0.005" in card
    assert "AutoPeftModelForCausalLM.from_pretrained('acme/tiny-sft')" in card


def test_a_refused_token_fails_before_training_and_an_outage_keeps_the_model(tiny_model_dir, tmp_path):
    final = tmp_path / "output" / "final" / "adapter_model.safetensors"
    with StandInHub(token="hf_write_token") as hub:
        hub.refuse = True  # a token without write access: permanent, and said before any step is trained
        code, out = finetune_run(tiny_model_dir, tmp_path, push_spec(hub), env={"HF_TOKEN": "hf_write_token"})
        assert code == exit_codes.PUSH_REFUSED, out
        assert "PushRefused" in out and "403" in out and "nothing was trained yet" in out
        assert not (tmp_path / "output" / "progress.jsonl").exists() and not final.exists()

        hub.refuse, hub.unavailable = False, True  # the Hub is down: training goes on, the push fails, retryable
        code, out = finetune_run(tiny_model_dir, tmp_path, push_spec(hub), env={"HF_TOKEN": "hf_write_token"})
        assert code == exit_codes.PUSH_FAILED, out
        assert "PushFailed" in out and "the model is saved" in out and "run the same command again to resume" in out
        trained = final.read_bytes()

        hub.unavailable = False
        code, out = finetune_run(tiny_model_dir, tmp_path, push_spec(hub), env={"HF_TOKEN": "hf_write_token"})
    assert code == 0, out
    assert "Succeeded: 4 steps" in out and "checkpoint-4" in out  # resumed at the last step: no step redone
    assert hub.files("acme/tiny-sft")["adapter_model.safetensors"] == final.read_bytes() == trained


def test_a_read_only_token_is_refused_before_training_even_when_the_repository_exists(tiny_model_dir, tmp_path):
    """create_repo(exist_ok=True) accepts a read token for an existing repository; only the push would fail, after
    the run. The token's role (whoami) refuses it first."""
    with StandInHub(token="hf_read_token") as hub:
        hub.role = "read"
        hub.repos["acme/tiny-sft"] = Repo(private=True)  # made earlier with someone's write token
        code, out = finetune_run(tiny_model_dir, tmp_path, push_spec(hub), env={"HF_TOKEN": "hf_read_token"},
                                 steps=2)
        assert "POST /api/repos/create" in hub.requests and "GET /api/whoami-v2" in hub.requests
        assert not hub.repos["acme/tiny-sft"].commits
    assert code == exit_codes.PUSH_REFUSED, out
    assert "read-only (role read)" in out and "nothing was trained yet" in out
    assert not (tmp_path / "output" / "progress.jsonl").exists()  # no step was trained


@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_missing_or_wrong_token_fails_at_once(tiny_model_dir, tmp_path, token):
    with StandInHub(token="hf_write_token") as hub:
        code, out = finetune_run(tiny_model_dir, tmp_path, push_spec(hub), env={"HF_TOKEN": token} if token else {},
                                 steps=2)
    if token is None:
        assert "warning: HF_TOKEN comes from a Secret in a cluster" in out
    assert code == exit_codes.PUSH_REFUSED, out
    assert "401" in out and not (tmp_path / "output" / "progress.jsonl").exists()  # no step was trained


def pushing_config(tiny_model_dir, tmp_path, hub) -> Path:
    """The trainer config `finetune run` writes for the tiny example pushing to acme/tiny-sft on `hub`."""
    from finetune_operator.api.validation import validate_job
    from finetune_operator.cli.local_run import prepare

    doc = yaml.safe_load(Path(TINY).read_text())
    doc["spec"]["model"]["name"] = str(tiny_model_dir)
    doc["spec"]["output"] = {"push": {"repo": "acme/tiny-sft", "endpoint": hub.url,
                                      "tokenSecret": {"name": "hf-write"}}}
    return prepare(validate_job(doc), tmp_path)[0]


def test_a_refused_token_fails_before_torch_and_transformers_load(tiny_model_dir, tmp_path):
    """The trainer checks the token before its heavy imports (~5 s of CPU a process): a refused job ends in seconds."""
    with StandInHub(token="hf_write_token") as hub:
        config = pushing_config(tiny_model_dir, tmp_path, hub)
        code, loaded, out = trainer_loads(config, {"HF_TOKEN": "wrong", "HF_HUB_OFFLINE": "0"})
    assert code == exit_codes.PUSH_REFUSED and "401" in out, out
    assert loaded == [], out


def test_the_preflight_checks_the_hub_repository(tiny_model_dir, tmp_path):
    """runPolicy.preflight's pod (here as a process) refuses a token the Hub refuses, before any GPU is requested."""
    with StandInHub(token="hf_write_token") as hub:
        config = pushing_config(tiny_model_dir, tmp_path, hub)
        results = {}
        for token in ("wrong", "hf_write_token"):
            proc = subprocess.run([sys.executable, "-m", "finetune_trainer.preflight", "--config", str(config)],
                                  capture_output=True, text=True, timeout=300, cwd=ROOT,
                                  env={**os.environ, "HF_TOKEN": token, "HF_HUB_OFFLINE": "0"})
            results[token] = proc
        assert "acme/tiny-sft" in hub.repos  # created by the good token's check
    assert results["wrong"].returncode == exit_codes.PUSH_REFUSED, results["wrong"].stdout
    assert '"hubCheck": "ok"' in results["hf_write_token"].stdout and results["hf_write_token"].returncode == 0
