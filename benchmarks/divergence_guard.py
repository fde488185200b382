"""runPolicy.divergence measured: false positives and false negatives of the guard on real runs of every length.

Every run is a real Hugging Face Trainer run of the tiny Llama model on CPU (full or LoRA, AdamW, the Trainer's
default gradient clipping, constant or warm-up + cosine schedules, shuffled or in a fixed order), 120 optimizer steps
logged every step. After every step the weights' loss on 32 of the run's own rows is measured (the probe), and every
10 steps the run's validation loss where it has validation rows. The guard (DivergenceWatch, default policy) is then
fed the run as the Trainer feeds it: each length L (10, 15, 20, 25, 30, 40 and 120 steps; a shorter run is the
same run cut at L where the schedule is constant, cosine runs are judged at 120 only) x loggingSteps 1, 5, 10, 25
(step 1, then each window's mean, and the last step, which the guard always logs), validation logs interleaved,
a save every 5 steps (held back during a spike), and its end-of-run judgement. Resumes: the same runs resumed from
each checkpoint saved at steps 10, 25, 50 and 75, replaying the history before it as the Trainer's checkpoint holds it.

Truth: the weights at step s are diverged when their probe loss is above the guard's own threshold applied to the
probe, max(3 x b, b + 3) with b the probe loss of the starting weights (at most ln V): what the guard promises to
catch, measured on the weights themselves rather than on noisy training batches. A stop (or a failed end) at step
s is a false positive unless the weights at s are diverged; a run that ends Succeeded at L is a false negative when
the weights at L are. A checkpoint the guard names as the last good one must not be diverged either.

Healthy runs: a fresh model, tiny batches of 1, warm-up schedules, a model that already knows part of the data
(memorised rows) on a shuffled mix of known and new rows, an easy first batch, curricula in a fixed order (known
rows first, then new rows whose loss starts above ln V and falls), and validation rows the model never learns (an
eval-only spike). Diverging runs: learning rates 0.5 (unstable: may recover) to 10, shuffled and in a fixed order.
Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/divergence_guard.py [--steps 120] [--seeds 5] [--json out.json]
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
from finetune_trainer.training.divergence import DivergenceWatch, FirstRows  # noqa: E402

SUBJECTS = ["the fox", "a dog", "the sky", "my cat", "the sea", "a bird", "the sun", "our team", "the road", "a fish"]
VERBS = ["jumps over", "looks at", "runs to", "swims in", "sings for", "waits by", "writes to", "hides under"]
# Rows the memorised model has never seen: other words, which its tokenizer splits into unfamiliar pieces.
UNSEEN = ["quartz", "zephyr", "jukebox", "vortex", "pixel", "walrus", "kayak", "fjord", "lynx", "gizmo", "quiche",
          "sphinx", "wizard", "banjo", "cobalt", "oxygen", "yacht", "zigzag", "jinx", "fuzzy"]
OBJECTS = ["the lazy dog", "a clear day", "the blue sea", "two plus two", "the yellow house", "seven red cars",
           "the quiet hill", "a primary colour", "the old bridge", "nine small boats"]
LENGTHS = (10, 15, 20, 25, 30, 40)
EVERY = (1, 5, 10, 25)
RESUMES = (10, 25, 50, 75)
SAVE_STEPS = 5
EVAL_STEPS = 10


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
    sequential: bool = False  # a fixed order: the known rows first, then the new ones (a curriculum)
    schedule: str = "constant"
    warmup: int = 0
    validation: bool = False  # validation rows of unseen words, which the run never trains on


CASES = [
    Case("fresh model, full, lr 3e-3", True, "fresh", "full", 3e-3),
    Case("fresh model, LoRA, batch 1, lr 1e-2", True, "fresh", "lora", 1e-2, batch=1),
    Case("warm-up 10 + cosine, full, lr 5e-3", True, "fresh", "full", 5e-3, schedule="cosine", warmup=10),
    Case("known 50% + new, LoRA, lr 2e-4", True, "memorised", "lora", 2e-4, known=0.5),
    Case("known 80% + new, full, batch 1, lr 1e-3", True, "memorised", "full", 1e-3, batch=1, known=0.8),
    Case("easy first batch (known), then new, full, lr 2e-4", True, "memorised", "full", 2e-4, known=0.3,
         easy_first=True),
    Case("sequential: known rows, then new, full, lr 2e-4", True, "memorised", "full", 2e-4, known=0.15,
         sequential=True),
    Case("sequential: known rows, then new, LoRA, lr 2e-3", True, "memorised", "lora", 2e-3, known=0.15,
         sequential=True),
    Case("validation rows never trained on (eval-only spike), full, lr 3e-3", True, "fresh", "full", 3e-3,
         validation=True),
    Case("lr 0.5, full (unstable: may recover)", False, "fresh", "full", 0.5),
    Case("lr 1, full", False, "fresh", "full", 1.0),
    Case("lr 2, full", False, "fresh", "full", 2.0),
    Case("lr 5, full", False, "fresh", "full", 5.0),
    Case("lr 10, full", False, "fresh", "full", 10.0),
    Case("lr 3, full, from the memorised model", False, "memorised", "full", 3.0, known=0.5),
    Case("sequential: known rows, then new, lr 3, from the memorised model", False, "memorised", "full", 3.0,
         known=0.15, sequential=True),
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


def train(model_dir: Path, rows: list[dict], case: Case, steps: int, seed: int, out: Path, probe: list[dict],
          validation: list[dict] | None) -> dict:
    """One Trainer run (logging every step): its per-step losses, the probe loss of the weights before the first
    step and after every step, and the validation losses every EVAL_STEPS."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if case.method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    batch = collate(probe)
    run: dict = {"losses": [], "probes": [], "evals": [], "firsts": []}
    first: list[dict] = []  # the rows of the first optimizer step, as the trainer keeps them (FirstStepRows)

    def measure(rows: dict) -> float:
        with torch.no_grad():
            was = model.training
            model.eval()
            value = float(model(**rows).loss)
            model.train(was)
        return value if math.isfinite(value) else 1e30

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            run["probes"].append(measure(batch))
            run["firsts"].append(measure(first[0]))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and "train_loss" not in logs:
                run["losses"].append(float(logs["loss"]))
            if logs and "eval_loss" in logs:
                run["evals"].append([state.global_step, float(logs["eval_loss"])])

    run["probes"].append(measure(batch))
    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=case.batch,
                             learning_rate=case.lr, lr_scheduler_type=case.schedule, warmup_steps=case.warmup,
                             logging_steps=1, logging_first_step=True, save_strategy="no", report_to=[], seed=seed,
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                             eval_strategy="steps" if validation else "no", eval_steps=EVAL_STEPS,
                             train_sampling_strategy="sequential" if case.sequential or case.easy_first else "random")
    class Keeping(Trainer):
        def training_step(self, model, inputs, *rest, **kwargs):
            if not first:
                first.append(dict(inputs))
                run["firsts"].append(measure(first[0]))  # before the first step
            return super().training_step(model, inputs, *rest, **kwargs)

    trainer = Keeping(model=model, args=args, train_dataset=rows, eval_dataset=validation, data_collator=collate,
                      callbacks=[Record()])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return run


