"""GRPO two ways, for the parity tests and the step-time benchmark: through `finetune run` (our trainer, TRL's
GRPOTrainer inside) and through TRL's GRPOTrainer called directly as its documentation shows, with the spec's values
written out by hand and the rewards as plain functions of tests/support/grpo_rewards.py (TRL's own soft overlong
punishment for the length reward). Both run in fresh processes; with 2 processes TRL's side runs under torchrun.

Run as a script (what run_trl_directly starts): python tests/support/grpo_reference.py WORKDIR MODEL STEPS
(WORKDIR/job.json holds the job; rank 0 writes WORKDIR/trl.json: the logged steps, each with its wall time, and
train_runtime)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# Threads as the caller has them (the tests: one per process, tests/conftest.py), the same for both sides.
ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
       # This checkout's packages first; what the caller's path has after (the GPU kit's carried wheels).
       "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image"), str(ROOT),
                                      os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
STEPS = 6
# The rewards both sides use: a regex (TRL side: vowel_e), the user's function, the length penalty (TRL's).
PARITY_REWARDS = [
    {"type": "regex", "pattern": "e", "weight": 0.5},
    {"type": "function", "function": "tests.support.grpo_rewards:letters", "weight": 1.0},
    {"type": "length", "maxTokens": 12, "softTokens": 6, "weight": 0.2},
]


def grpo_job(model_dir: Path, loss_type: str = "grpo", method: str = "lora", steps: int = STEPS,
             processes: int = 1, beta: float = 0.04, conversational: bool = False,
             reward_model: Path | None = None) -> dict:
    """The tiny GRPO example with the parity rewards, a loss type, a method and 1 or 2 processes on one node;
    conversational: each prompt as a user message (TRL's conversational layout) instead of text; reward_model: a
    sequence-classification model's score as one more reward."""
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-grpo.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["name"] = str(model_dir)
    spec["method"]["type"] = method
    rewards = [*PARITY_REWARDS, *([{"type": "model", "model": str(reward_model), "weight": 0.3}]
                                  if reward_model else [])]
    spec["method"]["grpo"].update(lossType=loss_type, beta=beta, maxCompletionLength=12, rewards=rewards)
    if conversational:
        rows = spec["data"]["train"][0]["inline"]
        spec["data"]["train"][0]["inline"] = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]}
                                              for r in rows]
    # 8 completions a step whatever the processes: 2 prompts x 4 generations.
    spec["training"].update(maxSteps=steps, perDeviceTrainBatchSize=8 // processes, seed=7,
                            learningRate=0.005 if method == "lora" else 0.0005)
    spec["distributed"]["cpuProcessesPerNode"] = processes
    spec["checkpoints"] = {"saveStrategy": "no"}
    spec["tracking"] = {"reportTo": []}
    return doc


def finetune_run(doc: dict, work: Path) -> subprocess.CompletedProcess:
    """`finetune run` of the job, output in work/run, with this checkout's packages."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.yaml").write_text(yaml.safe_dump(doc))
    return subprocess.run([sys.executable, "-m", "finetune_operator", "run", str(work / "job.yaml"), "--output",
                           str(work / "run")], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **ENV})


def run_ours(doc: dict, work: Path) -> tuple[list[dict], dict]:
    """`finetune run` of the job: (its progress records with a loss, node 0's result)."""
    proc = finetune_run(doc, work)
    logs = work / "run" / "logs"
    assert proc.returncode == 0, (proc.stdout[-2000:] + proc.stderr[-2000:]
                                  + "".join(p.read_text()[-3000:] for p in logs.glob("*.log")))
    lines = (work / "run" / "output" / "progress.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r.get("step") and r.get("loss") is not None]
    return records, json.loads((logs / "node-0.result.json").read_text())


def run_trl_directly(doc: dict, model_dir: Path, work: Path, steps: int = STEPS) -> tuple[list[dict], float]:
    """TRL's run in a fresh process (torchrun with the job's processes): (its logged steps, train_runtime)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.json").write_text(json.dumps(doc))
    processes = doc["spec"]["distributed"].get("cpuProcessesPerNode", 1)
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
                if processes > 1 else [sys.executable])
    proc = subprocess.run([*launcher, str(Path(__file__)), str(work), str(model_dir), str(steps)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((work / "trl.json").read_text())
    return result["logs"], result["runtime"]


def trl_config(spec: dict, output_dir: str, steps: int):
    from trl import GRPOConfig

    g, t = spec["method"]["grpo"], spec["training"]
    return GRPOConfig(
        output_dir=output_dir, max_steps=steps, learning_rate=t["learningRate"], lr_scheduler_type="cosine",
        per_device_train_batch_size=t["perDeviceTrainBatchSize"], optim="adamw_torch", logging_steps=1,
        seed=t["seed"], use_cpu=spec["distributed"].get("gpusPerNode", 1) == 0, report_to=[], save_strategy="no",
        # TRL's defaults differ from the spec's here: bf16 autocast and gradient checkpointing on.
        bf16=t.get("precision") == "bf16", gradient_checkpointing=False,
        num_generations=g["numGenerations"], max_completion_length=g["maxCompletionLength"],
        temperature=g["temperature"], beta=g["beta"], loss_type=g["lossType"],
        reward_weights=[r["weight"] for r in g["rewards"]])


def step_clock():
    """A callback timing each optimizer step from the end of the one before (the first from the start of training),
    generation included: `seconds[step]`. Ours (benchmarks/gpu_grpo.py step_seconds) runs from one log to the
    next: the same step and one log each, a few calls apart."""
    import time

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.seconds: dict[int, float] = {}
            self.last = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.seconds[state.global_step], self.last = now - self.last, now

    return Clock()


def main(work: Path, model_dir: str, steps: int) -> None:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    from trl.rewards import get_soft_overlong_punishment

    from tests.support.grpo_rewards import letters, vowel_e

    spec = json.loads((work / "job.json").read_text())["spec"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=spec["model"].get("dtype", "float32"),
                                                 attn_implementation="sdpa")
    method, lora = spec["method"], spec["method"]["lora"]
    peft = (LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                       target_modules="all-linear", task_type="CAUSAL_LM") if method["type"] == "lora" else None)
    rewards = []  # each of the spec's, written out: the regex "e", the letters function, TRL's length penalty
    for r in method["grpo"]["rewards"]:  # and a reward model by its path, which TRL loads itself
        if r["type"] == "length":
            rewards.append(get_soft_overlong_punishment(r["maxTokens"], r["softTokens"]))
        elif r["type"] == "model":
            rewards.append(r["model"])
        else:
            assert r.get("pattern") == "e" or r.get("function", "").endswith(":letters"), r
            rewards.append(vowel_e if r["type"] == "regex" else letters)
    data = Dataset.from_list(spec["data"]["train"][0]["inline"])
    clock = step_clock()
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=trl_config(spec, str(work / "trl"), steps),
                          train_dataset=data, processing_class=tokenizer, peft_config=peft, callbacks=[clock])
    result = trainer.train()
    if trainer.accelerator.is_main_process:
        logs = [{**h, "stepSeconds": clock.seconds.get(h.get("step"))} for h in trainer.state.log_history
                if "loss" in h]
        (work / "trl.json").write_text(json.dumps({"logs": logs, "runtime": result.metrics["train_runtime"]}))


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT)]
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
