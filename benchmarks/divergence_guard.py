"""runPolicy.divergence measured: false positives on healthy runs, true positives on runs that really diverge.

Every run is a real Hugging Face Trainer run of the tiny Llama model on CPU (full or LoRA, AdamW, the Trainer's
default gradient clipping, constant or warm-up + cosine schedules), logging every optimizer step. Its logged
losses are then fed, exactly as the Trainer feeds them, to our guard (DivergenceWatch with the default policy), both
as logged every step and as `loggingSteps: 5` would log them (step 1 alone, then the mean of each 5 steps), and to
the previous rule (3 logged losses in a row above max(3 x first, first + 3)) as the baseline of the same runs.

Healthy runs (each must never be stopped): a fresh model, tiny batches of 1, warm-up schedules, and a model that
already knows part of the data (memorised rows) continued on a mix of known and new rows, including the case where
the first batch holds only known rows. The memorised model's "new" rows are made of words it has never seen (their
loss starts above ln V). Diverging runs: learning rates >= 1 (full fine-tune); a run counts as truly diverged when
its loss, averaged over 10 steps, reaches 10x its first step's; the table says at which step each rule stopped it. A
learning rate of 0.5 is unstable: counted with the diverged runs when it diverges, as "recovered" when it does not.
Usage: .venv/bin/python benchmarks/divergence_guard.py [--steps 120] [--seeds 5] [--json out.json]
       .venv/bin/python benchmarks/divergence_guard.py --replay out.json   # judge saved trajectories again
"""

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

from finetune_operator.api.run_policy import DivergencePolicy  # noqa: E402
from finetune_trainer.tiny_model import build_tiny_model  # noqa: E402
from finetune_trainer.training.callbacks import DivergenceWatch  # noqa: E402

SUBJECTS = ["the fox", "a dog", "the sky", "my cat", "the sea", "a bird", "the sun", "our team", "the road", "a fish"]
VERBS = ["jumps over", "looks at", "runs to", "swims in", "sings for", "waits by", "writes to", "hides under"]
# Rows the memorised model has never seen: other words, which its tokenizer splits into unfamiliar pieces.
UNSEEN = ["quartz", "zephyr", "jukebox", "vortex", "pixel", "walrus", "kayak", "fjord", "lynx", "gizmo", "quiche",
          "sphinx", "wizard", "banjo", "cobalt", "oxygen", "yacht", "zigzag", "jinx", "fuzzy"]
OBJECTS = ["the lazy dog", "a clear day", "the blue sea", "two plus two", "the yellow house", "seven red cars",
           "the quiet hill", "a primary colour", "the old bridge", "nine small boats"]


@dataclass(frozen=True)
class Case:
    name: str
    healthy: bool
    start: str  # "fresh" (random init) or "memorised" (a model that has learnt the known rows by heart)
    method: str  # "full" or "lora"
    lr: float
    batch: int = 2
    known: float = 0.0  # fraction of training rows the model already knows
    easy_first: bool = False  # the first batch holds known rows only
    schedule: str = "constant"
    warmup: int = 0


CASES = [
    Case("fresh model, full, lr 3e-3", True, "fresh", "full", 3e-3),
    Case("fresh model, LoRA, batch 1, lr 1e-2", True, "fresh", "lora", 1e-2, batch=1),
    Case("warm-up 10 + cosine, full, lr 5e-3", True, "fresh", "full", 5e-3, schedule="cosine", warmup=10),
    Case("known 50% + new, LoRA, lr 2e-4", True, "memorised", "lora", 2e-4, known=0.5),
    Case("known 80% + new, full, batch 1, lr 1e-3", True, "memorised", "full", 1e-3, batch=1, known=0.8),
    Case("easy first batch (known), then new, full, lr 2e-4", True, "memorised", "full", 2e-4, known=0.3,
         easy_first=True),
    Case("lr 0.5, full (unstable: may recover)", False, "fresh", "full", 0.5),
    Case("lr 1, full", False, "fresh", "full", 1.0),
    Case("lr 2, full", False, "fresh", "full", 2.0),
    Case("lr 5, full", False, "fresh", "full", 5.0),
    Case("lr 10, full", False, "fresh", "full", 10.0),
    Case("lr 3, full, from the memorised model", False, "memorised", "full", 3.0, known=0.5),
]