def logged(per_step: list[float], every: int, after: int = 0) -> list[tuple[int, float]]:
    """(step, loss) as the Trainer logs the steps after `after` (a resume) with loggingSteps `every`: step 1, each
    multiple of `every` and the last step (the guard asks for it), each the mean of the steps since the last log."""
    out, since = [], after
    for step in range(after + 1, len(per_step) + 1):
        if step == 1 or step % every == 0 or step == len(per_step):
            out.append((step, statistics.fmean(per_step[since:step])))
            since = step
    return out


def guard(points: list[tuple[int, float]], evals: list, run: dict, history: list[dict] = (),
          saved: tuple[int, ...] = (), start: int = 0) -> dict:
    """Our DivergenceWatch, fed as the Trainer feeds it (after `history`, the logs of the run a resume continues):
    its verdict (stopped at a step by patience, failed at the end, or succeeded), warnings and named checkpoint.
    The first step's rows measured again are the run's (a resumed process would measure its own first rows)."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    warnings: list[str] = []
    state, control = TrainerState(), TrainerControl()
    watch = DivergenceWatch(DivergencePolicy(), lambda reason, _msg: warnings.append(reason), run["vocab"],
                            lambda: FirstRows(now=run["firsts"][state.global_step], then=run["firsts"][0]))
    state.log_history = [dict(entry) for entry in history]
    state.global_step = start  # a resumed run starts at its checkpoint's step
    watch.on_train_begin(SimpleNamespace(logging_strategy="steps"), state, control)
    saves, end = list(saved), points[-1][0]
    pending = sorted(evals)
    for step, loss in points:
        for save_step in range(state.global_step + 1, step + 1):  # each step's save, as on_step_end sees it
            state.global_step = save_step
            control.should_save = save_step % SAVE_STEPS == 0 or save_step == end
            if save_step < step:
                watch.on_step_end(None, state, control)
                if control.should_save:
                    saves.append(save_step)
        watch.on_step_end(None, state, control)
        state.log_history.append({"loss": loss, "step": step})
        watch.on_log(None, state, control, logs={"loss": loss})
        while pending and pending[0][0] <= step:
            watch.on_log(None, state, control, logs={"eval_loss": pending.pop(0)[1]})
        if control.should_save:
            saves.append(step)
        if control.should_training_stop:
            break
    else:
        watch.judge_end(end)
    named = None
    if watch.diverged_at is not None:
        named = max((s for s in saves if s <= watch.last_good_step and watch.kept_good(s)), default=None)
    return {"stop": watch.diverged_at, "atEnd": watch.diverged_at == end and not control.should_training_stop,
            "warnings": warnings, "named": named, "saves": saves, "history": state.log_history}


def diverged(run: dict, step: int) -> bool:
    """The truth: the probe loss of the weights after `step` steps is above the guard's threshold on the probe."""
    start = min(run["probes"][0], math.log(run["vocab"]))
    return run["probes"][step] > max(3 * start, start + 3)


