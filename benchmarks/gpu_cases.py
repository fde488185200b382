"""The GPU suite's cases (benchmarks/gpu_suite.py runs each in a process of its own and tabulates them): the model
sizes, the shared pieces (a model built from a config, the data, a `finetune run` of a job, the fit estimate) and
one function per case, each returning its figures or raising SkipCase."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "trainer_image"), str(ROOT)]

from benchmarks.gpu_grpo import case_grpo  # noqa: E402  (ROOT is on the path: imported as a script and as a module)


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    seq: int
    steps: int
    batch: int


GPU_1B = Size(2048, 16, 16, 8, 5632, 32000, 4096, 30, 2)
GPU_8B_SHAPED = Size(4096, 8, 32, 8, 14336, 32000, 4096, 10, 1)  # an 8B model's layers, 8 of its 32
# in_place_restart saves every 2 steps: the 1B model's checkpoints (~13 GB with Adam's state) would fill the
# machine's disk and make the case about write speed, not about the process group re-formed after a kill.
GPU_RESTART = Size(512, 4, 8, 4, 1408, 32000, 1024, 60, 2)
SMOKE = Size(64, 2, 4, 2, 128, 512, 128, 4, 2)
# The cases that run at another size than GPU_1B on a GPU (in smoke mode every case runs at SMOKE).
GPU_CASE_SIZES = {"lora_8b_shaped": GPU_8B_SHAPED, "in_place_restart": GPU_RESTART}
CASE_SECONDS = {"ours": 150, "hf_trainer": 120, "trl": 120, "first_step": 120, "gradient_checkpointing": 120,
                "compile": 180, "liger": 120, "lora_8b_shaped": 240, "qlora": 180, "fsdp2": 240, "zero3": 180,
                "grpo": 300,
                "in_place_restart": 240}




# --- shared pieces ---------------------------------------------------------------------------------------------
def device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def build_model(work: Path, size: Size) -> Path:
    """A Llama built from a config with random weights (bf16 on GPU), and the locally trained tokenizer."""
    target = work / f"model-{size.hidden}x{size.layers}"
    if (target / "config.json").exists():
        return target
    from finetune_trainer.tiny_model import build_tiny_model

    partial = work / f".{target.name}.{os.getpid()}"  # cases running at once never read a half-written model
    build_tiny_model(partial, layers=size.layers, hidden=size.hidden, heads=size.heads, kv_heads=size.kv_heads,
                     intermediate=size.intermediate, vocab_size=size.vocab, max_positions=max(size.seq, 4096))
    return _publish(partial, target)


def _publish(partial: Path, target: Path) -> Path:
    """Renames a finished file or folder into place; where another process was first, its copy is kept."""
    import shutil

    try:
        partial.rename(target)
    except OSError:
        if not target.exists():
            raise
        shutil.rmtree(partial) if partial.is_dir() else partial.unlink()
    return target


def write_data(work: Path, size: Size) -> Path:
    """Documents of words (several paragraphs each): enough tokens for every step of every case."""
    import random

    path = work / f"docs-{size.seq}.jsonl"
    if path.exists():
        return path
    rng = random.Random(0)
    words = ["the", "model", "learns", "to", "answer", "questions", "about", "numbers", "colours", "animals", "and",
             "code", "while", "rain", "falls", "on", "grey", "city", "a", "quick", "brown", "fox", "jumps", "over",
             "lazy", "dog"]
    need = size.seq * size.batch * (size.steps + 5) * 3  # ~1-2 tokens per word with the small BPE vocabulary
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    with partial.open("w") as f:
        written = 0
        while written < need:
            text = "\n\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(40, 200)))
                               for _ in range(rng.randint(2, 8)))
            f.write(json.dumps({"text": text}) + "\n")
            written += len(text.split())
    return _publish(partial, path)


def flops_per_token(size: Size, trained_fraction: float = 1.0) -> float:
    """Independent of our throughput module: matmul weights from the shape (6 per weight, 4 for frozen ones) plus
    attention's score and value products (causal: half of 4 x seq x hidden per layer, x3 for backward)."""
    attention = size.hidden * (2 * size.hidden + 2 * size.hidden * size.kv_heads // size.heads)
    per_layer = attention + 3 * size.hidden * size.intermediate
    matmul = size.layers * per_layer + size.hidden * size.vocab  # + lm_head
    weights = matmul * (4 + 2 * trained_fraction)
    return weights + 3 * 2 * size.layers * size.seq * size.hidden


def job_spec(model: Path, data: Path, size: Size, gpu: bool, /, **extra: Any) -> dict:
    """The suite's job; `extra` merges into the spec by top-level key (positional parameters: `model` is one)."""
    spec = {
        "model": {"name": str(model), "dtype": "bfloat16" if gpu else "float32", "attnImplementation": "sdpa"},
        "data": {"format": "text", "blockSize": size.seq, "train": [{"path": str(data)}]},
        "method": {"type": "full"},
        "training": {"maxSteps": size.steps, "learningRate": 1e-5, "perDeviceTrainBatchSize": size.batch,
                     "precision": "bf16" if gpu else "fp32", "loggingSteps": 1, "optim": "adamw_torch"},
        "distributed": {"numNodes": 1, "gpusPerNode": 1 if gpu else 0},
        "checkpoints": {"saveStrategy": "no"},
    }
    for key, value in extra.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": "gpu-suite"},
            "spec": spec}


