"""Tokenization at real data sizes: ours against a run_clm-style `datasets.map(num_proc)` baseline and TRL's SFT
preprocessing, on the same files, tokenizer and worker count, in one run; prints rows/s, peak RSS and ratios.

Data (generated, deterministic): --rows multi-turn conversations (messages format, system prompt, 1-4 turns) as
JSONL, and --text-mb of documents (JSONL `text` rows of prose and code, several paragraphs each). Tokenizer: the
tiny BPE trained locally (no download) wearing Qwen2.5's chat template as TRL ships it.

Each method runs in a fresh process with a fresh datasets cache, so nothing is reused between them; peak RSS is
the whole process tree's (workers included), sampled every 0.1 s.
- ours: finetune_trainer.data.prepare (render + one tokenization per conversation, labels from character spans,
  file/row provenance, the cached arrow dataset written) -- or, for text, documents + EOS cut into blocks.
- run_clm-style: load_dataset("json") + map(batched, num_proc): chat rendered with apply_chat_template and
  tokenized (no labels); text tokenized and grouped into blocks (transformers' run_clm.py group_texts).
- TRL: SFTTrainer's dataset preparation (assistant_only_loss with TRL's training template; text with packing).

Usage: .venv/bin/python benchmarks/tokenization.py [--rows 200000] [--text-mb 200] [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "rain", "falls", "on", "the",
         "grey", "city", "and", "models", "learn", "to", "answer", "questions", "about", "colours", "numbers",
         "animals", "and", "code"]
METHODS = ("ours", "run_clm", "trl")
MAX_LENGTH = 2048
BLOCK = 1024


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def write_chat(path: Path, rows: int) -> None:
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(rows):
            messages = [{"role": "system", "content": sentence(rng, 6)}]
            for _ in range(rng.randint(1, 4)):
                messages += [{"role": "user", "content": sentence(rng, rng.randint(5, 30))},
                             {"role": "assistant", "content": " ".join(sentence(rng, rng.randint(5, 25))
                                                                       for _ in range(rng.randint(1, 4)))}]
            f.write(json.dumps({"messages": messages}) + "\n")


def write_text(path: Path, megabytes: int) -> int:
    rng = random.Random(1)
    written, docs = 0, 0
    with path.open("w") as f:
        while written < megabytes * 2**20:
            if rng.random() < 0.3:
                body = "\n".join(f"def f{i}(x):\n    return x * {i}  # {sentence(rng, 4)}\n"
                                 for i in range(rng.randint(3, 30)))
            else:
                body = "\n\n".join(" ".join(sentence(rng, rng.randint(6, 20)) for _ in range(rng.randint(2, 8)))
                                   for _ in range(rng.randint(2, 12)))
            line = json.dumps({"text": body}) + "\n"
            f.write(line)
            written, docs = written + len(line), docs + 1
    return docs


def build_tokenizer(work: Path) -> Path:
    from transformers import AutoTokenizer

    from finetune_trainer.tiny_model import build_tiny_model
    from tests.support.chat_templates import tokenizer_for, trl_template

    model = build_tiny_model(work / "model")
    tokenizer = tokenizer_for(AutoTokenizer.from_pretrained(model), trl_template("qwen2_5"), "qwen2.5-template")
    tokenizer.save_pretrained(model)
    return model


# --- one measurement, in its own process ------------------------------------------------------------------------
def measure(method: str, kind: str, data: Path, model: Path, workers: int, work: Path) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.pad_token = tokenizer.eos_token
    started = time.perf_counter()
    rows = globals()[f"run_{method}"](kind, data, tokenizer, model, workers, work)
    return {"seconds": time.perf_counter() - started, "rows": rows}


def run_ours(kind, data, tokenizer, model, workers, work) -> int:
    from finetune_operator.api.data import DataSpec
    from finetune_trainer.data import prepare

    spec = {"format": "messages", "maxLength": MAX_LENGTH} if kind == "chat" else {"format": "text",
                                                                                    "blockSize": BLOCK}
    prepared = prepare(DataSpec.model_validate({**spec, "train": [{"path": str(data)}],
                                                "preprocessingWorkers": workers}), tokenizer, work / "cache", 0)
    return prepared.stats["train"]["rows"]


def run_run_clm(kind, data, tokenizer, model, workers, work) -> int:
    import datasets

    rows = datasets.load_dataset("json", data_files=str(data), split="train")
    if kind == "chat":
        def tokenize(batch):
            texts = tokenizer.apply_chat_template(batch["messages"], tokenize=False)
            return tokenizer(texts, add_special_tokens=False, truncation=True, max_length=MAX_LENGTH)
        rows.map(tokenize, batched=True, num_proc=workers if workers > 1 else None, remove_columns=["messages"])
        return len(rows)

    def tokenize_text(batch):
        return tokenizer(batch["text"])

    def group_texts(examples):  # transformers/examples/pytorch/language-modeling/run_clm.py
        concatenated = {k: sum(examples[k], []) for k in examples}
        total = len(concatenated["input_ids"]) // BLOCK * BLOCK
        return {k: [t[i: i + BLOCK] for i in range(0, total, BLOCK)] for k, t in concatenated.items()}

    tokenized = rows.map(tokenize_text, batched=True, num_proc=workers if workers > 1 else None,
                         remove_columns=["text"])
    tokenized.map(group_texts, batched=True, num_proc=workers if workers > 1 else None)
    return len(rows)


def run_trl(kind, data, tokenizer, model, workers, work) -> int:
    import datasets
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer
    from trl.chat_template_utils import get_training_chat_template

    rows = datasets.load_dataset("json", data_files=str(data), split="train")
    if kind == "chat":
        tokenizer.chat_template = get_training_chat_template(tokenizer) or tokenizer.chat_template
        config = SFTConfig(output_dir=str(work / "trl"), dataset_num_proc=workers, max_length=MAX_LENGTH,
                           assistant_only_loss=True, report_to=[], use_cpu=True)
    else:
        config = SFTConfig(output_dir=str(work / "trl"), dataset_num_proc=workers, max_length=BLOCK, packing=True,
                           dataset_text_field="text", report_to=[], use_cpu=True)
    SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model), args=config, train_dataset=rows,
               processing_class=tokenizer)
    return len(rows)


# --- the driver -----------------------------------------------------------------------------------------------
def peak_rss_of(process: subprocess.Popen) -> tuple[int, float]:
    import psutil

    peak = 0.0
    root = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()) / 2**20)
        except psutil.Error:
            pass
        time.sleep(0.1)
    return process.returncode, peak


def run_one(method: str, kind: str, data: Path, model: Path, workers: int, work: Path) -> dict:
    cache = Path(tempfile.mkdtemp(dir=work, prefix=f"{method}-{kind}-"))
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache / "hf"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, __file__, "--measure", method, "--kind", kind, "--data", str(data), "--model", str(model),
            "--workers", str(workers), "--work", str(cache)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    holder: dict[str, str] = {}
    reader = threading.Thread(target=lambda: holder.update(out=proc.stdout.read()))
    reader.start()
    code, peak = peak_rss_of(proc)
    reader.join()
    if code != 0:
        raise SystemExit(f"{method} {kind} failed ({code})")
    result = json.loads(holder["out"].strip().splitlines()[-1])
    return {**result, "peakRssMiB": round(peak), "rowsPerSecond": result["rows"] / result["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--text-mb", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kinds", default="chat,text", help="which data to run: chat, text or both")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--measure", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=("chat", "text"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.kind, args.data, args.model, args.workers, args.work)))
        return
    with tempfile.TemporaryDirectory(prefix="tokenization-bench-") as tmp:
        work = Path(tmp)
        model = build_tokenizer(work)
        chat, text = work / "chat.jsonl", work / "corpus.jsonl"
        write_chat(chat, args.rows)
        documents = write_text(text, args.text_mb)
        print(f"data: {args.rows} conversations ({chat.stat().st_size / 2**20:.0f} MiB), {documents} documents "
              f"({text.stat().st_size / 2**20:.0f} MiB); {args.workers} worker(s); cpus: {os.cpu_count()}")
        figures: dict[str, dict[str, dict]] = {}
        for kind, data in (("chat", chat), ("text", text)):
            if kind not in args.kinds.split(","):
                continue
            figures[kind] = {m: run_one(m, kind, data, model, args.workers, work) for m in METHODS}
            base = figures[kind]["run_clm"]["rowsPerSecond"]
            print(f"\n{kind:<5}{'method':<10}{'rows/s':>10}{'seconds':>9}{'peak RSS MiB':>14}{'vs run_clm':>12}")
            for method, r in figures[kind].items():
                print(f"{'':<5}{method:<10}{r['rowsPerSecond']:>10.0f}{r['seconds']:>9.1f}{r['peakRssMiB']:>14}"
                      f"{r['rowsPerSecond'] / base:>11.2f}x")
        if args.out:
            args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
