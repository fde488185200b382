"""Useful (non-padding) tokens/s of our entrypoint, packed and unpacked, against a plain HF Trainer with
DataCollatorForSeq2Seq padding: same tiny model, same data, same steps, measured in the same run.

The data has long-tailed answer lengths, as real SFT data does; padding to the longest sample in each batch wastes
most of the compute, packing (padding-free, per-sample position ids) wastes none. The unpacked run shows that our
pipeline trains like the baseline (same loss); the packed one that packing changes speed, not the loss.
Usage: .venv/bin/python benchmarks/packing_throughput.py [--steps 20]
       .venv/bin/python benchmarks/packing_throughput.py --gpu   # ~1B Llama, bf16: adds tokens/s/GPU, MFU, memory
"""

import argparse
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

from finetune_trainer.tiny_model import build_tiny_model  # noqa: E402
from tests.builders import make_job  # noqa: E402
from tests.support.trainer_run import run_nodes  # noqa: E402

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and", "the", "sky", "is", "blue",
         "on", "a", "clear", "day"]


@dataclass(frozen=True)
class Profile:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int
    max_length: int
    words_cap: int
    sigma: float
    gpu: bool


CPU = Profile(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=512, batch=8, max_length=512,
              words_cap=350, sigma=0.9, gpu=False)
# ~1.1B parameters, Llama-3.2-1B-like shape; the tokenizer is the tiny one (ids stay below the vocabulary).
GPU = Profile(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=32000, batch=8, max_length=2048,
              words_cap=1500, sigma=1.1, gpu=True)


def dataset(rows: int, seed: int, profile: Profile) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        n = min(int(rng.lognormvariate(3.0 + 2 * profile.gpu, profile.sigma)), profile.words_cap)  # long-tailed
        out.append({"instruction": f"Write {n} words, number {i}.", "output": " ".join(rng.choices(WORDS, k=n))})
    return out


def spec(model_dir: Path, rows: list, steps: int, packing: bool, profile: Profile) -> dict:
    return make_job({
        "metadata.name": "bench",
        "spec.model": {"name": str(model_dir), "dtype": "bfloat16" if profile.gpu else "float32"},
        "spec.data": {"format": "alpaca", "maxLength": profile.max_length, "packing": packing,
                      "train": [{"inline": rows}]},
        "spec.method": {"type": "full"},
        "spec.training": {"maxSteps": steps, "perDeviceTrainBatchSize": profile.batch, "learningRate": 0.001,
                          "precision": "bf16" if profile.gpu else "fp32",
                          "optim": "adamw_torch_fused" if profile.gpu else "adamw_torch", "loggingSteps": 5,
                          "seed": 3},
        "spec.distributed": {"numNodes": 1, "gpusPerNode": 1 if profile.gpu else 0},
        "spec.checkpoints": {"saveStrategy": "no"},
    })


def ours(model_dir: Path, rows: list, steps: int, packing: bool, work: Path, profile: Profile) -> dict:
    (result,) = run_nodes(spec(model_dir, rows, steps, packing, profile), work)
    if result.returncode != 0:
        raise SystemExit(result.log[-3000:])
    s = result.summary
    return {"seconds": s["trainRuntimeSeconds"], "loss": s["trainLoss"], "peak": s.get("peakMemoryGiB")}