def finetune_run(doc: dict, work: Path, timeout: float) -> tuple[dict, list[dict], float]:
    """`finetune run` (the README's command): (summary, progress records, seconds from start to the first step)."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    (work / "job.yaml").write_text(yaml.safe_dump(doc))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image"),
                                          os.environ.get("PYTHONPATH", "")])}
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "finetune_operator", "run", str(work / "job.yaml"), "--output",
                           str(work / "run")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    result = work / "run" / "logs" / "node-0.result.json"
    summary = json.loads(result.read_text()) if result.exists() else {}
    if proc.returncode != 0:
        raise RuntimeError(f"finetune run exited {proc.returncode}: {summary.get('message') or proc.stdout[-1500:]}")
    progress = work / "run" / "output" / "progress.jsonl"
    def when(record: dict) -> float:
        return calendar.timegm(time.strptime(record["time"], "%Y-%m-%dT%H:%M:%SZ"))  # UTC, whatever the DST

    records = [r for r in (json.loads(line) for line in progress.read_text().splitlines())
               if r.get("phase") != "Preparing" and r.get("step")] if progress.exists() else []
    records = [r for r in records if when(r) >= int(started)]  # this run's (a directory may hold an earlier one's)
    first = min((when(r) for r in records), default=started)
    return summary, records, first - started


def predicted_peak_gib(doc: dict, model: Path) -> float | None:
    """The memory fit estimate's peak allocation for this very job (issue 33: the first lent device calibrates it,
    goal within 10% of torch.cuda.max_memory_allocated)."""
    from finetune_operator.api.validation import validate_job
    from finetune_operator.fit import GIB, ModelShape, UnknownShape, estimate

    try:
        shape = ModelShape.from_config(json.loads((model / "config.json").read_text()))
    except (OSError, UnknownShape):
        return None
    return round(estimate(validate_job(doc).spec, shape).peak / GIB, 3)


def steady(records: list[dict], key: str) -> float | None:
    """The median over the second half of the run (compilation and warm-up excluded)."""
    values = sorted(r[key] for r in records[len(records) // 2:] if r.get(key) is not None)
    return values[len(values) // 2] if values else None


def reload(final: Path, adapter: bool = False) -> None:
    """A saved model is only a model if it loads again."""
    import torch
    from transformers import AutoModelForCausalLM

    if adapter:
        from peft import AutoPeftModelForCausalLM

        AutoPeftModelForCausalLM.from_pretrained(final, dtype=torch.bfloat16)
    else:
        AutoModelForCausalLM.from_pretrained(final, dtype=torch.bfloat16)


# --- the cases ------------------------------------------------------------------------------------------------
def case_ours(work: Path, size: Size, gpu: bool, /, **extra: Any) -> dict:
    model, data = build_model(work, size), write_data(work, size)
    doc = job_spec(model, data, size, gpu, **extra)
    summary, records, first = finetune_run(doc, work / "ours", CASE_SECONDS["ours"] * 3)
    per_device = steady(records, "tokensPerSecondPerDevice")
    measured = summary.get("peakMemoryGiB")
    predicted = predicted_peak_gib(doc, model)
    figures = {"tokensPerSecondPerGpu": per_device, "mfuReported": steady(records, "mfu"),
               "peakMemoryGiB": measured, "predictedPeakGiB": predicted,
               "predictedOverMeasured": round(predicted / measured, 3) if measured and predicted else None,
               "loss": summary.get("finalLoss"), "steps": summary.get("steps"),
               "secondsToFirstStep": round(first, 1)}
    if gpu and per_device:
        from finetune_trainer.training.throughput import peak_flops

        peak = peak_flops(device(), "bf16")
        figures["mfuIndependent"] = per_device * flops_per_token(size) / peak if peak else None
    return figures


def _tokenized_blocks(model: Path, data: Path, size: Size) -> Any:
    import datasets
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = datasets.load_dataset("json", data_files=str(data), split="train")

    def tokenize(batch: dict) -> dict:
        out = tokenizer(batch["text"], truncation=True, max_length=size.seq)
        out["labels"] = [list(ids) for ids in out["input_ids"]]
        return out
    return tokenizer, rows.map(tokenize, batched=True, remove_columns=["text"])


def _trainer_args(work: Path, size: Size, gpu: bool) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(work), max_steps=size.steps, per_device_train_batch_size=size.batch,
                             learning_rate=1e-5, logging_steps=1, report_to="none", save_strategy="no",
                             bf16=gpu, use_cpu=not gpu, optim="adamw_torch", include_num_input_tokens_seen="all")


def _model(model: Path, gpu: bool) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16 if gpu else torch.float32,
                                                attn_implementation="sdpa")


def case_hf_trainer(work: Path, size: Size, gpu: bool) -> dict:
    """What many users write: rows padded by DataCollatorForSeq2Seq, no packing."""
    from transformers import DataCollatorForSeq2Seq, Trainer

    model, data = build_model(work, size), write_data(work, size)
    tokenizer, rows = _tokenized_blocks(model, data, size)
    tokenizer.pad_token = tokenizer.eos_token
    trainer = Trainer(model=_model(model, gpu), args=_trainer_args(work / "hf", size, gpu), train_dataset=rows,
                      data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True))
    result = trainer.train()
    # include_num_input_tokens_seen="all" counts padding too: an upper bound of its useful rate.
    return {"tokensPerSecondPerGpu": trainer.state.num_input_tokens_seen / result.metrics["train_runtime"],
            "loss": trainer.state.log_history[-2].get("loss"), "countsPadding": True}


def case_trl(work: Path, size: Size, gpu: bool) -> dict:
    import datasets
    from trl import SFTConfig, SFTTrainer

    model, data = build_model(work, size), write_data(work, size)
    rows = datasets.load_dataset("json", data_files=str(data), split="train")
    args = SFTConfig(output_dir=str(work / "trl"), max_steps=size.steps, per_device_train_batch_size=size.batch,
                     learning_rate=1e-5, logging_steps=1, report_to="none", save_strategy="no", bf16=gpu,
                     use_cpu=not gpu, packing=True, max_length=size.seq, dataset_text_field="text",
                     include_num_input_tokens_seen="all")
    trainer = SFTTrainer(model=_model(model, gpu), args=args, train_dataset=rows)
    result = trainer.train()
    return {"tokensPerSecondPerGpu": trainer.state.num_input_tokens_seen / result.metrics["train_runtime"],
            "loss": trainer.state.log_history[-2].get("loss")}


def case_first_step(work: Path, size: Size, gpu: bool) -> dict:
    """A second run in the first case's directory (its tokenized data cached there): start to first step."""
    model, data = build_model(work, size), write_data(work, size)
    if not (work / "ours" / "run" / "output" / ".cache").exists():  # run alone: make the cache first
        finetune_run(job_spec(model, data, size, gpu, training={"maxSteps": 1}), work / "ours",
                     CASE_SECONDS["first_step"] * 3)
    _, _, first = finetune_run(job_spec(model, data, size, gpu, training={"maxSteps": 2}), work / "ours",
                               CASE_SECONDS["first_step"] * 3)
    return {"secondsToFirstStep": round(first, 1)}


