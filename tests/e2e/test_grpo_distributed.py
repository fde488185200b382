"""GRPO on two processes: the same steps as TRL's GRPOTrainer under torchrun (each prompt's completions split over
the ranks, rewards gathered before the advantages), and a ZeRO-3 gang killed mid-run and started again that resumes
its newest complete checkpoint and redoes no step: the redone steps sample the same completions (the RNG states are
restored with the weights, optimizer partitions, data order and scheduler), so their rewards and KL are equal."""

import pytest

from tests.e2e.test_grpo import assert_same_steps
from tests.support.grpo_reference import grpo_job, run_ours, run_trl_directly
from tests.support.trainer_run import kill_gang_after_a_checkpoint, progress_records, run_nodes

# Steps take ~0.8 s here under ZeRO-3: the steps after the checkpoint leave the kill room to land before the end.
# An epoch is 4 steps (8 prompts, 2 a step): the checkpoint at 5 is in the second, whose prompt order a resumed run
# must draw again (training/grpo.py, resumable_sampler).
MAX_STEPS, SAVE_STEPS = 12, 5


@pytest.mark.parametrize(("loss_type", "method"), [("dr_grpo", "lora"), ("grpo", "full")])
def test_two_processes_match_trl_under_torchrun(loss_type, method, tiny_model_dir, tmp_path):
    """Two processes of 4 completions each (the 8 of a step: 2 prompts x 4), DDP on gloo on both sides."""
    doc = grpo_job(tiny_model_dir, loss_type, method, processes=2)
    ours, summary = run_ours(doc, tmp_path / "ours")
    theirs, _ = run_trl_directly(doc, tiny_model_dir, tmp_path / "trl")
    assert summary["worldSize"] == 2
    assert_same_steps(ours, theirs)


def zero3(model_dir) -> dict:
    doc = grpo_job(model_dir, "grpo", "full", steps=MAX_STEPS)
    spec = doc["spec"]
    spec["training"]["perDeviceTrainBatchSize"] = 4  # 2 nodes x 4 = 8 completions: 2 prompts x 4
    spec["distributed"] = {"numNodes": 2, "gpusPerNode": 0, "strategy": "deepspeed", "deepspeed": {"zeroStage": 3}}
    spec["checkpoints"] = {"saveSteps": SAVE_STEPS, "keep": 3}
    return doc


def test_grpo_under_zero3_resumes_after_a_kill_without_redoing_or_changing_a_step(tiny_model_dir, tmp_path):
    doc = zero3(tiny_model_dir)
    checkpoint, last_logged = kill_gang_after_a_checkpoint(doc, tmp_path)
    killed = {r["step"]: r for r in progress_records(tmp_path)}
    assert last_logged < MAX_STEPS  # the kill came before the end

    results = run_nodes(doc, tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].log[-3000:]
    summary = results[0].summary
    resumed_at = int(summary["resumedFrom"].rsplit("-", 1)[1])
    assert resumed_at == checkpoint  # the newest complete checkpoint
    assert summary["steps"] == MAX_STEPS and summary["worldSize"] == 2 and summary["zeroStage"] == 3
    assert summary["attemptSteps"] == MAX_STEPS - resumed_at
    second = [r for r in progress_records(tmp_path) if r["startStep"] == resumed_at]
    assert [r["step"] for r in second] == list(range(resumed_at + 1, MAX_STEPS + 1))  # no step redone or skipped
    again = [r for r in second if r["step"] in killed]
    assert again or resumed_at >= last_logged
    for r in again:  # the same completions sampled again: the same rewards, KL and loss
        before = killed[r["step"]]
        for key in ("loss", "reward", "kl", "completionLength"):
            assert abs(r[key] - before[key]) < 1e-4, (r["step"], key, r[key], before[key])
