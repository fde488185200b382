"""DPO on the multi-node path: two processes (gloo, as two pods would rendezvous) under DeepSpeed ZeRO-2, killed
mid-run and started again: the second run resumes the newest complete checkpoint and redoes no step."""

import yaml

from tests.support.controlplane import ROOT
from tests.support.trainer_run import assert_a_killed_gang_resumes_without_redoing_a_step

# Steps take ~0.3 s here: the steps after the checkpoint leave the kill room to land before the end on a loaded
# machine (with 6, a CI run logged the last step before the kill arrived).
MAX_STEPS, SAVE_STEPS = 12, 3


def dpo_zero2(model_dir) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-dpo.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["name"] = str(model_dir)
    spec["training"].update(maxSteps=MAX_STEPS, perDeviceTrainBatchSize=2, seed=7)
    spec["distributed"] = {"numNodes": 2, "gpusPerNode": 0, "strategy": "deepspeed", "deepspeed": {"zeroStage": 2}}
    spec["checkpoints"] = {"saveSteps": SAVE_STEPS, "keep": 3}
    return doc


def test_dpo_on_two_processes_with_zero2_resumes_after_a_kill_without_redoing_a_step(tiny_model_dir, tmp_path):
    # A step the killed run had logged past its checkpoint is the same step again: weights, optimizer states (each
    # rank's ZeRO-2 partition), data order and scheduler all restored.
    summary = assert_a_killed_gang_resumes_without_redoing_a_step(
        dpo_zero2(tiny_model_dir), tmp_path, same=("loss", "rewardsMargin"))
    assert summary["worldSize"] == 2 and summary["zeroStage"] == 2
