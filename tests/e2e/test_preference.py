"""Preference tuning (method.objective dpo) through `finetune run`, checked against TRL's DPOTrainer called
directly on the same tiny model, pairs, seed and hyper-parameters: the same loss at every step."""

import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

STEPS = 8


def run_ours(model_dir, tmp_path, **overrides):
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-dpo.yaml").read_text())
    doc["spec"]["model"]["name"] = str(model_dir)
    doc["spec"]["training"]["maxSteps"] = STEPS
    for key, value in overrides.items():
        doc["spec"][key].update(value)
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "finetune_operator", "run", str(job), "--output",
                           str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "output" / "progress.jsonl").read_text().splitlines()]
    return doc, [r for r in records if r.get("step") and r.get("loss") is not None]


def run_trl_directly(doc, model_dir, tmp_path):
    """TRL's documented DPO recipe, with the spec's values written out by hand."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import DPOConfig, DPOTrainer

    spec = doc["spec"]
    set_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32", attn_implementation="sdpa")
    lora = spec["method"]["lora"]
    model = get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    training = spec["training"]
    args = DPOConfig(output_dir=str(tmp_path / "trl"), max_steps=STEPS, learning_rate=training["learningRate"],
                     lr_scheduler_type="cosine", per_device_train_batch_size=training["perDeviceTrainBatchSize"],
                     optim="adamw_torch", logging_steps=1, seed=42, use_cpu=True, report_to=[], save_strategy="no",
                     # TRL's own defaults differ from the spec's here: bf16 autocast and gradient checkpointing on.
                     bf16=False, gradient_checkpointing=False,
                     beta=spec["method"]["preference"]["beta"], loss_type=["sigmoid"],
                     max_length=spec["data"]["maxLength"])
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(spec["data"]["train"][0]["inline"]),
                         processing_class=tokenizer)
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


def test_dpo_losses_and_rewards_match_trl_called_directly(tiny_model_dir, tmp_path):
    """The same losses, margins and accuracies at every step; the model learns the preference (the chosen answer
    is always the right one: accuracy above 0.9, a positive margin) and the saved adapter loads and generates."""
    doc, ours = run_ours(tiny_model_dir, tmp_path / "ours")
    theirs = run_trl_directly(doc, tiny_model_dir, tmp_path)
    assert [r["step"] for r in ours] == [h["step"] for h in theirs] == list(range(1, STEPS + 1))
    for mine, trl in zip(ours, theirs, strict=True):
        assert mine["loss"] == pytest.approx(trl["loss"], abs=1e-5), (mine["step"], mine["loss"], trl["loss"])
        assert mine["rewardsMargin"] == pytest.approx(trl["rewards/margins"], abs=1e-5)
        assert mine["rewardsAccuracy"] == pytest.approx(trl["rewards/accuracies"], abs=1e-6)
    assert ours[-1]["rewardsAccuracy"] > 0.9 and ours[-1]["rewardsMargin"] > 0
    summary = json.loads((tmp_path / "ours" / "run" / "logs" / "node-0.result.json").read_text())
    assert summary["rewardsAccuracy"] == ours[-1]["rewardsAccuracy"] and (tmp_path / "ours" / "run" / "output" /
                                                                          "loss.png").exists()
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    final = tmp_path / "ours" / "run" / "output" / "final"
    model = AutoPeftModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    ids = tokenizer("What is 2 + 2?", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
