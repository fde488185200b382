"""GRPO (method.objective grpo) through `finetune run`, checked against TRL's GRPOTrainer called directly on the
same tiny model, data, seed and settings: the same loss, rewards and KL at every step (1 process; the 2-process cases
are in test_grpo_distributed.py). A tiny model learns a simple reward, and a broken reward function stops the run
at its first step with its name and the row."""

import json
from pathlib import Path

import pytest

from tests.support.grpo_reference import STEPS, finetune_run, grpo_job, run_ours, run_trl_directly


def assert_same_steps(ours: list[dict], theirs: list[dict], steps: int = STEPS) -> None:
    """Loss, mean reward and KL within 1e-4 at every step (KL also within 0.1%: it is ~1e-3 here)."""
    assert [r["step"] for r in ours] == [h["step"] for h in theirs] == list(range(1, steps + 1))
    for mine, trl in zip(ours, theirs, strict=True):
        for key, name in (("loss", "loss"), ("reward", "reward"), ("kl", "kl"), ("reward_std", "rewardStd"),
                          ("completions/mean_length", "completionLength"), ("clip_ratio/region_mean", "clipRatio")):
            assert mine[name] == pytest.approx(trl[key], abs=1e-4, rel=1e-3), (mine["step"], name, mine[name],
                                                                                trl[key])
        for function in mine["rewardFunctions"]:
            trl_name = {"regex": "vowel_e", "length": "soft_overlong_punishment_reward"}.get(function["name"],
                                                                                            function["name"])
            assert function["mean"] == pytest.approx(trl[f"rewards/{trl_name}/mean"], abs=1e-4), function


def scorer(model_dir: Path, where: Path) -> Path:
    """A reward model: the tiny model with a one-output score head (random, seeded: its scores differ between
    completions), saved with its tokenizer as `objective: reward` saves one."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype="float32")
    model.save_pretrained(where)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(where)
    return where


# Text prompts with LoRA; conversational prompts (the chat template) with a full fine-tune and a reward model too.
@pytest.mark.parametrize(("loss_type", "method", "conversational"),
                         [("grpo", "lora", False), ("dr_grpo", "full", True)], ids=["grpo-lora-text",
                                                                                    "dr_grpo-full-chat-model"])
def test_grpo_matches_trl_called_directly(loss_type, method, conversational, tiny_model_dir, tmp_path):
    """Every step the same: as the completions are sampled from the weights being trained, equal rewards at later
    steps mean equal updates before them. What a user sees is there: each reward's mean in the records and the
    status fields, samples with their rewards in the summary, a reward panel in loss.png, TensorBoard scalars."""
    reward_model = scorer(tiny_model_dir, tmp_path / "scorer") if conversational else None
    doc = grpo_job(tiny_model_dir, loss_type, method, conversational=conversational, reward_model=reward_model)
    ours, summary = run_ours(doc, tmp_path / "ours")
    theirs, _ = run_trl_directly(doc, tiny_model_dir, tmp_path / "trl")
    assert_same_steps(ours, theirs)
    names = ["regex", "letters", "length", *(["scorer"] if reward_model else [])]
    assert [f["name"] for f in ours[-1]["rewardFunctions"]] == names
    assert ours[-1]["kl"] > 0 and 0 < ours[-1]["completionLength"] <= 12
    assert summary["reward"] == pytest.approx(ours[-1]["reward"]) and summary["tokensSeen"] > 0
    sample = summary["completionSamples"][0]
    assert set(sample["rewards"]) == set(names) and sample["prompt"] and sample["completion"]
    assert sample["reward"] == pytest.approx(0.5 * sample["rewards"]["regex"] + sample["rewards"]["letters"]
                                             + 0.2 * sample["rewards"]["length"]
                                             + 0.3 * sample["rewards"].get("scorer", 0.0))
    output = tmp_path / "ours" / "run" / "output"
    assert (output / "loss.png").exists()
    # A new adapter's reference is the base with the adapter off, as with TRL's peft_config: no "ref" copy saved.
    assert not (output / "final" / "ref").exists()
    events = b"".join(f.read_bytes() for f in output.rglob("events.out.tfevents.*"))
    assert b"train/rewards/letters/mean" in events and b"train/kl" in events


def test_a_tiny_model_learns_a_reward_and_scores_higher_on_held_out_prompts(tiny_model_dir, tmp_path):
    """The `letters` reward (the share of lowercase letters and spaces) on a random tiny model, full fine-tune:
    the mean reward rises clearly over the run, and on prompts it never saw the trained model's completions score
    higher than the base model's (sampled alike)."""
    doc = grpo_job(tiny_model_dir, "dapo", "full", steps=45, beta=0.0)
    doc["spec"]["method"]["grpo"]["rewards"] = [{"type": "function",
                                                 "function": "tests.support.grpo_rewards:letters"}]
    doc["spec"]["training"].update(learningRate=0.01, perDeviceTrainBatchSize=16, loggingSteps=1)
    records, _ = run_ours(doc, tmp_path)
    rewards = [r["reward"] for r in records]
    early, late = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert late > early + 0.15, rewards

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.grpo_rewards import letters

    held_out = ["Describe a dog.", "Where do birds live?", "Say something kind.", "What is ten minus one?"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def score(model_dir: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
        torch.manual_seed(0)
        texts = []
        for prompt in held_out:
            ids = tokenizer(prompt, return_tensors="pt")
            out = model.generate(**ids, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=12,
                                 num_return_sequences=8, pad_token_id=tokenizer.eos_token_id)
            texts += tokenizer.batch_decode(out[:, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        return sum(letters(texts)) / len(texts)

    base, trained = score(tiny_model_dir), score(tmp_path / "run" / "output" / "final")
    assert trained > base + 0.1, (base, trained)


def test_a_reward_function_that_raises_stops_the_run_at_its_first_step_naming_it_and_the_row(tiny_model_dir,
                                                                                              tmp_path):
    """A user function that raises on one prompt's rows: exit 78 (not retried), the reward's path and name, the
    exception and the file and row in the result; no step was trained."""
    doc = grpo_job(tiny_model_dir, steps=3)
    doc["spec"]["method"]["grpo"]["rewards"] = [
        {"type": "regex", "pattern": "e"},
        {"type": "function", "function": "tests.support.grpo_rewards:raises_on_cat", "name": "cat_check"}]
    doc["spec"]["data"]["train"][0]["inline"] = [{"prompt": "How many legs has a cat?", "answer": "four"}] * 2
    proc = finetune_run(doc, tmp_path)
    assert proc.returncode == 78, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "run" / "logs" / "node-0.result.json").read_text())
    assert result["reason"] == "RewardFunctionFailed", result
    assert result["message"].startswith("spec.method.grpo.rewards[1] (cat_check) raised ValueError: cats are not "
                                        "scored on inline rows, row "), result["message"]
    progress = tmp_path / "run" / "output" / "progress.jsonl"
    records = [json.loads(line) for line in progress.read_text().splitlines()] if progress.exists() else []
    assert not [r for r in records if r.get("step")], records
