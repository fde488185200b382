"""Preference tuning (method.objective dpo, kto, orpo, simpo, cpo) and reward modelling (reward) through `finetune
run`, each checked against TRL's trainer called directly on the same tiny model, data, seed and hyper-parameters: the
same loss at every step."""

import json
import subprocess
import sys

import pytest

from tests.support.trl_reference import STEPS, run_ours, run_trl_directly


def assert_same_steps(ours, theirs):
    assert [r["step"] for r in ours] == [h["step"] for h in theirs] == list(range(1, STEPS + 1))
    for mine, trl in zip(ours, theirs, strict=True):
        assert mine["loss"] == pytest.approx(trl["loss"], abs=1e-5), (mine["step"], mine["loss"], trl["loss"])
        for key, name in (("rewards/margins", "rewardsMargin"), ("rewards/accuracies", "rewardsAccuracy"),
                          ("rewards/chosen", "rewardsChosen"), ("rewards/rejected", "rewardsRejected"),
                          ("margin", "rewardsMargin"), ("accuracy", "rewardsAccuracy")):  # RewardTrainer's names
            if key in trl:
                assert mine[name] == pytest.approx(trl[key], abs=1e-5), (mine["step"], name)


def test_dpo_losses_and_rewards_match_trl_called_directly(tiny_model_dir, tmp_path):
    """The same losses, margins and accuracies at every step; the model learns the preference (the chosen answer
    is always the right one: accuracy above 0.9, a positive margin) and the saved adapter loads and generates."""
    doc, ours, summary = run_ours(tiny_model_dir, tmp_path / "ours")
    theirs, _ = run_trl_directly(doc, tiny_model_dir, tmp_path)
    assert_same_steps(ours, theirs)
    assert ours[-1]["rewardsAccuracy"] > 0.9 and ours[-1]["rewardsMargin"] > 0
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


@pytest.mark.parametrize("objective", ["kto", "orpo", "simpo", "cpo"])
def test_each_objective_matches_trl_called_directly(objective, tiny_model_dir, tmp_path):
    """KTO on unpaired examples (tiny-cpu-kto.yaml), ORPO, SimPO and CPO (reference-free) on the DPO example's
    pairs: the same loss and rewards as TRL's KTOTrainer, ORPOTrainer and CPOTrainer at every step, tokens
    counted."""
    if objective == "kto":
        doc, ours, summary = run_ours(tiny_model_dir, tmp_path / "ours", "tiny-cpu-kto.yaml")
    else:
        doc, ours, summary = run_ours(tiny_model_dir, tmp_path / "ours",
                                      method={"objective": objective, "preference": {"beta": 0.1}})
    theirs, _ = run_trl_directly(doc, tiny_model_dir, tmp_path)
    assert_same_steps(ours, theirs)
    assert ours[-1]["tokensSeen"] > 0  # TRL's pair collators have no input_ids; our trainer counts the answers
    assert summary["rewardsChosen"] == pytest.approx(ours[-1]["rewardsChosen"])


