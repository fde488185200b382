"""DPO on the multi-node path: two processes (gloo, as two pods would rendezvous) under DeepSpeed ZeRO-2, killed
mid-run and started again: the second run resumes the newest complete checkpoint and redoes no step."""

import yaml

from tests.support.controlplane import ROOT
from tests.support.trainer_run import kill_gang_after_a_checkpoint, progress_records, run_nodes

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
    doc = dpo_zero2(tiny_model_dir)
    checkpoint, last_logged = kill_gang_after_a_checkpoint(doc, tmp_path)
    killed = {r["step"]: r for r in progress_records(tmp_path)}
    assert last_logged < MAX_STEPS  # the kill came before the end

    results = run_nodes(doc, tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].log[-3000:]
    summary = results[0].summary
    resumed_at = int(summary["resumedFrom"].rsplit("-", 1)[1])
    assert resumed_at == checkpoint  # the newest complete checkpoint
    assert summary["steps"] == MAX_STEPS and summary["worldSize"] == 2 and summary["zeroStage"] == 2
    assert summary["attemptSteps"] == MAX_STEPS - resumed_at
    second = [r for r in progress_records(tmp_path) if r["startStep"] == resumed_at]
    assert [r["step"] for r in second] == list(range(resumed_at + 1, MAX_STEPS + 1))  # no step redone or skipped
    # A step the killed run had logged past its checkpoint is the same step again: weights, optimizer states
    # (each rank's ZeRO-2 partition), data order and scheduler all restored.
    again = [r for r in second if r["step"] in killed]
    assert again or resumed_at >= last_logged
    for r in again:
        assert abs(r["loss"] - killed[r["step"]]["loss"]) < 1e-4, (r["step"], r["loss"], killed[r["step"]]["loss"])
        assert abs(r["rewardsMargin"] - killed[r["step"]]["rewardsMargin"]) < 1e-4
