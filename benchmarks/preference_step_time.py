"""Our preference tuning and reward modelling against TRL's trainer called directly: seconds per optimizer step of
the same objective, model, data, seed and hyper-parameters, both measured in this run (train_runtime of each, so
start-up and model loading are left out of both). Ours is TRL's trainer inside our trainer, plus our callbacks
(progress, status, checkpoint markers, divergence guard, graceful stop): the ratio says what they cost.

A ratio (TRL's seconds / ours) of 1.0 or more means ours is as fast. The model is a small Llama built here (CPU),
with LoRA, as in the tiny examples; one run's step time varies by up to 25% on a shared CPU, so each side runs
--repeats times, interleaved, and the medians are compared. Usage:
  .venv/bin/python benchmarks/preference_step_time.py [--steps 100] [--repeats 3]
                                                      [--objectives dpo,kto,orpo,simpo,reward] [--out FILE]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

from benchmarks.versus_trl import interleaved, print_table, ratio_row, small_llama  # noqa: E402
from tests.support.trl_reference import run_ours  # noqa: E402

EXAMPLES = {"dpo": "tiny-cpu-dpo.yaml", "kto": "tiny-cpu-kto.yaml", "orpo": "tiny-cpu-dpo.yaml",
            "simpo": "tiny-cpu-dpo.yaml", "cpo": "tiny-cpu-dpo.yaml", "reward": "tiny-cpu-reward.yaml"}


def trl_in_a_fresh_process(doc: dict, model: Path, work: Path, steps: int) -> tuple[list[dict], float]:
    """TRL's direct run in a new Python process, as ours runs in one: a process that already trained has warm
    kernels and allocator caches, worth several percent of a 100-step run of a small model."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.json").write_text(json.dumps(doc))
    code = ("import json, sys; from pathlib import Path; sys.path[:0] = sys.argv[1:3]; "
            "from tests.support.trl_reference import run_trl_directly; "
            "w = Path(sys.argv[3]); print('RESULT ' + json.dumps(run_trl_directly("
            "json.loads((w / 'job.json').read_text()), sys.argv[4], w, int(sys.argv[5]))))")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT), str(ROOT / "operator"), str(work), str(model),
                           str(steps)], capture_output=True, text=True, check=True, cwd=ROOT)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    logs, runtime = json.loads(line.removeprefix("RESULT "))
    return logs, runtime


def measure(objective: str, model: Path, work: Path, steps: int) -> dict:
    # The same work on both sides: TRL's direct run saves no checkpoint and reports to no tracker.
    overrides: dict = {"checkpoints": {"saveStrategy": "no"}, "tracking": {"reportTo": []}}
    if objective not in ("dpo", "kto", "reward"):
        overrides["method"] = {"objective": objective, "preference": {"beta": 0.1}}
    doc, records, summary = run_ours(model, work / "ours", EXAMPLES[objective], steps, **overrides)
    theirs, trl_runtime = trl_in_a_fresh_process(doc, model, work, steps)
    return {"ours": summary["trainRuntimeSeconds"] / steps, "trl": trl_runtime / steps,
            "lossOurs": records[-1]["loss"], "lossTrl": theirs[-1]["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, interleaved; medians reported")
    parser.add_argument("--objectives", default="dpo,kto,orpo,simpo,reward")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    objectives = args.objectives.split(",")
    with tempfile.TemporaryDirectory(prefix="pref-bench-") as tmp:
        work = Path(tmp)
        model = small_llama(work / "model")
        runs = interleaved(objectives, args.repeats, lambda o, repeat: measure(o, model, work / f"{o}-{repeat}",
                                                                                args.steps))
    rows = [{**ratio_row("objective", o, runs[o], args.steps),
             "sameFinalLoss": all(abs(r["lossOurs"] - r["lossTrl"]) < 1e-5 for r in runs[o])} for o in objectives]
    print_table(rows, "objective", "sameFinalLoss", "same loss")
    if args.out:
        args.out.write_text(json.dumps({"model": "Llama 4x256, vocab 8192, LoRA r8, CPU", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
