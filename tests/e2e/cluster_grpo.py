"""A GRPO FineTuneJob through the whole user flow on two nodes: helm install -> operator -> kubectl apply (the job,
and a ConfigMap holding the user's reward function, which the trainer pods mount and import) -> one node killed
mid-run -> the operator restarts the gang, which resumes the newest complete checkpoint exactly: every step the
killed gang had trained past it comes out the same again (the same completions sampled, the same rewards, KL and
loss), and none is skipped.

Collected by test_cluster_grpo_containers.py (our images as podman containers) and test_cluster_grpo_processes.py
(trainer pods as local processes: the twin, run with --twins); each module defines the `runtime` fixture."""

import json
import shutil

import yaml

from tests.conftest import ROOT
from tests.e2e.cluster_training import pod_runner, shared_volume, volume_progress_records, wait_status
from tests.support.controlplane import free_port
from tests.support.polling import wait_for_run

JOB = "tiny-cpu-grpo"
STEPS, SAVE_STEPS = 40, 10
REWARD_MODULE = '''"""The team's reward: the share of lowercase letters and spaces in a completion."""


def letters(prompts, completions, answer, **kwargs):
    out = []
    for completion, _ in zip(completions, answer):
        text = completion if isinstance(completion, str) else "".join(m["content"] for m in completion)
        out.append(sum(ch.islower() or ch == " " for ch in text) / len(text) if text else 0.0)
    return out
'''


def grpo_two_node_job(model_dir, workdir):
    """The tiny GRPO example on 2 nodes (LoRA, DDP), a built-in reward and the ConfigMap's function, the model and
    the output on the shared claim."""
    shutil.copytree(model_dir, workdir / "pvc" / "shared" / JOB / "models" / "tiny")
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-grpo.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["name"] = "/output/models/tiny"
    spec["method"]["grpo"]["rewards"] = [
        {"type": "regex", "pattern": "e", "weight": 0.5},
        {"type": "function", "function": "team_rewards:letters", "configMap": "grpo-rewards"}]
    spec["distributed"] = {"numNodes": 2, "gpusPerNode": 0, "rendezvousPort": free_port()}
    spec["training"].update(maxSteps=STEPS, perDeviceTrainBatchSize=4)  # 8 completions a step: 2 prompts x 4
    spec["checkpoints"] = {"saveSteps": SAVE_STEPS, "keep": 3}
    spec["output"] = {"claimName": "shared"}
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_killed_grpo_gang_restarts_and_resumes_exactly(runtime, chart_operator, kubectl, control_plane,
                                                         namespace, tiny_model_dir, tmp_path):
    shared_volume(kubectl, namespace, tmp_path / "pvc" / "shared")
    (tmp_path / "team_rewards.py").write_text(REWARD_MODULE)
    kubectl.run("create", "configmap", "grpo-rewards", "-n", namespace,
                f"--from-file=team_rewards.py={tmp_path / 'team_rewards.py'}")
    job = grpo_two_node_job(tiny_model_dir, tmp_path)
    with pod_runner(runtime, kubectl, control_plane, namespace, tmp_path) as runner:
        kubectl.run("apply", "-n", namespace, "-f", str(job))
        # Killed two steps past the first checkpoint (steps take ~0.5 s here; the next checkpoint is 8 steps away):
        # the restarted gang must redo those steps, and get them the same. Read from the claim, not the status
        # (whose progress is reported every few seconds).
        marker = tmp_path / "pvc" / "shared" / JOB / f"checkpoint-{SAVE_STEPS}" / "FINETUNE_COMPLETE"
        def past_the_checkpoint() -> bool:
            assert not runner.errors, runner.errors
            return marker.exists() and max([0, *(r.get("step") or 0 for r in volume_progress_records(tmp_path))]
                                            ) >= SAVE_STEPS + 2

        wait_for_run(f"step {SAVE_STEPS + 2}, past checkpoint {SAVE_STEPS}", past_the_checkpoint, tmp_path,
                     tail=lambda: str(volume_progress_records(tmp_path)[-3:]))
        victim = next(n for n in runner.processes if "-a1-1-" in n)
        runner.kill(victim)
        st = wait_status(kubectl, namespace, lambda s: s.get("attempt") == 2, 120, chart_operator, runner, name=JOB)
        assert st["restarts"] == 1
        st = wait_status(kubectl, namespace, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600,
                         chart_operator, runner, name=JOB)
    assert st["phase"] == "Succeeded", st
    assert st["attempt"] == 2 and st["progress"]["step"] == STEPS
    progress = st["progress"]
    assert [f["name"] for f in progress["rewardFunctions"]] == ["regex", "letters"]  # the ConfigMap's function ran
    assert "reward" in progress and "completionLength" in progress and "kl" in progress
    second = json.loads(next((tmp_path / "pods").glob(f"{JOB}-a2-0-*/termination-log")).read_text())
    resumed = int(second["resumedFrom"].rsplit("-", 1)[1])
    assert resumed >= SAVE_STEPS and second["completionSamples"]
    records = [r for r in volume_progress_records(tmp_path) if r.get("step") and r.get("loss") is not None]
    first = {r["step"]: r for r in records if r["attempt"] == 1}
    again = [r for r in records if r["attempt"] == 2]
    assert [r["step"] for r in again] == list(range(resumed + 1, STEPS + 1))  # none skipped, none twice
    redone = [r for r in again if r["step"] in first]
    assert redone, (resumed, max(first))
    for r in redone:  # the restored RNG samples the same completions: the same rewards, KL and loss
        for key in ("loss", "reward", "kl", "completionLength"):
            assert abs(r[key] - first[r["step"]][key]) < 1e-4, (r["step"], key, r[key], first[r["step"]][key])