def _switch(work: Path, size: Size, gpu: bool, name: str, /, adapter: bool = False, **extra: Any) -> dict:
    figures = case_ours(work / name, size, gpu, **extra)
    reload(work / name / "ours" / "run" / "output" / "final", adapter=adapter)
    return {**figures, "finalReloaded": True}


# The spec fields each switch case adds to case_ours' job.
SWITCHES: dict[str, dict[str, Any]] = {
    "gradient_checkpointing": {"training": {"gradientCheckpointing": True}},
    "compile": {"training": {"extraArgs": {"torch_compile": True}}},
    "liger": {"training": {"extraArgs": {"use_liger_kernel": True}}},
    "lora_8b_shaped": {"method": {"type": "lora", "lora": {"r": 16, "alpha": 32}}},
    "qlora": {"method": {"type": "qlora"}, "model": {"quantization": "4bit"}},
    "fsdp2": {"distributed": {"strategy": "fsdp"}},
    "zero3": {"distributed": {"strategy": "deepspeed", "deepspeed": {"zeroStage": 3}}},
}


def case_gradient_checkpointing(work: Path, size: Size, gpu: bool) -> dict:
    return _switch(work, size, gpu, "gc", **SWITCHES["gradient_checkpointing"])


def case_compile(work: Path, size: Size, gpu: bool) -> dict:
    return _switch(work, size, gpu, "compile", **SWITCHES["compile"])


def case_liger(work: Path, size: Size, gpu: bool) -> dict:
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is None:
        raise SkipCase("liger-kernel is not installed")
    return _switch(work, size, gpu, "liger", **SWITCHES["liger"])


def case_lora_8b_shaped(work: Path, size: Size, gpu: bool) -> dict:
    shaped = GPU_CASE_SIZES["lora_8b_shaped"] if gpu else size
    return _switch(work, shaped, gpu, "lora", adapter=True, **SWITCHES["lora_8b_shaped"])