def documented_snippet(final) -> str:
    """The Python block of the docs' reward-model section, pointed at `final`."""
    import re

    from tests.support.controlplane import ROOT

    page = (ROOT / "docs" / "concepts" / "preference-objectives.md").read_text()
    section = page.split("## Reward models", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'final = "runs/tiny-cpu-reward/output/final"' in code
    return code.replace('"runs/tiny-cpu-reward/output/final"', repr(str(final)))


def test_a_reward_model_matches_trl_called_directly_and_scores_chosen_above_rejected(tiny_model_dir, tmp_path):
    """tiny-cpu-reward.yaml: RewardTrainer's loss, margin and accuracy at every step, as when TRL is called
    directly; final/ (a SEQ_CLS adapter with its score head) and merged/ (a whole sequence-classification model,
    which scores a batch: it knows its pad token) give the same scores, the chosen answers above the rejected."""
    doc, ours, summary = run_ours(tiny_model_dir, tmp_path / "ours", "tiny-cpu-reward.yaml")
    theirs, _ = run_trl_directly(doc, tiny_model_dir, tmp_path)
    assert "accuracy" in theirs[0] and "margin" in theirs[0]
    assert_same_steps(ours, theirs)
    assert summary["rewardsAccuracy"] == ours[-1]["rewardsAccuracy"] and ours[-1]["rewardsMargin"] > 0

    import torch
    from peft import AutoPeftModelForSequenceClassification
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    output = tmp_path / "ours" / "run" / "output"
    tokenizer = AutoTokenizer.from_pretrained(output / "merged")
    pairs = doc["spec"]["data"]["train"][0]["inline"]
    texts = [p["prompt"] + p[answer] + tokenizer.eos_token for p in pairs for answer in ("chosen", "rejected")]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        merged = AutoModelForSequenceClassification.from_pretrained(output / "merged").eval()
        scores = merged(**batch).logits.squeeze(-1)
        adapter = AutoPeftModelForSequenceClassification.from_pretrained(output / "final", num_labels=1).eval()
        adapter.config.pad_token_id = tokenizer.pad_token_id  # an adapter's base config is the original model's
        assert torch.allclose(adapter(**batch).logits.squeeze(-1), scores, atol=1e-4)
        # The adapter loads and scores exactly as docs/concepts/preference-objectives.md shows, run as a user runs it.
        script = tmp_path / "score.py"
        script.write_text(documented_snippet(output / "final") + "\nimport json\nprint(json.dumps(scores.tolist()))\n")
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        texts = ["What is 2 + 2? 4.", "What is 2 + 2? Blue."]
        expected = merged(**tokenizer(texts, return_tensors="pt", padding=True)).logits.squeeze(-1)
        assert torch.allclose(torch.tensor(json.loads(proc.stdout.strip().splitlines()[-1])), expected, atol=1e-4)
    chosen, rejected = scores[0::2], scores[1::2]
    assert int((chosen > rejected).sum()) >= len(pairs) - 1, (chosen, rejected)


def test_two_processes_say_which_pairs_they_repeat_and_evaluate_held_out_preference_not_perplexity(tiny_model_dir,
                                                                                                   tmp_path):
    """DPO on 2 processes with 6 training pairs in batches of 2 x 2: the last batch of the epoch is filled with 2
    repeated pairs, which the run says (RowsRepeated); its evaluation on the 2 held-out pairs reports the preference
    accuracy and margin (status, progress, summary, console), and no perplexity (exp of a DPO loss means nothing)."""
    doc, _, summary = run_ours(tiny_model_dir, tmp_path, steps=4, data={"validationSplitPercentage": 25},
                               training={"perDeviceTrainBatchSize": 2, "evalStrategy": "steps", "evalSteps": 2},
                               distributed={"cpuProcessesPerNode": 2})
    assert summary["worldSize"] == 2 and summary["data"]["train"]["pairs"] == 6
    said = {w["reason"]: w["message"] for w in summary.get("warnings") or []}
    assert said.get("RowsRepeated", "").startswith("6 training pairs over 2 processes x 2 per process: the last "
                                                   "batch of each epoch is filled up with 2 pairs repeated"), said
    records = [json.loads(line) for line in (tmp_path / "run" / "output" / "progress.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if r.get("evalLoss") is not None]
    assert [r["step"] for r in evaluations] == [2, 4]
    for record in evaluations:
        assert 0 <= record["evalRewardsAccuracy"] <= 1 and isinstance(record["evalRewardsMargin"], float)
        assert record.get("evalPerplexity") is None
    assert summary["evalPerplexity"] is None and summary["evalRewardsAccuracy"] == evaluations[-1][
        "evalRewardsAccuracy"]
    from finetune_trainer.training.callbacks import status_progress

    status = status_progress(evaluations[-1])
    assert "evalRewardsAccuracy" in status and "evalRewardsMargin" in status and "evalPerplexity" not in status
