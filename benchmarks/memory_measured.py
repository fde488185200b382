"""The memory fit estimate against what real training runs hold, on CPU: each case is `finetune run` (the README's
command: our trainer, transformers' Trainer, peft, DeepSpeed over gloo for the ZeRO cases) on a model built from a
small config of the architecture named, with every process's peak of live tensor bytes counted the way
torch.cuda.max_memory_allocated counts on a GPU (tests/support/peak_probe: a TorchDispatchMode that sees every op,
from the weights' loading on; its peak is reset when Trainer.train starts). Beside ours, DeepSpeed's own ZeRO
estimator (model states only) for the ZeRO cases.

A gate must not predict low: every case must come out at predicted / measured >= 1.00 and within 15% above
(`--check` exits 1 otherwise). Usage:
  .venv/bin/python benchmarks/memory_measured.py [--cases a,b] [--out FILE] [--work DIR] [--check]
(about 15 minutes on 2 cores for all cases; results: benchmarks/results/memory-measured-cpu.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.fit import GIB, ModelShape, estimate  # noqa: E402

PROBE = ROOT / "tests" / "support" / "peak_probe"
LOW, HIGH = 1.00, 1.15


@dataclass(frozen=True)
class Case:
    name: str
    architecture: str  # model_type
    shape: dict[str, Any]  # build_tiny_model's keywords
    spec: dict[str, Any]  # spec sections merged over the base job
    seq: int = 256
    steps: int = 3
    config: dict[str, Any] = field(default_factory=dict)  # extra config keys of the architecture


LLAMA = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "intermediate": 688, "vocab_size": 16000}
LLAMA_BIG = {"layers": 8, "hidden": 512, "heads": 8, "kv_heads": 4, "intermediate": 1376, "vocab_size": 32000}
WIDE_VOCAB = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "intermediate": 344, "vocab_size": 64000}
GEMMA2 = {"layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 768, "vocab_size": 16000}
GEMMA2_CONFIG = {"head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 128, "final_logit_softcapping": 30.0,
                 "attn_logit_softcapping": 50.0}
MIXTRAL = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "intermediate": 512, "vocab_size": 16000}
MIXTRAL_CONFIG = {"num_local_experts": 4, "num_experts_per_tok": 2}
QWEN3_MOE_CONFIG = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 384, "head_dim": 32}
FP32 = {"model": {"dtype": "float32"}, "training": {"precision": "fp32"}}
BF16 = {"model": {"dtype": "bfloat16"}, "training": {"precision": "bf16"}}
LORA = {"method": {"type": "lora", "lora": {"r": 16}}}
LORA_NODROP = {"method": {"type": "lora", "lora": {"r": 16, "dropout": 0.0}}}
DORA = {"method": {"type": "lora", "lora": {"r": 16, "useDora": True}}}
DORA_NODROP = {"method": {"type": "lora", "lora": {"r": 16, "dropout": 0.0, "useDora": True}}}
TWO = {"distributed": {"cpuProcessesPerNode": 2}}


def _ds(stage: int) -> dict:
    return {"distributed": {"cpuProcessesPerNode": 2, "strategy": "deepspeed", "deepspeed": {"zeroStage": stage}}}


def _merge(*parts: dict) -> dict:
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


CASES = [
    Case("llama full fp32", "llama", LLAMA, FP32, seq=512),
    Case("llama full bf16", "llama", LLAMA, BF16, seq=512),
    Case("llama 100M full fp32 short rows", "llama", LLAMA_BIG, FP32, seq=64),
    Case("llama full fp32 checkpointing", "llama", LLAMA, _merge(FP32, {"training": {"gradientCheckpointing": True}}),
         seq=512),
    Case("llama full fp32 accumulation 2", "llama", LLAMA,
         _merge(FP32, {"training": {"gradientAccumulationSteps": 2}})),
    Case("llama full bf16 adamw_torch", "llama", LLAMA, _merge(BF16, {"training": {"optim": "adamw_torch"}})),
    Case("llama freeze 2 layers bf16", "llama", LLAMA, _merge(BF16, {"method": {"type": "freeze"}})),
    Case("llama LoRA r16 bf16", "llama", LLAMA, _merge(BF16, LORA), seq=512),
    Case("llama LoRA r16 fp32 no dropout", "llama", LLAMA, _merge(FP32, LORA_NODROP), seq=512),
    Case("wide vocabulary LoRA bf16 modulesToSave embedding and head", "llama", WIDE_VOCAB,
         _merge(BF16, {"method": {"type": "lora", "lora": {"r": 16, "modulesToSave": ["embed_tokens", "lm_head"]}}})),
    Case("wide vocabulary freeze bf16 head trained", "llama", WIDE_VOCAB,
         _merge(BF16, {"method": {"type": "freeze", "freeze": {"trainableLayers": 1,
                                                               "extraTrainableModules": ["lm_head"]}}})),
    Case("llama DoRA r16 bf16", "llama", LLAMA, _merge(BF16, DORA), seq=512),
    Case("llama DoRA r16 fp32 no dropout", "llama", LLAMA, _merge(FP32, DORA_NODROP), seq=512),
    Case("llama 100M DoRA bf16 no dropout checkpointing", "llama", LLAMA_BIG,
         _merge(BF16, DORA_NODROP, {"training": {"gradientCheckpointing": True}}), seq=256),
    Case("llama 100M LoRA fp32 short rows", "llama", LLAMA_BIG, _merge(FP32, LORA), seq=64),
    Case("llama 100M DoRA fp32 short rows", "llama", LLAMA_BIG, _merge(FP32, DORA), seq=64),
    Case("wide vocabulary eval batch 8", "llama", WIDE_VOCAB,
         _merge(BF16, {"training": {"perDeviceEvalBatchSize": 8, "evalStrategy": "steps", "evalSteps": 2}}), seq=256),
    Case("qwen2 full bf16", "qwen2", LLAMA, BF16, seq=512),
    Case("gemma2 full bf16 eager", "gemma2", GEMMA2, _merge(BF16, {"model": {"attnImplementation": "eager"}}),
         config=GEMMA2_CONFIG),
    Case("mixtral full bf16", "mixtral", MIXTRAL, BF16, seq=512, config=MIXTRAL_CONFIG),
    Case("mixtral LoRA bf16 no dropout", "mixtral", MIXTRAL, _merge(BF16, LORA_NODROP), seq=512, config=MIXTRAL_CONFIG),
    Case("qwen3_moe LoRA bf16 no dropout", "qwen3_moe", MIXTRAL, _merge(BF16, LORA_NODROP), config=QWEN3_MOE_CONFIG),
    Case("DDP 2 processes full fp32", "llama", LLAMA, _merge(FP32, TWO)),
    Case("ZeRO-1 2 processes full bf16", "llama", LLAMA, _merge(BF16, _ds(1))),
    Case("ZeRO-2 2 processes full fp32", "llama", LLAMA, _merge(FP32, _ds(2))),
    Case("ZeRO-2 2 processes full bf16", "llama", LLAMA, _merge(BF16, _ds(2))),
    Case("ZeRO-3 2 processes full fp32", "llama", LLAMA, _merge(FP32, _ds(3))),
    Case("ZeRO-3 2 processes full bf16 wide vocabulary", "llama", WIDE_VOCAB, _merge(BF16, _ds(3))),
]


def model_dir(work: Path, case: Case) -> Path:
    from finetune_trainer.tiny_model import build_tiny_model

    dtype = (case.spec.get("model") or {}).get("dtype", "float32")
    key = "-".join([case.architecture, dtype, *(f"{k}{v}" for k, v in sorted({**case.shape, **case.config}.items()))])
    target = work / "models" / key
    if not (target / "config.json").exists():
        build_tiny_model(target, architecture=case.architecture, dtype=dtype, max_positions=4096,
                         **case.shape, **case.config)
    return target


def data_file(work: Path, documents: int = 400) -> Path:
    import random

    path = work / f"docs-{documents}.jsonl"
    if not path.exists():
        rng = random.Random(0)
        words = ["the", "model", "learns", "to", "answer", "questions", "about", "numbers", "colours", "animals",
                 "and", "code", "while", "rain", "falls", "on", "grey", "city", "a", "quick", "brown", "fox"]
        with path.open("w") as f:
            for _ in range(documents):
                f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(400))}) + "\n")
    return path


def job(case: Case, model: Path, data: Path, validation: Path) -> dict:
    spec = _merge({
        "model": {"name": str(model), "attnImplementation": "sdpa"},
        "data": {"format": "text", "blockSize": case.seq, "train": [{"path": str(data)}],
                 "validation": [{"path": str(validation)}]},
        "method": {"type": "full"},
        "training": {"maxSteps": case.steps, "perDeviceTrainBatchSize": 2, "loggingSteps": 1,
                     "learningRate": 1e-5},
        "distributed": {"numNodes": 1, "gpusPerNode": 0},
        "checkpoints": {"saveStrategy": "no"},
    }, case.spec)
    if spec["training"].get("evalStrategy") is None:
        spec["data"].pop("validation")
    return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": "memory"},
            "spec": spec}


def measure(case: Case, work: Path) -> dict[str, Any]:
    import yaml

    here = work / "runs" / case.name.replace(" ", "-")
    probe = here / "probe"
    probe.mkdir(parents=True, exist_ok=True)
    for old in probe.glob("peak-*.json"):
        old.unlink()
    shutil.rmtree(here / "run", ignore_errors=True)  # a fresh run: nothing to resume
    doc = job(case, model_dir(work, case), data_file(work), data_file(work, documents=4))
    (here / "job.yaml").write_text(yaml.safe_dump(doc))
    env = {**os.environ, "FINETUNE_PEAK_PROBE": str(probe), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(PROBE), str(ROOT / "operator"), str(ROOT / "trainer_image"),
                                          os.environ.get("PYTHONPATH", "")])}
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "finetune_operator", "run", str(here / "job.yaml"), "--output",
                           str(here / "run")], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=1800)
    peaks = [json.loads(p.read_text()) for p in sorted(probe.glob("peak-*.json"))]
    if proc.returncode != 0 or not peaks:
        raise RuntimeError(f"{case.name}: finetune run exited {proc.returncode}: {proc.stdout[-3000:]}")
    config = json.loads((Path(doc["spec"]["model"]["name"]) / "config.json").read_text())
    return predict({"case": case.name, "architecture": case.architecture, "job": doc, "config": config,
                    "measured_mib": max(p["peak"] for p in peaks) / 2**20, "seconds": round(time.time() - started, 1)})


def predict(row: dict[str, Any]) -> dict[str, Any]:
    """Our estimate (and DeepSpeed's) for a measured row: recomputed from the row's job and config alone, so a
    change to the estimate is compared with the same measurements (--predict FILE)."""
    spec = validate_job(row["job"]).spec
    shape = ModelShape.from_config(row["config"])
    est = estimate(spec, shape)
    return {**row, "method": spec.method.type, "strategy": _strategy(spec), "processes": spec.distributed.world_size,
            "tokens": est.tokens_per_micro_batch, "predicted_mib": est.peak / 2**20,
            "ratio": est.peak / 2**20 / row["measured_mib"], "peak_phase": getattr(est, "peak_phase", ""),
            "deepspeed_states_mib": _deepspeed(spec, shape)}


def _strategy(spec) -> str:
    d = spec.distributed
    if d.strategy == "deepspeed":
        return f"ZeRO-{(d.deepspeed.zero_stage if d.deepspeed else 2)}"
    return "DDP" if d.world_size > 1 else "single"


def _deepspeed(spec, shape: ModelShape) -> float | None:
    from benchmarks.memory_estimates import deepspeed_states_bytes

    value = deepspeed_states_bytes(shape, spec)
    return None if value is None else value / 2**20


def markdown(rows: list[dict]) -> str:
    lines = ["| case | architecture | method | strategy | tokens / micro-batch | measured peak (MiB) | ours (MiB) | "
             "ours / measured | sign | DeepSpeed's estimator, states only (MiB) | phase of our peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ds = "-" if r["deepspeed_states_mib"] is None else f"{r['deepspeed_states_mib']:.1f}"
        sign = "high" if r["ratio"] >= 1 else "**low**"
        lines.append(f"| {r['case']} | {r['architecture']} | {r['method']} | {r['strategy']} | {r['tokens']} | "
                     f"{r['measured_mib']:.1f} | {r['predicted_mib']:.1f} | {r['ratio']:.3f} | {sign} | {ds} | "
                     f"{r['peak_phase']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", help="case names separated by ; (default: all)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON")
    parser.add_argument("--work", type=Path, default=Path("/tmp/finetune-memory-measured"))
    parser.add_argument("--check", action="store_true", help=f"exit 1 unless every ratio is in [{LOW}, {HIGH}]")
    parser.add_argument("--predict", type=Path, help="no runs: our estimate again for the measurements in FILE")
    args = parser.parse_args(argv)
    wanted = set(args.cases.split(";")) if args.cases else None
    rows = []
    if args.predict:
        rows = [predict(r) for r in json.loads(args.predict.read_text())["rows"]
                if wanted is None or r["case"] in wanted]
    for case in CASES if not args.predict else []:
        if wanted is not None and case.name not in wanted:
            continue
        rows.append(measure(case, args.work))
        print(f"{case.name}: measured {rows[-1]['measured_mib']:.1f} MiB, ours {rows[-1]['predicted_mib']:.1f} "
              f"({rows[-1]['ratio']:.3f}, {rows[-1]['seconds']} s)", file=sys.stderr, flush=True)
        if args.out:
            args.out.write_text(json.dumps({"meta": _meta(), "rows": rows}, indent=2) + "\n")
    print(markdown(rows))
    bad = [r["case"] for r in rows if not LOW <= r["ratio"] <= HIGH]
    if bad:
        print(f"outside [{LOW}, {HIGH}]: {', '.join(bad)}", file=sys.stderr)
    return 1 if args.check and bad else 0


def _meta() -> dict[str, Any]:
    import platform

    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "gib": GIB}


if __name__ == "__main__":
    sys.exit(main())