def judge(run: dict) -> dict:
    """Every (length, loggingSteps) verdict of one run, and its resumes, against the truth."""
    steps = len(run["losses"])
    lengths = [n for n in LENGTHS if n < steps and run["constant"]] + [steps]
    run["verdicts"] = []
    for length in lengths:
        per_step = run["losses"][:length]
        evals = [e for e in run["evals"] if e[0] <= length]
        for every in EVERY:
            points = logged(per_step, every)
            verdict = {"length": length, "every": every, **guard(points, evals, run)}
            stop = verdict["stop"]
            verdict["falsePositive"] = stop is not None and not diverged(run, stop)
            verdict["falseNegative"] = stop is None and diverged(run, length)
            verdict["badNamed"] = verdict["named"] is not None and diverged(run, verdict["named"])
            if length == steps and every in (1, 5):
                verdict["resumes"] = resumes(run, per_step, every, evals, verdict)
            del verdict["history"]
            run["verdicts"].append(verdict)
    return run


def resumes(run: dict, per_step: list[float], every: int, evals: list, whole: dict) -> list[dict]:
    """The run resumed from each of its checkpoints in RESUMES: the same verdict, a good named checkpoint."""
    out = []
    for at in RESUMES:
        if at not in whole["saves"] or (whole["stop"] is not None and at >= whole["stop"]):
            continue  # no checkpoint there (held back in a spike, or after the stop)
        history = [h for h in whole["history"] if h["step"] <= at]  # what checkpoint-`at` holds
        rest = logged(per_step, every, after=at)
        verdict = guard(rest, [e for e in evals if e[0] > at], run, history,
                        tuple(s for s in whole["saves"] if s <= at), start=at)
        out.append({"at": at, "stop": verdict["stop"], "same": verdict["stop"] == whole["stop"],
                    "badNamed": verdict["named"] is not None and diverged(run, verdict["named"])})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seeds", type=int, default=5, help="seeds per healthy case (diverging cases: 2)")
    parser.add_argument("--json", type=Path, help="write every trajectory and verdict here")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--replay", type=Path, help="judge the trajectories of an earlier --json again, no training "
                        "(e.g. after changing the guard)")
    opts = parser.parse_args()
    if opts.replay:
        results = [judge(run) for run in json.loads(opts.replay.read_text())]
        report(results)
        if opts.json:
            opts.json.write_text(json.dumps(results))
        return
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    work = Path(tempfile.mkdtemp(prefix="divergence-guard-"))
    fresh = build_tiny_model(work / "fresh")
    tokenizer = AutoTokenizer.from_pretrained(fresh)
    vocab = json.loads((fresh / "config.json").read_text())["vocab_size"]
    known_rows = tokenized(tokenizer, sentences(random.Random(0), 16))
    new_rows = tokenized(tokenizer, sentences(random.Random(1), 400))
    unseen_rows = tokenized(tokenizer, unseen(random.Random(2), 400))
    validation = tokenized(tokenizer, unseen(random.Random(3), 16))
    memo = memorise(fresh, tokenizer, known_rows, work / "memorised")
    results, raw = [], []
    for case in (c for c in CASES if opts.only in c.name):
        for seed in range(opts.seeds if case.healthy else 2):
            rows = run_rows(case, seed, known_rows, new_rows, unseen_rows)
            probe = random.Random(200 + seed).sample(rows, 32)
            run = train(memo if case.start == "memorised" else fresh, rows, case, opts.steps, seed,
                        work / f"run-{len(results)}", probe, validation if case.validation else None)
            raw.append({"case": case.name, "healthy": case.healthy, "seed": seed, "vocab": vocab,
                        "constant": case.schedule == "constant", **run})
            if opts.json:  # the trajectories so far: --replay judges them should a later run fail
                opts.json.write_text(json.dumps(raw))
            results.append(judge(dict(raw[-1])))
            long = [v for v in results[-1]["verdicts"] if v["length"] == opts.steps]
            print(f"{case.name} seed {seed}: loss first {run['losses'][0]:.3f} last {run['losses'][-1]:.3f} max "
                  f"{max(run['losses']):.1f}; probe {run['probes'][0]:.2f} -> {run['probes'][-1]:.2f}; guard at "
                  f"{opts.steps} steps: {', '.join(str(v['stop']) for v in long)} (loggingSteps {EVERY})", flush=True)
    report(results)
    if opts.json:
        opts.json.write_text(json.dumps(results))