def sentences(rng: random.Random, count: int) -> list[str]:
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} and {rng.choice(SUBJECTS)} "
            f"{rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(count)]


def unseen(rng: random.Random, count: int) -> list[str]:
    return [" ".join(rng.choice(UNSEEN) for _ in range(10)) + "." for _ in range(count)]


def tokenized(tokenizer, texts: list[str]) -> list[dict]:
    rows = []
    for text in texts:
        ids = tokenizer(text + tokenizer.eos_token)["input_ids"][:48]
        rows.append({"input_ids": ids, "labels": list(ids)})
    return rows


def collate(rows: list[dict]) -> dict:
    import torch

    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"]), 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def train(model_dir: Path, rows: list[dict], case: Case, steps: int, seed: int, out: Path, shuffle: bool = True
          ) -> list[float]:
    """Per-step training losses of one Trainer run (logging every step)."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if case.method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    losses: list[float] = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and "train_loss" not in logs:
                losses.append(float(logs["loss"]))

    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=case.batch,
                             learning_rate=case.lr, lr_scheduler_type=case.schedule, warmup_steps=case.warmup,
                             logging_steps=1, logging_first_step=True, save_strategy="no", report_to=[], seed=seed,
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)

    class Ordered(Trainer):
        def _get_train_sampler(self, *a, **k):  # the easy-first case keeps the order it was given
            return None if shuffle else torch.utils.data.SequentialSampler(self.train_dataset)

    trainer = (Trainer if shuffle else Ordered)(model=model, args=args, train_dataset=rows, data_collator=collate,
                                                callbacks=[Record()])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return losses


def logged(per_step: list[float], every: int) -> list[tuple[int, float]]:
    """(step, loss) as the Trainer logs them with loggingSteps `every`: step 1 alone, then each window's mean."""
    if every == 1:
        return [(i + 1, v) for i, v in enumerate(per_step)]
    out = [(1, per_step[0])]
    for end in range(every, len(per_step) + 1, every):
        start = out[-1][0]
        out.append((end, statistics.fmean(per_step[start:end])))
    return out


def guard_stop(points: list[tuple[int, float]], vocab: int) -> tuple[int | None, list[str]]:
    """Our DivergenceWatch, fed as the Trainer feeds it: (step it stopped at, warnings)."""
    from transformers import TrainerControl, TrainerState

    warnings: list[str] = []
    watch = DivergenceWatch(DivergencePolicy(), lambda reason, _msg: warnings.append(reason), vocab)
    state, control = TrainerState(), TrainerControl()
    watch.on_train_begin(None, state, control)
    for step, loss in points:
        state.global_step = step
        watch.on_step_end(None, state, control)
        watch.on_log(None, state, control, logs={"loss": loss})
        if control.should_training_stop:
            return step, warnings
    return None, warnings


def old_rule_stop(points: list[tuple[int, float]]) -> int | None:
    """The rule before this change: 3 logged losses in a row above max(3 x the first, first + 3)."""
    first = points[0][1]
    threshold, run = max(3 * first, first + 3), 0
    for step, loss in points:
        run = run + 1 if loss > threshold or not math.isfinite(loss) else 0
        if run >= 3 or not math.isfinite(loss):
            return step
    return None


