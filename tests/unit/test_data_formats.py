"""Golden label masks for every format: only what the model should learn carries labels (the real EOS included)."""

import json

import pytest

from finetune_operator.api.data import DataSpec
from finetune_trainer import data as D
from finetune_trainer.collators import make_collator
from finetune_trainer.errors import DataError


def spec(**kw) -> DataSpec:
    return DataSpec.model_validate({"format": "alpaca", "train": [{"inline": [{"x": 1}]}], **kw})


def learned_text(tokenizer, row, **kw) -> tuple[str, list[int], list[int]]:
    ids, labels = D.tokenize_segments(D.row_segments(row, spec(**kw), tokenizer), tokenizer,
                                      kw.get("trainOnPrompt", False))
    text = tokenizer.decode([t for t, lab in zip(ids, labels, strict=True) if lab != D.IGNORE_INDEX])
    return text, ids, labels


def test_alpaca_with_chat_template_learns_only_the_answer_and_its_eos(tiny_tokenizer):
    text, ids, labels = learned_text(tiny_tokenizer, {"instruction": "Name a colour.", "output": "Red."})
    assert text == "Red.</s>\n"
    assert tiny_tokenizer.decode(ids).startswith("<s><|user|>\nName a colour.</s>")
    assert labels[0] == D.IGNORE_INDEX  # BOS


def test_alpaca_input_column_joins_the_instruction(tiny_tokenizer):
    row = {"instruction": "Translate.", "input": "hello", "output": "Bonjour."}
    _, ids, _ = learned_text(tiny_tokenizer, row)
    assert "Translate.\n\nhello</s>" in tiny_tokenizer.decode(ids)


def test_alpaca_without_chat_template_uses_the_alpaca_prompt(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = None
    text, ids, _ = learned_text(tokenizer, {"instruction": "What is 2 + 2?", "output": "4."})
    assert text == "4.</s>"
    assert tokenizer.decode(ids) == "<s>### Instruction:\nWhat is 2 + 2?\n\n### Response:\n4.</s>"


def test_sharegpt_multi_turn_masks_system_and_human(tiny_tokenizer):
    row = {"system": "Be brief.", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
        {"from": "human", "value": "bye"}, {"from": "gpt", "value": "see you"}]}
    text, _, _ = learned_text(tiny_tokenizer, row, format="sharegpt")
    assert text == "hello</s>\nsee you</s>\n"


