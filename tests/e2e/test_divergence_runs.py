"""runPolicy.divergence in real training processes: a curriculum in a fixed order whose new rows start far above
the early loss is not stopped, because the trainer measures the rows of its first step again and the model still
knows them (the learning-rate-10 runs, which the guard must stop at any length, are in test_local_run.py)."""

import json
import random

from finetune_operator.api import exit_codes
from tests.builders import make_job
from tests.support.trainer_run import run_nodes

KNOWN = [{"instruction": f"What is {a} plus {b}?", "output": f"{a} plus {b} is {a + b}."}
         for a, b in ((1, 2), (3, 4), (2, 5), (4, 4))]
WORDS = ["quartz", "zephyr", "jukebox", "vortex", "pixel", "walrus", "kayak", "fjord", "lynx", "gizmo"]


def job(model, rows, steps, learning_rate, **training):
    return make_job({"metadata.name": "curriculum", "spec.model": {"name": str(model), "dtype": "float32"},
                     "spec.data": {"format": "alpaca", "maxLength": 96, "train": [{"inline": rows}]},
                     "spec.method": {"type": "full"},
                     "spec.training": {"maxSteps": steps, "learningRate": learning_rate, "perDeviceTrainBatchSize": 4,
                                       "precision": "fp32", "optim": "adamw_torch", "loggingSteps": 1,
                                       "lrScheduler": "constant", "seed": 7, **training},
                     "spec.distributed": {"numNodes": 1, "gpusPerNode": 0},
                     "spec.checkpoints": {"saveSteps": 10, "keep": 10}})


def test_a_sequential_curriculum_whose_new_rows_start_high_is_not_stopped(tiny_model_dir, tmp_path):
    """The issue's run: a memorised model trained on new rows with train_sampling_strategy: sequential was stopped
    (exit 79) while the new rows' loss fell. Here: 20 steps of the rows it knows (loss ~0.05), then rows of words it
    never saw (loss ~14, falling): LossShifted, checkpoints again after it, Succeeded."""
    (memorised,) = run_nodes(job(tiny_model_dir, KNOWN, 80, 0.01), tmp_path / "memorise")
    assert memorised.returncode == 0, memorised.log[-2000:]
    rng = random.Random(0)
    new = [{"instruction": "Say something.", "output": " ".join(rng.choice(WORDS) for _ in range(6)) + "."}
           for _ in range(200)]
    (result,) = run_nodes(job(tmp_path / "memorise" / "output" / "final", KNOWN * 20 + new, 60, 0.001,
                              extraArgs={"train_sampling_strategy": "sequential"}), tmp_path / "curriculum")
    assert result.returncode == exit_codes.SUCCESS, result.summary.get("message") or result.log[-3000:]
    (shifted,) = [w["message"] for w in result.summary.get("warnings", []) if w["reason"] == "LossShifted"]
    assert "when it rose the rows of the first optimizer step, measured again, had a loss of" in shifted
    assert "the rows are new (a fixed data order, a curriculum, other data resumed on)" in shifted
    records = [json.loads(line) for line in (tmp_path / "curriculum" / "output" / "progress.jsonl").read_text()
               .splitlines()]
    losses = {r["step"]: r["loss"] for r in records if r.get("loss") is not None}
    assert max(losses[s] for s in range(1, 21)) < 0.5 < 5 < losses[21], losses  # known rows, then the jump
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "curriculum" / "output").glob("checkpoint-*"))
    assert saved[-2:] == [50, 60], saved  # saving again once the guard took the new level