def judge(run: dict) -> dict:
    """Each rule's verdict on one run's trajectory, and whether it truly diverged: its loss, averaged over 10
    steps, reached 10x the first step's (or became non-finite)."""
    per_step = run["losses"]
    for every in (1, 5):
        points = logged(per_step, every)
        stop, warnings = guard_stop(points, run["vocab"])
        run[f"every{every}"] = {"guard": stop, "warnings": warnings, "old": old_rule_stop(points)}
    peak = max(statistics.fmean(per_step[i:i + 10]) for i in range(max(1, len(per_step) - 9)))
    run["diverged"] = peak >= 10 * per_step[0] or not all(map(math.isfinite, per_step))
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seeds", type=int, default=5, help="seeds per healthy case (diverging cases: 2)")
    parser.add_argument("--json", type=Path, help="write every trajectory and verdict here")
    parser.add_argument("--replay", type=Path, help="judge the trajectories of an earlier --json again, no training "
                        "(e.g. after changing the guard)")
    opts = parser.parse_args()
    if opts.replay:
        report([judge(run) for run in json.loads(opts.replay.read_text())])
        return
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    work = Path(tempfile.mkdtemp(prefix="divergence-guard-"))
    fresh = build_tiny_model(work / "fresh")
    tokenizer = AutoTokenizer.from_pretrained(fresh)
    vocab = json.loads((fresh / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    known_rows = tokenized(tokenizer, sentences(rng, 16))
    new_rows = tokenized(tokenizer, sentences(random.Random(1), 400))
    unseen_rows = tokenized(tokenizer, unseen(random.Random(2), 400))
    # The memorised model: the fresh one trained on the known rows until it reproduces them (loss near 0).
    import torch
    from transformers import AutoModelForCausalLM

    memo = work / "memorised"
    model = AutoModelForCausalLM.from_pretrained(fresh, dtype=torch.float32)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = collate(known_rows)
    for _ in range(300):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(memo)
    tokenizer.save_pretrained(memo)
    print(f"memorised model: loss on its {len(known_rows)} rows {loss.item():.4f}", flush=True)

    results = []
    for case in CASES:
        for seed in range(opts.seeds if case.healthy else 2):
            srng = random.Random(100 + seed)
            rows = list(unseen_rows if case.start == "memorised" else new_rows)
            if case.known:
                count = int(len(rows) * case.known / (1 - case.known))
                rows += [known_rows[i % len(known_rows)] for i in range(count)]
            srng.shuffle(rows)
            if case.easy_first:
                rows = known_rows[:case.batch] + rows
            per_step = train(memo if case.start == "memorised" else fresh, rows, case, opts.steps, seed,
                             work / f"run-{len(results)}", shuffle=not case.easy_first)
            results.append(judge({"case": case.name, "healthy": case.healthy, "seed": seed, "losses": per_step,
                                  "vocab": vocab}))
            verdict = results[-1]
            print(f"{case.name} seed {seed}: first {per_step[0]:.3f} min {min(per_step):.3f} "
                  f"last {per_step[-1]:.3f} max {max(per_step):.1f}; guard {verdict['every1']['guard']} "
                  f"(every 5: {verdict['every5']['guard']}), old rule {verdict['every1']['old']} "
                  f"(every 5: {verdict['every5']['old']})", flush=True)
    report(results)
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1))


def stops(runs: list[dict], key: str, rule: str) -> str:
    """How many of `runs` the rule stopped, and at which steps."""
    steps = [r[key][rule] for r in runs if r[key][rule] is not None]
    return f"{len(steps)}/{len(runs)}" + (f" (steps {', '.join(map(str, steps))})" if steps else "")


def report(results: list[dict]) -> None:
    print("\n| case | runs | loggingSteps | stopped by the guard | stopped by the old rule | guard's warnings |")
    print("|---|---|---|---|---|---|")
    for name in dict.fromkeys(r["case"] for r in results):
        runs = [r for r in results if r["case"] == name]
        for every in (1, 5):
            key = f"every{every}"
            warned = sum(1 for r in runs if r[key]["warnings"])
            print(f"| {name} | {len(runs)} | {every} | {stops(runs, key, 'guard')} | {stops(runs, key, 'old')} | "
                  f"{warned}/{len(runs)} |")
    healthy = [r for r in results if r["healthy"]]
    diverging = [r for r in results if not r["healthy"] and r["diverged"]]
    recovered = [r for r in results if not r["healthy"] and not r["diverged"]]
    for every in (1, 5):
        key = f"every{every}"
        fp_new = sum(r[key]["guard"] is not None for r in healthy)
        fp_old = sum(r[key]["old"] is not None for r in healthy)
        tp_new = sum(r[key]["guard"] is not None for r in diverging)
        tp_old = sum(r[key]["old"] is not None for r in diverging)
        print(f"\nloggingSteps {every}: false positives (healthy runs stopped): guard {fp_new}/{len(healthy)}, "
              f"old rule {fp_old}/{len(healthy)}; true positives (runs whose loss reached 10x the first): "
              f"guard {tp_new}/{len(diverging)}, old rule {tp_old}/{len(diverging)}; high learning rates that never "
              f"reached 10x: guard stopped {sum(r[key]['guard'] is not None for r in recovered)}/"
              f"{len(recovered)}, old rule {sum(r[key]['old'] is not None for r in recovered)}/{len(recovered)}")


if __name__ == "__main__":
    main()