def test_messages_format_with_column_mapping(tiny_tokenizer):
    row = {"chat": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    text, _, _ = learned_text(tiny_tokenizer, row, format="messages", columns={"messages": "chat"})
    assert text == "4</s>\n"


def test_prompt_completion(tiny_tokenizer):
    text, ids, _ = learned_text(tiny_tokenizer, {"prompt": "The sky is", "completion": " blue."},
                                format="prompt_completion")
    assert text == " blue.</s>"
    assert tiny_tokenizer.decode(ids) == "<s>The sky is blue.</s>"


def test_train_on_prompt_learns_everything_but_bos(tiny_tokenizer):
    _, ids, labels = learned_text(tiny_tokenizer, {"instruction": "Hi.", "output": "Yo."}, trainOnPrompt=True)
    assert labels[1:] == ids[1:] and labels[0] == D.IGNORE_INDEX


def test_missing_column_is_a_data_error_naming_the_mapping(tiny_tokenizer):
    with pytest.raises(DataError, match=r"no 'instruction' column .* map it with data.columns"):
        learned_text(tiny_tokenizer, {"question": "?", "output": "!"})


def test_unknown_sharegpt_role_is_a_data_error(tiny_tokenizer):
    with pytest.raises(DataError, match="unknown 'from'"):
        learned_text(tiny_tokenizer, {"conversations": [{"from": "robot", "value": "x"}]}, format="sharegpt")


def test_text_blocks_concatenate_with_eos_and_drop_the_tail(tiny_tokenizer):
    rows = [{"text": "one two three four five"}, {"text": "six seven eight nine ten"}] * 3
    examples, stats = D.tokenize_text_blocks(rows, spec(format="text", blockSize=16), tiny_tokenizer)
    stream = []
    for row in rows:
        stream += tiny_tokenizer(row["text"], add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    assert [e["input_ids"] for e in examples] == [stream[i:i + 16] for i in range(0, len(stream) - 15, 16)]
    assert all(e["labels"] == e["input_ids"] for e in examples)
    assert stats.kept == len(stream) // 16 and stats.rows == 6


@pytest.mark.parametrize(("policy", "kept", "truncated", "dropped"), [
    ("truncate", 2, 1, 0), ("drop", 1, 0, 1)], ids=["truncate", "drop"])
def test_truncation_policy_is_counted(tiny_tokenizer, policy, kept, truncated, dropped):
    rows = [{"instruction": "Hi.", "output": "Yo."}, {"instruction": "Hi.", "output": "word " * 40}]
    examples, stats = D.tokenize_sft(rows, spec(maxLength=24, truncation=policy), tiny_tokenizer)
    assert (stats.kept, stats.truncated, stats.dropped_too_long) == (kept, truncated, dropped)
    assert all(len(e["input_ids"]) <= 24 for e in examples)


def test_sample_whose_answer_is_truncated_away_is_dropped_and_counted(tiny_tokenizer):
    rows = [{"instruction": "word " * 40, "output": "Yo."}]
    examples, stats = D.tokenize_sft(rows, spec(maxLength=16), tiny_tokenizer)
    assert examples == [] and stats.dropped_no_target == 1


def test_padding_is_masked_by_attention_mask_not_by_token_id(tiny_tokenizer):
    """pad == eos: the real EOS at the end of an answer keeps its label; padding gets -100 and mask 0."""
    assert tiny_tokenizer.pad_token_id == tiny_tokenizer.eos_token_id
    rows = [{"instruction": "Hi.", "output": "Yo."}, {"instruction": "Name a colour.", "output": "Red is one."}]
    examples, _ = D.tokenize_sft(rows, spec(), tiny_tokenizer)
    batch = make_collator(tiny_tokenizer, packing=False, attn_implementation="sdpa")(examples)
    short = 0 if len(examples[0]["input_ids"]) < len(examples[1]["input_ids"]) else 1
    n = len(examples[short]["input_ids"])
    labels, mask = batch["labels"][short].tolist(), batch["attention_mask"][short].tolist()
    eos_positions = [i for i, t in enumerate(examples[short]["input_ids"]) if t == tiny_tokenizer.eos_token_id]
    assert any(labels[i] == tiny_tokenizer.eos_token_id for i in eos_positions)  # the answer's EOS is learned
    assert labels[n:] == [D.IGNORE_INDEX] * (len(labels) - n) and mask[n:] == [0] * (len(mask) - n)
    assert len(labels) % 8 == 0


def test_prepare_caches_by_content_and_reuses_the_cache(tiny_tokenizer, tmp_path, monkeypatch):
    data_file = tmp_path / "train.jsonl"
    data_file.write_text("\n".join(json.dumps({"instruction": f"Q{i}", "output": f"A{i}"}) for i in range(10)))
    data = spec(train=[{"path": str(data_file)}], validationSplitPercentage=20)
    first = D.prepare(data, tiny_tokenizer, tmp_path / "cache", seed=1)
    assert len(first.train) == 8 and len(first.eval) == 2 and first.stats["train"]["kept"] == 8

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again despite a complete cache")

    monkeypatch.setattr(D, "tokenize", no_tokenizing)
    second = D.prepare(data, tiny_tokenizer, tmp_path / "cache", seed=1)
    assert second.train["input_ids"] == first.train["input_ids"]
    data_file.write_text(data_file.read_text() + "\n" + json.dumps({"instruction": "new", "output": "row"}))
    with pytest.raises(AssertionError, match="tokenized again"):
        D.prepare(data, tiny_tokenizer, tmp_path / "cache", seed=1)  # changed data -> new key -> re-tokenize


def test_no_trainable_example_is_a_data_error(tiny_tokenizer, tmp_path):
    data = spec(train=[{"inline": [{"instruction": "word " * 50, "output": "x"}]}], maxLength=16)
    with pytest.raises(DataError, match="no trainable example"):
        D.prepare(data, tiny_tokenizer, tmp_path, seed=1)


def test_missing_file_is_a_data_error(tiny_tokenizer, tmp_path):
    with pytest.raises(DataError, match="no data file"):
        D.prepare(spec(train=[{"path": str(tmp_path / "nope.jsonl")}]), tiny_tokenizer, tmp_path, seed=1)
