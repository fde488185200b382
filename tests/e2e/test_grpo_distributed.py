"""GRPO on two processes: the same steps as TRL's GRPOTrainer under torchrun (each prompt's completions split over
the ranks, rewards gathered before the advantages), and a ZeRO-3 gang killed mid-run and started again that resumes
its newest complete checkpoint and redoes no step: the redone steps sample the same completions (the RNG states are
restored with the weights, optimizer partitions, data order and scheduler), so their rewards and KL are equal."""

import pytest

from tests.e2e.test_grpo import assert_same_steps
from tests.support.grpo_reference import grpo_job, run_ours, run_trl_directly
from tests.support.trainer_run import assert_a_killed_gang_resumes_without_redoing_a_step

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
    # The same completions sampled again: the same rewards, KL and loss.
    summary = assert_a_killed_gang_resumes_without_redoing_a_step(
        zero3(tiny_model_dir), tmp_path, same=("loss", "reward", "kl", "completionLength"))
    assert summary["worldSize"] == 2 and summary["zeroStage"] == 3
