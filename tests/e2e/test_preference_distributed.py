"""DPO on the multi-node path: two processes (gloo, as two pods would rendezvous) under DeepSpeed ZeRO-2, killed
mid-run and started again: the second run resumes the newest complete checkpoint and redoes no step."""

import json
import signal
import time

import yaml

from finetune_operator.api.validation import validate_job
from finetune_operator.cli.local_run import start_nodes
from finetune_operator.cli.processes import kill_tree
from tests.support.controlplane import ROOT
from tests.support.trainer_run import TEST_ENV, run_nodes

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


def records(workdir):
    lines = (workdir / "output" / "progress.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("step") and r.get("loss") is not None]


def test_dpo_on_two_processes_with_zero2_resumes_after_a_kill_without_redoing_a_step(tiny_model_dir, tmp_path):
    doc = dpo_zero2(tiny_model_dir)
    nodes = start_nodes(validate_job(doc), tmp_path, extra_env=TEST_ENV)
    marker = tmp_path / "output" / f"checkpoint-{SAVE_STEPS}" / "FINETUNE_COMPLETE"
    try:  # killed (SIGKILL, the whole tree) once a checkpoint is complete and the next step is logged
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and not (marker.exists() and any(
                r["step"] > SAVE_STEPS for r in records(tmp_path))):
            assert all(n.process.poll() is None for n in nodes), [n.log_file.read_text()[-2000:] for n in nodes]
            time.sleep(0.02)
    finally:
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # the whole gang frozen at once, then killed
            for n in nodes:
                kill_tree(n.process.pid, sig)
    assert marker.exists(), [n.log_file.read_text()[-2000:] for n in nodes]
    killed = {r["step"]: r for r in records(tmp_path)}
    assert max(killed) < MAX_STEPS  # the kill came before the end

    results = run_nodes(doc, tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].log[-3000:]
    summary = results[0].summary
    resumed_at = int(summary["resumedFrom"].rsplit("-", 1)[1])
    assert summary["steps"] == MAX_STEPS and summary["worldSize"] == 2 and summary["zeroStage"] == 2
    assert summary["attemptSteps"] == MAX_STEPS - resumed_at
    second = [r for r in records(tmp_path) if r["startStep"] == resumed_at]
    assert [r["step"] for r in second] == list(range(resumed_at + 1, MAX_STEPS + 1))  # no step redone or skipped
    # A step the killed run had logged past its checkpoint is the same step again: weights, optimizer states
    # (each rank's ZeRO-2 partition), data order and scheduler all restored.
    again = [r for r in second if r["step"] in killed]
    assert again or resumed_at > SAVE_STEPS
    for r in again:
        assert abs(r["loss"] - killed[r["step"]]["loss"]) < 1e-4, (r["step"], r["loss"], killed[r["step"]]["loss"])
        assert abs(r["rewardsMargin"] - killed[r["step"]]["rewardsMargin"]) < 1e-4
