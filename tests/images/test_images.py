"""Our two images, as hack/build-images.sh builds them from the real Dockerfiles: what users depend on."""

import json

import pytest

from finetune_operator.api import constants as c
from tests.support.containers import built_images, podman


@pytest.fixture(scope="module")
def images():
    return built_images()


def inspect(image: str) -> dict:
    return json.loads(podman("image", "inspect", image).stdout)[0]


def run(image: str, *argv: str, entrypoint: str = "python", user: str | None = None, tmp: bool = False,
        cpus: float | None = None) -> str:
    """As a pod runs it: read-only root, no capabilities, the image's own user unless one is given; /tmp only where
    the pod mounts one (the trainer pods' emptyDir)."""
    flags = ["--rm", "--read-only", "--read-only-tmpfs=false", "--cap-drop", "all", "--network", "none",
             "--entrypoint", entrypoint, *(["--tmpfs", "/tmp:rw,mode=1777"] if tmp else [])]
    if user:
        flags += ["--user", user]
    if cpus:  # a pod's CPU limit: the container's CFS quota
        flags += ["--cpus", str(cpus)]
    # A hang's backstop, not a measure: importing the trainer's stack took over 300 s at load 26 (beside CPU hogs).
    return podman("run", *flags, image, *argv, timeout=1200).stdout


def test_sizes_and_users_are_what_the_pods_expect(images):
    operator_image, trainer_image = images
    added = {}
    for image, uid in ((operator_image, c.OPERATOR_UID), (trainer_image, c.TRAINER_UID)):
        config = inspect(image)["Config"]
        assert config["User"] == f"{uid}:{uid}", (image, config["User"])
        base = config["Labels"]["org.opencontainers.image.base.name"]
        added[image] = inspect(image)["Size"] - inspect(base)["Size"]
        print(f"{image}: {inspect(image)['Size'] / 1e6:.0f} MB, {added[image] / 1e6:.0f} MB on top of {base}")
    assert inspect(operator_image)["Config"]["Entrypoint"] == ["python", "-m", "finetune_operator.controller"]
    assert inspect(trainer_image)["Config"]["Entrypoint"] == ["python", "-m", "finetune_trainer.launch"]
    # The operator image carries the operator's dependencies only (the kubernetes client is most of it).
    assert added[operator_image] < 250e6


def test_operator_image_runs_the_cli_non_root_on_a_read_only_root(images, tmp_path):
    operator_image, _ = images
    out = run(operator_image, "-c", "import os, sys, finetune_operator.controller.handlers;"
              "import importlib.util as u; print(os.getuid(), sys.version_info[:2],"
              "[m for m in ('torch', 'transformers', 'numpy') if u.find_spec(m)])")
    assert out.split("(")[0].strip() == str(c.OPERATOR_UID) and "(3, 11)" in out and out.strip().endswith("[]"), out
    assert run(operator_image, "--version", entrypoint="finetune").startswith("finetune")


def test_trainer_image_imports_its_stack_and_has_deepspeeds_ops_prebuilt(images):
    _, trainer_image = images
    out = run(trainer_image, "-c", """
import os, sys, json, importlib.util
import torch, transformers, peft, accelerate, datasets, deepspeed, bitsandbytes, finetune_trainer.main
from deepspeed.git_version_info import installed_ops
print(json.dumps({"uid": os.getuid(), "python": list(sys.version_info[:2]), "torch": torch.__version__,
                  "ops": sorted(o for o, ok in installed_ops.items() if ok),
                  "flash_attn": importlib.util.find_spec("flash_attn") is not None}))
""", tmp=True)
    facts = json.loads(out.strip().splitlines()[-1])
    assert facts["uid"] == c.TRAINER_UID and facts["python"] == [3, 11], facts
    # The CPU variant: what DeepSpeed's CPU accelerator loads, compiled at build time, not in every pod.
    assert {"cpu_adam", "deepspeed_shm_comm"} <= set(facts["ops"]), facts
    assert facts["flash_attn"] is False  # so the trainer refuses flash_attention_2 (tests/unit: check_attention)


def test_each_training_process_of_a_limited_container_runs_the_threads_of_its_share(images):
    """In a container whose CPU limit is below the cores it may run on (a pod on a bigger node), the launcher reads
    the limit from the container's own cgroup, and torch in the process it starts runs that many threads, not one
    per core."""
    _, trainer_image = images
    out = run(trainer_image, "-c", """
import json, os, subprocess, sys
from finetune_trainer.cpu_threads import cpu_limit, thread_env, usable_cpus
def torch_threads(env):
    return int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                              capture_output=True, text=True, check=True).stdout)
facts = {"limit": cpu_limit(), "cores": len(os.sched_getaffinity(0))}
for processes in ("1", "2"):
    env = {**os.environ, "PET_NPROC_PER_NODE": processes}
    env.update(thread_env(env, cpu_limit(), usable_cpus()))
    facts[processes] = env["OMP_NUM_THREADS"]
facts["torch"] = torch_threads(env)  # once: torch's import under 1.5 CPUs takes a while
print(json.dumps(facts))
""", tmp=True, cpus=1.5)
    facts = json.loads(out.strip().splitlines()[-1])
    assert facts["limit"] == 1.5 and facts["1"] == facts["2"] == "1" and facts["torch"] == 1, facts


def test_trainer_image_runs_the_trackers_with_the_trainers_own_environment(images):
    """wandb runs its Go service binary and MLflow its file store inside the image, non-root on a read-only root,
    with the variables the trainer sets (finetune_trainer.outputs.tracking); /tmp stands in for the output volume."""
    _, trainer_image = images
    out = run(trainer_image, "-c", """
import json, os
from pathlib import Path
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.config import TrainerConfig
from finetune_trainer.outputs.tracking import tracker_environment
spec = FineTuneJobSpec.model_validate({"model": {"name": "/models/m"},
    "data": {"format": "alpaca", "train": [{"path": "/data/d"}]}, "distributed": {"gpusPerNode": 0},
    "tracking": {"reportTo": ["wandb", "mlflow"], "wandb": {"offline": True},
                 "mlflow": {"trackingUri": "file:///tmp/out/mlruns"}}})
os.environ.update(tracker_environment(TrainerConfig("job", "ns", spec, {}, Path("/tmp/out"), None), {}))
import mlflow, wandb
run = wandb.init()
run.log({"train/loss": 1.5})
run.finish()
mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
with mlflow.start_run() as active:
    mlflow.log_metric("loss", 1.5, step=1)
history = mlflow.tracking.MlflowClient().get_metric_history(active.info.run_id, "loss")
print(json.dumps({"wandb": [p.name for p in Path("/tmp/out/wandb").glob("offline-run-*")],
                  "runId": os.environ["WANDB_RUN_ID"], "mlflow": [(m.step, m.value) for m in history]}))
""", tmp=True)
    facts = json.loads(out.strip().splitlines()[-1])
    assert [name.endswith(facts["runId"]) for name in facts["wandb"]] == [True], facts
    assert facts["mlflow"] == [[1, 1.5]], facts