def case_qlora(work: Path, size: Size, gpu: bool) -> dict:
    import importlib.util

    if not gpu:
        raise SkipCase("QLoRA's 4-bit base needs a GPU")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise SkipCase("bitsandbytes is not installed (not carried: 43 MB over the 60 MiB carry)")
    return _switch(work, size, gpu, "qlora", adapter=True, **SWITCHES["qlora"])


def case_fsdp2(work: Path, size: Size, gpu: bool) -> dict:
    """Sharded checkpoints (the default) at half way, resumed by a second run of 2 more steps: the final model of
    each is gathered whole and reloads."""
    if not gpu:
        raise SkipCase("FSDP through the Trainer needs a GPU")
    saving = {"saveStrategy": "steps", "saveSteps": size.steps // 2}
    figures = _switch(work, size, gpu, "fsdp2", **SWITCHES["fsdp2"], checkpoints=saving)
    here = work / "fsdp2"  # the model and data that case_ours built there: a resume refuses another model's
    doc = job_spec(build_model(here, size), write_data(here, size), size, gpu, **SWITCHES["fsdp2"],
                   checkpoints=saving, training={"maxSteps": size.steps + 2})
    summary, _, _ = finetune_run(doc, here / "ours", CASE_SECONDS["fsdp2"] * 3)
    reload(here / "ours" / "run" / "output" / "final")
    return {**figures, "resumedFrom": summary.get("resumedFrom"), "resumedSteps": summary.get("steps")}


def case_zero3(work: Path, size: Size, gpu: bool) -> dict:
    return _switch(work, size, gpu, "zero3", **SWITCHES["zero3"])


def case_in_place_restart(work: Path, size: Size, gpu: bool) -> dict:
    """The run's training process killed once checkpoint 2 is complete: torchrun's agent restarts it in place (the
    process group re-formed through the c10d rendezvous) and it resumes from that checkpoint to the end."""
    import shutil

    import yaml

    from finetune_operator.cli.processes import argv_of, descendants, parent_of, training_process
    from finetune_trainer.outputs.checkpoints import COMPLETE_MARKER

    here = work / "in_place_restart"
    size = GPU_CASE_SIZES["in_place_restart"] if gpu else size
    # Enough steps after checkpoint 2 that the kill lands while training (a tiny CPU run of 6 steps had ended by
    # the time the poll saw the checkpoint, and its restart found nothing left to train).
    steps = max(size.steps, 60)
    doc = job_spec(build_model(here, size), write_data(here, size), size, gpu, runPolicy={"inPlaceRestarts": 1},
                   checkpoints={"saveStrategy": "steps", "saveSteps": 2, "overlap": True},
                   training={"maxSteps": steps})
    (here / "job.yaml").write_text(yaml.safe_dump(doc))
    shutil.rmtree(here / "run", ignore_errors=True)  # a run left by an earlier suite would resume at its end
    output = here / "run" / "output"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image"),
                                          os.environ.get("PYTHONPATH", "")])}
    log = open(here / "run.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "finetune_operator", "run", str(here / "job.yaml"), "--output",
                             str(here / "run")], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + CASE_SECONDS["in_place_restart"]
        while not (output / "checkpoint-2" / COMPLETE_MARKER).exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no checkpoint 2 before the kill (exit {proc.poll()}): see {here / 'run.log'}")
            time.sleep(0.05)
        victim = training_process(descendants(proc.pid), argv_of, parent_of)
        os.kill(victim, 9)
        code = proc.wait(timeout=CASE_SECONDS["in_place_restart"])
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    groups = [json.loads(line) for line in (output / "workers.jsonl").read_text().splitlines()]
    if code != 0 or len(groups) != 2 or not (output / "final").is_dir():
        raise RuntimeError(f"exit {code}, {len(groups)} worker group(s): see {here / 'run.log'}")
    last = groups[-1]
    return {"killedPid": victim, "cause": last.get("cause"), "resumedStep": last.get("resumedStep"),
            "lostSteps": last.get("lostSteps"), "recoverySeconds": last.get("recoverySeconds"),
            "timeline": last.get("timeline"), "backend": "nccl" if gpu else "gloo"}


class SkipCase(Exception):
    """The case cannot run here (a package or a device missing): said in the table, not a failure."""


CASES = {"ours": case_ours, "hf_trainer": case_hf_trainer, "trl": case_trl, "first_step": case_first_step,
         "gradient_checkpointing": case_gradient_checkpointing, "compile": case_compile, "liger": case_liger,
         "lora_8b_shaped": case_lora_8b_shaped, "qlora": case_qlora, "fsdp2": case_fsdp2, "zero3": case_zero3,
         "grpo": case_grpo,
         "in_place_restart": case_in_place_restart}