def baseline(model_dir: Path, rows: list, steps: int, work: Path, profile: Profile) -> dict:
    """A plain Trainer: same tokenized samples, DataCollatorForSeq2Seq padding, same arguments, one thread."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.data import tokenize

    torch.set_num_threads(1)  # our runs use OMP_NUM_THREADS=1; the same budget for the baseline
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.eos_token
    data_spec = FineTuneJobSpec.model_validate(spec(model_dir, rows, steps, False, profile)["spec"]).data
    examples = list(tokenize(rows, data_spec, tokenizer)[0])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="bfloat16" if profile.gpu else "float32")
    model.config.use_cache = False
    if profile.gpu:
        torch.cuda.reset_peak_memory_stats()
    args = TrainingArguments(output_dir=str(work / "baseline"), max_steps=steps,
                             per_device_train_batch_size=profile.batch, learning_rate=0.001,
                             optim="adamw_torch_fused" if profile.gpu else "adamw_torch", lr_scheduler_type="cosine",
                             seed=3, use_cpu=not profile.gpu, bf16=profile.gpu, report_to=[], save_strategy="no",
                             logging_steps=5, remove_unused_columns=False, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(examples),
                      data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100))
    result = trainer.train()
    collate = trainer.data_collator
    order = list(trainer._get_train_sampler(trainer.train_dataset))
    b = profile.batch
    padded = sum(collate([examples[i] for i in order[j:j + b]])["input_ids"].numel() for j in range(0, len(order), b))
    peak = torch.cuda.max_memory_allocated() / 2**30 if profile.gpu else None
    return {"seconds": result.metrics["train_runtime"], "loss": result.training_loss, "tokens_padded": padded,
            "peak": peak}


def sample_lengths(model_dir: Path, rows: list, steps: int, profile: Profile) -> list[int]:
    from transformers import AutoTokenizer

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.data import tokenize

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data_spec = FineTuneJobSpec.model_validate(spec(model_dir, rows, steps, False, profile)["spec"]).data
    examples = list(tokenize(rows, data_spec, tokenizer)[0])
    return [len(e["input_ids"]) for e in examples]


def training_flops_per_token(profile: Profile, mean_length: float) -> float:
    """6 x parameters (forward + backward) plus causal attention: 6 x layers x hidden x mean length."""
    h, layers = profile.hidden, profile.layers
    kv = h * profile.kv_heads // profile.heads
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * profile.intermediate  # q, o, k, v projections and the SwiGLU MLP
    params = layers * per_layer + 2 * profile.vocab * h  # embeddings and the untied head
    return 6 * params + 6 * layers * h * mean_length


def peak_flops() -> float | None:
    """The trainer's own datasheet table (dense bf16), so the benchmark and status.progress.mfu agree."""
    import torch

    from finetune_trainer.training.throughput import peak_flops as device_peak

    return device_peak(torch.cuda.get_device_name() if torch.cuda.is_available() else None, "bf16")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--gpu", action="store_true", help="~1B Llama in bf16 on one GPU")
    args = parser.parse_args()
    profile = GPU if args.gpu else CPU
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build_tiny_model(work / "model", layers=profile.layers, hidden=profile.hidden,
                                     heads=profile.heads, kv_heads=profile.kv_heads, intermediate=profile.intermediate,
                                     vocab_size=profile.vocab, max_positions=2 * profile.max_length)
        rows = dataset(args.steps * profile.batch, seed=0, profile=profile)
        # Our runs first: on a GPU the in-process baseline would otherwise hold memory while they run.
        unpacked = ours(model_dir, rows, args.steps, False, work / "unpacked", profile)
        packed = ours(model_dir, rows, args.steps, True, work / "packed", profile)
        runs = {"HF Trainer + Seq2Seq padding": baseline(model_dir, rows, args.steps, work, profile),
                "ours, unpacked": unpacked, "ours, packed": packed}
        lengths = sample_lengths(model_dir, rows, args.steps, profile)
    # steps x batch == rows: every run consumes every sample exactly once, so the useful tokens are the same for all
    # (counted here: the Trainer's "non_padding" count skips EOS tokens when pad == eos).
    useful = sum(lengths)
    base_rate = useful / runs["HF Trainer + Seq2Seq padding"]["seconds"]
    print(f"{len(lengths)} samples, {useful} useful tokens; lengths median {sorted(lengths)[len(lengths) // 2]}, "
          f"max {max(lengths)}")
    flops, peak = training_flops_per_token(profile, useful / len(lengths)), peak_flops() if profile.gpu else None
    print(f"{'run':<30}{'seconds':>9}{'useful tokens/s':>17}{'vs baseline':>13}{'train loss':>12}"
          + (f"{'MFU':>8}{'peak GiB':>10}" if profile.gpu else ""))
    for name, r in runs.items():
        rate = useful / r["seconds"]
        line = f"{name:<30}{r['seconds']:>9.2f}{rate:>17.0f}{rate / base_rate:>12.2f}x{r['loss']:>12.4f}"
        if profile.gpu:
            mfu = f"{rate * flops / peak:.1%}" if peak else "n/a"
            line += f"{mfu:>8}{r['peak'] or 0:>10.1f}"
        print(line)
    padded = runs['HF Trainer + Seq2Seq padding']['tokens_padded']
    print(f"padded tokens in the baseline's batches (estimate: the sampler re-drawn; pad to longest, batch 8): {padded}"
          f" ({runs['HF Trainer + Seq2Seq padding']['tokens_padded'] / useful:.2f}x the useful tokens)")


if __name__ == "__main__":
    main()
