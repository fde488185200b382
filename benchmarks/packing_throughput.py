"""Useful (non-padding) tokens/s of our entrypoint, packed and unpacked, against a plain HF Trainer with
DataCollatorForSeq2Seq padding: same tiny model, same data, same steps, measured in the same run.

The data has long-tailed answer lengths, as real SFT data does; padding to the longest sample in each batch wastes
most of the compute, packing (padding-free, per-sample position ids) wastes none. The unpacked run shows that our
pipeline trains like the baseline (same loss); the packed one that packing changes speed, not the loss.
Usage: .venv/bin/python benchmarks/packing_throughput.py [--steps 20]
"""

import argparse
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

from tests.builders import make_job  # noqa: E402
from tests.fixtures.tiny_model import build_tiny_model  # noqa: E402
from tests.support.trainer_run import run_nodes  # noqa: E402

WORDS = "the quick brown fox jumps over the lazy dog and the sky is blue on a clear day".split()


def dataset(rows: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        n = min(int(rng.lognormvariate(3.0, 0.9)), 350)  # median ~20 words, a long tail up to 350
        out.append({"instruction": f"Write {n} words, number {i}.", "output": " ".join(rng.choices(WORDS, k=n))})
    return out


def spec(model_dir: Path, rows: list, steps: int, packing: bool) -> dict:
    return make_job({
        "metadata.name": "bench",
        "spec.model": {"name": str(model_dir), "dtype": "float32"},
        "spec.data": {"format": "alpaca", "maxLength": 512, "packing": packing, "train": [{"inline": rows}]},
        "spec.method": {"type": "full"},
        "spec.training": {"maxSteps": steps, "perDeviceTrainBatchSize": 8, "learningRate": 0.001,
                          "precision": "fp32", "optim": "adamw_torch", "loggingSteps": 5, "seed": 3},
        "spec.distributed": {"numNodes": 1, "gpusPerNode": 0},
        "spec.checkpoints": {"saveStrategy": "no"},
    })


def ours(model_dir: Path, rows: list, steps: int, packing: bool, work: Path) -> dict:
    (result,) = run_nodes(spec(model_dir, rows, steps, packing), work)
    if result.returncode != 0:
        raise SystemExit(result.log[-3000:])
    s = result.summary
    return {"seconds": s["trainRuntimeSeconds"], "loss": s["trainLoss"]}


def baseline(model_dir: Path, rows: list, steps: int, work: Path) -> dict:
    """A plain Trainer: same tokenized samples, DataCollatorForSeq2Seq padding, same arguments, one thread."""
    import datasets
    import torch
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer,
                              TrainingArguments)

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.data import tokenize_sft

    torch.set_num_threads(1)  # our runs use OMP_NUM_THREADS=1; the same budget for the baseline
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.eos_token
    data_spec = FineTuneJobSpec.model_validate(spec(model_dir, rows, steps, False)["spec"]).data
    examples, _ = tokenize_sft(rows, data_spec, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    model.config.use_cache = False
    args = TrainingArguments(output_dir=str(work / "baseline"), max_steps=steps, per_device_train_batch_size=8,
                             learning_rate=0.001, optim="adamw_torch", lr_scheduler_type="cosine", seed=3,
                             use_cpu=True, report_to=[], save_strategy="no", logging_steps=5,
                             remove_unused_columns=False, include_num_input_tokens_seen="non_padding",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(examples),
                      data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100))
    result = trainer.train()
    collate = trainer.data_collator
    order = list(trainer._get_train_sampler(trainer.train_dataset))
    padded = sum(collate([examples[i] for i in order[b:b + 8]])["input_ids"].numel() for b in range(0, len(order), 8))
    return {"seconds": result.metrics["train_runtime"], "loss": result.training_loss, "tokens_padded": padded}


def sample_lengths(model_dir: Path, rows: list, steps: int) -> list[int]:
    from transformers import AutoTokenizer

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.data import tokenize_sft

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data_spec = FineTuneJobSpec.model_validate(spec(model_dir, rows, steps, False)["spec"]).data
    examples, _ = tokenize_sft(rows, data_spec, tokenizer)
    return [len(e["input_ids"]) for e in examples]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build_tiny_model(work / "model", layers=4, hidden=256)
        rows = dataset(args.steps * 8, seed=0)
        runs = {
            "HF Trainer + Seq2Seq padding": baseline(model_dir, rows, args.steps, work),
            "ours, unpacked": ours(model_dir, rows, args.steps, False, work / "unpacked"),
            "ours, packed": ours(model_dir, rows, args.steps, True, work / "packed"),
        }
        lengths = sample_lengths(model_dir, rows, args.steps)
    # steps x batch == rows: every run consumes every sample exactly once, so the useful tokens are the same for all
    # (counted here: the Trainer's "non_padding" count skips EOS tokens when pad == eos).
    useful = sum(lengths)
    base_rate = useful / runs["HF Trainer + Seq2Seq padding"]["seconds"]
    print(f"{len(lengths)} samples, {useful} useful tokens; lengths median {sorted(lengths)[len(lengths) // 2]}, "
          f"max {max(lengths)}")
    print(f"{'run':<30}{'seconds':>9}{'useful tokens/s':>17}{'vs baseline':>13}{'train loss':>12}")
    for name, r in runs.items():
        rate = useful / r["seconds"]
        print(f"{name:<30}{r['seconds']:>9.2f}{rate:>17.0f}{rate / base_rate:>12.2f}x{r['loss']:>12.4f}")
    print(f"padded tokens in the baseline's batches (estimate: the sampler re-drawn; pad to longest, batch 8): {runs['HF Trainer + Seq2Seq padding']['tokens_padded']}"
          f" ({runs['HF Trainer + Seq2Seq padding']['tokens_padded'] / useful:.2f}x the useful tokens)")


if __name__ == "__main__":
    main()