def memorise(fresh: Path, tokenizer, known_rows: list[dict], directory: Path) -> Path:
    """The fresh model trained on the known rows until it reproduces them (loss near 0)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(fresh, dtype=torch.float32)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = collate(known_rows)
    for _ in range(300):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    print(f"memorised model: loss on its {len(known_rows)} rows {loss.item():.4f}", flush=True)
    return directory


def run_rows(case: Case, seed: int, known_rows: list[dict], new_rows: list[dict], unseen_rows: list[dict]
             ) -> list[dict]:
    """A case's training rows, in the order the Trainer reads them when the order is fixed."""
    rng = random.Random(100 + seed)
    rows = list(unseen_rows if case.start == "memorised" else new_rows)
    rng.shuffle(rows)
    known = [known_rows[i % len(known_rows)] for i in range(int(len(rows) * case.known / (1 - case.known)))]
    if case.sequential:
        return known + rows
    rows += known
    rng.shuffle(rows)
    return known_rows[:case.batch] + rows if case.easy_first else rows


def report(results: list[dict]) -> None:
    print("\n| case | runs | judged (lengths x loggingSteps) | stopped by patience (steps) | failed at the end | "
          "Succeeded | warnings | false positives | false negatives |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(r["case"] for r in results):
        runs = [r for r in results if r["case"] == name]
        verdicts = [v for r in runs for v in r["verdicts"]]
        stopped = [v["stop"] for v in verdicts if v["stop"] is not None and not v["atEnd"]]
        span = f" ({min(stopped)}-{max(stopped)})" if stopped else ""
        warned = sorted({w for v in verdicts for w in v["warnings"]})
        print(f"| {name} | {len(runs)} | {len(verdicts)} | {len(stopped)}{span} | {sum(v['atEnd'] for v in verdicts)} "
              f"| {sum(v['stop'] is None for v in verdicts)} | {', '.join(warned) or '-'} | "
              f"{sum(v['falsePositive'] for v in verdicts)} | {sum(v['falseNegative'] for v in verdicts)} |")
    verdicts = [v for r in results for v in r["verdicts"]]
    resumed = [x for v in verdicts for x in v.get("resumes", [])]
    print(f"\njudged: {len(verdicts)} (run, length, loggingSteps); false positives "
          f"{sum(v['falsePositive'] for v in verdicts)}, false negatives {sum(v['falseNegative'] for v in verdicts)}; "
          f"named checkpoints that hold diverged weights {sum(v['badNamed'] for v in verdicts)}")
    print(f"resumed: {len(resumed)}; verdict other than the uninterrupted run's {sum(not x['same'] for x in resumed)}; "
          f"named checkpoints that hold diverged weights {sum(x['badNamed'] for x in resumed)}")
    for name in ("lr 10, full", "lr 1, full"):
        for every in EVERY:
            stops = [v["stop"] for r in results if r["case"] == name for v in r["verdicts"]
                     if v["every"] == every and v["length"] == len(r["losses"])]
            print(f"price, {name}, loggingSteps {every}: stopped at steps {stops}")


if __name__ == "__main__":
    main()
