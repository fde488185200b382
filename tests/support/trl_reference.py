"""A preference objective two ways, for parity tests and the step-time benchmark: through `finetune run` (our
trainer, TRL's trainer inside) and through TRL's trainer called directly as its documentation shows, with the
spec's values written out by hand."""

import json
import os
import subprocess
import sys

import yaml

from tests.support.controlplane import ROOT
from tests.support.trainer_run import TEST_ENV

STEPS = 8


def run_ours(model_dir, tmp_path, example="tiny-cpu-dpo.yaml", steps=STEPS, **overrides):
    """`finetune run` of an example: (the job, its progress records with a loss, its summary)."""
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["spec"]["model"]["name"] = str(model_dir)
    doc["spec"]["training"]["maxSteps"] = steps
    for key, value in overrides.items():
        doc["spec"].setdefault(key, {}).update(value)
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    # This checkout's packages (the shared environment's installed ones may be another checkout's).
    proc = subprocess.run([sys.executable, "-m", "finetune_operator", "run", str(job), "--output",
                           str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": TEST_ENV["PYTHONPATH"]})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "output" / "progress.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "run" / "logs" / "node-0.result.json").read_text())
    return doc, [r for r in records if r.get("step") and r.get("loss") is not None], summary


def run_trl_directly(doc, model_dir, tmp_path, steps=STEPS):
    """TRL's documented recipe for the objective, with the spec's values written out by hand: (its logged steps,
    its train_runtime in seconds)."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, set_seed

    spec = doc["spec"]
    objective, pref = spec["method"]["objective"], spec["method"].get("preference", {})
    set_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    if objective == "reward":  # TRL's reward recipe: one output, the score, on the base model
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype="float32",
                                                                   attn_implementation="sdpa")
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32", attn_implementation="sdpa")
    lora = spec["method"]["lora"]
    task = "SEQ_CLS" if objective == "reward" else "CAUSAL_LM"
    model = get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                             target_modules="all-linear", task_type=task))
    training = spec["training"]
    common = dict(output_dir=str(tmp_path / "trl"), max_steps=steps, learning_rate=training["learningRate"],
                  lr_scheduler_type="cosine", per_device_train_batch_size=training["perDeviceTrainBatchSize"],
                  optim="adamw_torch", logging_steps=1, seed=42, use_cpu=True, report_to=[], save_strategy="no",
                  # TRL's own defaults differ from the spec's here: bf16 autocast and gradient checkpointing on.
                  bf16=False, gradient_checkpointing=False, max_length=spec["data"]["maxLength"])
    if objective != "reward":
        common["beta"] = pref["beta"]
    data = Dataset.from_list(spec["data"]["train"][0]["inline"])
    if objective == "reward":
        from trl import RewardConfig as Config
        from trl import RewardTrainer as Trainer

        args = Config(**common)
    elif objective == "dpo":
        from trl import DPOConfig as Config
        from trl import DPOTrainer as Trainer

        args = Config(**common, loss_type=["sigmoid"])
    elif objective == "kto":
        from trl import KTOConfig as Config
        from trl import KTOTrainer as Trainer

        # KTO samples in order: the documented advice is a shuffled dataset (batches with both kinds).
        data = data.shuffle(seed=42)
        args = Config(**common, loss_type="kto", desirable_weight=pref["desirableWeight"],
                      undesirable_weight=pref["undesirableWeight"])
    elif objective == "orpo":
        from trl.experimental.orpo import ORPOConfig as Config
        from trl.experimental.orpo import ORPOTrainer as Trainer

        args = Config(**common)
    elif objective == "cpo":  # CPO as the paper and TRL's CPOConfig define it: sigmoid loss plus the chosen NLL
        from trl.experimental.cpo import CPOConfig as Config
        from trl.experimental.cpo import CPOTrainer as Trainer

        args = Config(**common, loss_type="sigmoid", cpo_alpha=1.0)
    else:  # SimPO: CPO's simpo loss without its behaviour-cloning term, as TRL's docs give it
        from trl.experimental.cpo import CPOConfig as Config
        from trl.experimental.cpo import CPOTrainer as Trainer

        args = Config(**common, loss_type="simpo", cpo_alpha=0.0, simpo_gamma=pref.get("simpoGamma", 0.5))
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    result = trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h], result.metrics["train_runtime"]
