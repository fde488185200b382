"""The GPU suite's GRPO case (benchmarks/gpu_suite.py runs it as `grpo`): LoRA GRPO on the suite's ~1.1B Llama
through `finetune run`, and the same run through TRL's GRPOTrainer called directly (tests/support/grpo_reference.py),
each in its own process: seconds per step (generation of 16 completions of 256 tokens per step, 8 per prompt, the
rewards, the KL against the base, the update), the ratio TRL/ours (goal >= 0.95), tokens/s, peak memory against the
fit estimate (which counts the generation's KV cache), and whether both ended on the same loss and reward.

Random weights rarely sample the end-of-sequence token: every completion runs to maxCompletionLength, so the work per
step is the same on both sides and from run to run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

GPU_COMPLETION, SMOKE_COMPLETION = 256, 16


def grpo_job(model: Path, gpu: bool, steps: int) -> dict:
    completion = GPU_COMPLETION if gpu else SMOKE_COMPLETION
    prompts = [{"prompt": f"Write two sentences about the number {i}.", "answer": str(i)} for i in range(64)]
    spec = {
        "model": {"name": str(model), "dtype": "bfloat16" if gpu else "float32", "attnImplementation": "sdpa"},
        "data": {"format": "prompt", "maxLength": completion + 64, "train": [{"inline": prompts}]},
        "method": {"type": "lora", "objective": "grpo", "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
                   "grpo": {"numGenerations": 8, "maxCompletionLength": completion, "temperature": 1.0,
                            "beta": 0.04, "lossType": "dapo",
                            "rewards": [{"type": "function", "function": "tests.support.grpo_rewards:letters",
                                         "weight": 1.0},
                                        {"type": "length", "maxTokens": completion, "softTokens": completion // 4,
                                         "weight": 0.2}]}},
        "training": {"maxSteps": steps, "learningRate": 1e-5, "perDeviceTrainBatchSize": 16 if gpu else 8,
                     "precision": "bf16" if gpu else "fp32", "loggingSteps": 1, "optim": "adamw_torch", "seed": 7},
        "distributed": {"numNodes": 1, "gpusPerNode": 1 if gpu else 0},
        "checkpoints": {"saveStrategy": "no"}, "tracking": {"reportTo": []},
    }
    return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": "gpu-grpo"},
            "spec": spec}


def case_grpo(work: Path, size: Any, gpu: bool) -> dict:
    from benchmarks import gpu_cases as suite  # the helpers of the suite this case belongs to
    from tests.support.grpo_reference import run_trl_directly

    steps = 8 if gpu else 3
    model = suite.build_model(work, size)
    doc = grpo_job(model, gpu, steps)
    summary, records, first = suite.finetune_run(doc, work / "grpo", suite.CASE_SECONDS["grpo"] * 3)
    theirs, trl_runtime = run_trl_directly(doc, model, work / "grpo-trl", steps)
    ours = summary["trainRuntimeSeconds"] / steps
    trl = trl_runtime / steps
    # Per step as well: on the first H200 run the means differed (0.82x) while the steps after the first looked alike
    # on our side but for one of 30 s; TRL's steps were not timed. The medians after the warm-up step say which.
    our_steps, trl_steps = step_seconds(records), [h.get("stepSeconds") for h in theirs]
    steady_ours, steady_trl = median_after_first(our_steps), median_after_first(trl_steps)
    apart = first_step_apart(records, theirs)
    measured = summary.get("peakMemoryGiB")
    predicted = suite.predicted_peak_gib(doc, model)
    return {"secondsPerStep": round(ours, 3), "trlSecondsPerStep": round(trl, 3), "vsTrl": round(trl / ours, 3),
            "tokensPerSecondPerGpu": suite.steady(records, "tokensPerSecondPerDevice"),
            "peakMemoryGiB": measured, "predictedPeakGiB": predicted,
            "predictedOverMeasured": round(predicted / measured, 3) if measured and predicted else None,
            "loss": summary.get("finalLoss"), "reward": summary.get("reward"),
            "completionLength": summary.get("completionLength"),
            "sameRunAsTrl": apart is None,
            # Where the two runs part says why they do: at step 1 the first generation already differed (set-up,
            # random state); later, the updates drifted apart (bf16 kernels) until a sampled token flipped.
            "firstStepApart": apart,
            "lossAndRewardPerStep": per_step(records, theirs),
            "secondsToFirstStep": round(first, 1),
            "steadySecondsPerStep": steady_ours, "trlSteadySecondsPerStep": steady_trl,
            "steadyVsTrl": round(steady_trl / steady_ours, 3) if steady_ours and steady_trl else None,
            "stepSeconds": [_round(x) for x in our_steps], "trlStepSeconds": [_round(x) for x in trl_steps]}


def step_seconds(records: list[dict]) -> list[float | None]:
    """Each step's wall time from our progress records (loggingSteps 1): the tokens it added over its rate, which the
    progress callback measures from one log to the next. None after a missing record: the tokens would count two
    steps over one step's rate."""
    out, seen, last_step = [], 0, 0
    for r in records:
        rate, tokens, step = r.get("tokensPerSecond"), r.get("tokensSeen"), r.get("step")
        follows = step == last_step + 1
        out.append((tokens - seen) / rate if follows and rate and tokens is not None and tokens > seen else None)
        seen = tokens if tokens is not None else seen
        last_step = step if isinstance(step, int) else last_step
    return out


def first_step_apart(ours: list[dict], theirs: list[dict], tolerance: float = 1e-3) -> int | None:
    """The first logged step whose loss or mean reward differs between our records and TRL's logs (step by step, each
    a dict with step, loss and reward; a NaN differs from anything), or where one run logged a step the other did
    not; None: the same run."""
    for step, r, t in _by_step(ours, theirs):
        if r is None or t is None or not all(
                r.get(k) is not None and t.get(k) is not None and abs(r[k] - t[k]) < tolerance
                for k in ("loss", "reward")):
            return step
    return None


def per_step(ours: list[dict], theirs: list[dict]) -> list[list]:
    """[step, our loss, TRL's loss, our reward, TRL's reward] for every step either side logged, paired by step."""
    return [[step, *((side or {}).get(k) for k in ("loss", "reward") for side in (r, t))]
            for step, r, t in _by_step(ours, theirs)]


def _by_step(ours: list[dict], theirs: list[dict]) -> list[tuple[int, dict | None, dict | None]]:
    mine, trl = {r.get("step"): r for r in ours}, {t.get("step"): t for t in theirs}
    return [(step, mine.get(step), trl.get(step)) for step in sorted(mine.keys() | trl.keys())]


def median_after_first(seconds: list[float | None]) -> float | None:
    import statistics

    rest = [x for x in seconds[1:] if x is not None]
    return round(statistics.median(rest), 3) if rest else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
