"""Our GRPO against TRL's GRPOTrainer called directly: seconds per optimizer step (generation, rewards, the loss and
the update) of the same model, data, seed, rewards and settings, both measured in this run (train_runtime of each,
so start-up and model loading are left out of both). Ours is TRL's trainer inside our trainer, plus our callbacks
(progress, status, checkpoint markers, divergence guard, graceful stop) and the guard around each reward function:
the ratio says what they cost.

A ratio (TRL's seconds / ours) of 1.0 or more means ours is as fast; the goal is 0.95 or more. The model is a small
Llama built here (CPU), LoRA as in the tiny example, 4 completions of 32 tokens for each of 2 prompts a step; one
run's step time varies by up to 25% on a shared CPU, so each side runs --repeats times, interleaved, in fresh
processes, and the medians are compared. Both sides must also end on the same loss and reward (the same run).
Usage:
  .venv/bin/python benchmarks/grpo_step_time.py [--steps 30] [--repeats 3] [--out FILE]
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # both sides alike, one thread a process, as the tests run them

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

from benchmarks.versus_trl import interleaved, print_table, ratio_row, small_llama  # noqa: E402
from tests.support.grpo_reference import grpo_job, run_ours, run_trl_directly  # noqa: E402

COMPLETION_TOKENS = 32


def job(model: Path, steps: int, method: str) -> dict:
    doc = grpo_job(model, "dapo", method, steps=steps)
    doc["spec"]["data"]["maxLength"] = 128
    grpo = doc["spec"]["method"]["grpo"]
    grpo["maxCompletionLength"] = COMPLETION_TOKENS
    grpo["rewards"][-1].update(maxTokens=COMPLETION_TOKENS, softTokens=8)
    doc["spec"]["training"]["loggingSteps"] = 1
    return doc


def measure(model: Path, work: Path, steps: int, method: str) -> dict:
    doc = job(model, steps, method)
    records, summary = run_ours(doc, work / "ours")
    theirs, trl_runtime = run_trl_directly(doc, model, work / "trl", steps)
    return {"ours": summary["trainRuntimeSeconds"] / steps, "trl": trl_runtime / steps,
            "same": abs(records[-1]["loss"] - theirs[-1]["loss"]) < 1e-4
            and abs(records[-1]["reward"] - theirs[-1]["reward"]) < 1e-4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, interleaved; medians reported")
    parser.add_argument("--methods", default="lora,full")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    methods = args.methods.split(",")
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        work = Path(tmp)
        model = small_llama(work / "model")
        runs = interleaved(methods, args.repeats, lambda m, repeat: measure(model, work / f"{m}-{repeat}",
                                                                             args.steps, m))
    rows = [{**ratio_row("method", m, runs[m], args.steps), "sameRun": all(r["same"] for r in runs[m])}
            for m in methods]
    print_table(rows, "method", "sameRun", "same run")
    if args.out:
        args.out.write_text(json.dumps({"model": "Llama 4x256, vocab 8192, CPU; 8 completions of up to "
                                        f"{COMPLETION_TOKENS} tokens a step", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
