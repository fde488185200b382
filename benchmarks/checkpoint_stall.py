"""How long training stands still for a checkpoint: the synchronous save (checkpoints.overlap: false, the Trainer's
own) against the overlapped one (a host-memory snapshot, written in the background), the same model and data in
one run; prints figures.

Each checkpoint's marker records its stall (the training loop's wait) and its save time (until it was complete on
the output volume). A small Llama on CPU, one process, as `finetune run` runs it: a full fine-tune (weights and
Adam's states: ~3x the weights per checkpoint) and LoRA (the adapter and its states).
--threads: the training process's CPU threads (OMP_NUM_THREADS). With every core training (the default on this
2-core machine), the background write can only take cycles from the steps: a CPU-only node. With a core left
(--threads 1), the write runs beside the steps as it does on a GPU node, whose host cores idle while the GPUs
compute. --every: optimizer steps between checkpoints (a write that takes longer than the interval makes the next
save wait for it: that wait is stall too).
Usage: .venv/bin/python benchmarks/checkpoint_stall.py [--layers 6] [--hidden 512] [--vocab 16000] [--saves 3]
       [--threads 2] [--every 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

import yaml  # noqa: E402

from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.cli.local_run import start_nodes  # noqa: E402
from finetune_trainer.outputs.checkpoints import COMPLETE_MARKER  # noqa: E402
from finetune_trainer.tiny_model import build_tiny_model  # noqa: E402


def job(model: Path, method: str, overlap: bool, saves: int, every: int) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-sft.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["name"] = str(model)
    spec["method"] = {"type": method}
    spec["training"].update(maxSteps=every * saves, learningRate=1e-4, loggingSteps=1)
    spec["checkpoints"] = {"saveSteps": every, "keep": saves + 1, "overlap": overlap}
    return doc


def run(model: Path, work: Path, method: str, overlap: bool, saves: int, every: int, threads: int) -> dict:
    started = time.monotonic()
    env = {"OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")])}
    nodes = start_nodes(validate_job(job(model, method, overlap, saves, every)), work, extra_env=env)
    codes = [n.process.wait() for n in nodes]
    if codes != [0]:
        raise RuntimeError(f"the run exited {codes}: see {work / 'logs'}")
    markers = [json.loads(p.read_text()) for p in sorted((work / "output").glob(f"checkpoint-*/{COMPLETE_MARKER}"))]
    return {"stalls": [m["stallSeconds"] for m in markers], "saves": [m["saveSeconds"] for m in markers],
            "bytes": markers[-1]["bytes"], "wall": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=["full", "lora"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckpt-stall-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "model", layers=args.layers, hidden=args.hidden, heads=8, kv_heads=4,
                                 intermediate=args.hidden * 8 // 3, vocab_size=args.vocab)
        results = {method: {mode: run(model, work / f"{method}-{mode}", method, mode == "overlapped", args.saves,
                                      args.every, args.threads)
                            for mode in ("synchronous", "overlapped")} for method in args.methods}
    for method, modes in results.items():
        sync, over = (statistics.median(modes[m]["stalls"]) for m in ("synchronous", "overlapped"))
        modes["ratio"] = over / sync
        print(f"{method}: checkpoint of {modes['synchronous']['bytes'] / 2**20:.1f} MiB of weights (+ optimizer "
              f"states), {args.saves} saves each, one every {args.every} steps, {args.threads} training thread(s)")
        for mode in ("synchronous", "overlapped"):
            r = modes[mode]
            print(f"  {mode:12s} stall per save: median {statistics.median(r['stalls']):.3f} s "
                  f"(each: {', '.join(f'{s:.3f}' for s in r['stalls'])}); save until complete: median "
                  f"{statistics.median(r['saves']):.3f} s; run wall {r['wall']:.1f} s")
        print(f"  overlapped stall / synchronous stall: {over / sync:.1%}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
