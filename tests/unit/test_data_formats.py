"""Golden label masks for every format: only what the model should learn carries labels (the real EOS included)."""

import json

import pytest

from finetune_operator.api.data import DataSpec
from finetune_trainer import data as D
from finetune_trainer.data.collators import make_collator
from finetune_trainer.errors import DataError


def spec(**kw) -> DataSpec:
    return DataSpec.model_validate({"format": "alpaca", "train": [{"inline": [{"x": 1}]}], **kw})


def learned_text(tokenizer, row, **kw) -> tuple[str, list[int], list[int]]:
    ids, labels = D.RowEncoder.build(spec(**kw), tokenizer).encode(row)
    text = tokenizer.decode([t for t, lab in zip(ids, labels, strict=True) if lab != D.IGNORE_INDEX])
    return text, ids, labels


def test_alpaca_with_chat_template_learns_only_the_answer_and_its_eos(tiny_tokenizer):
    text, ids, labels = learned_text(tiny_tokenizer, {"instruction": "Name a colour.", "output": "Red."})
    assert text == "Red.</s>"
    # What inference sees: the template's text, no BOS it does not write.
    assert tiny_tokenizer.decode(ids) == "<|user|>\nName a colour.</s>\n<|assistant|>\nRed.</s>\n"
    assert ids == tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Red."}],
        tokenize=True, return_dict=True)["input_ids"]


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
    assert tokenizer.decode(ids) == tokenizer.decode(
        tokenizer("### Instruction:\nWhat is 2 + 2?\n\n### Response:\n4.")["input_ids"] + [tokenizer.eos_token_id])


def test_sharegpt_multi_turn_masks_system_and_human(tiny_tokenizer):
    row = {"system": "Be brief.", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
        {"from": "human", "value": "bye"}, {"from": "gpt", "value": "see you"}]}
    text, _, _ = learned_text(tiny_tokenizer, row, format="sharegpt")
    assert text == "hello</s>see you</s>"


def test_messages_format_with_column_mapping(tiny_tokenizer):
    row = {"chat": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    text, _, _ = learned_text(tiny_tokenizer, row, format="messages", columns={"messages": "chat"})
    assert text == "4</s>"


def test_openai_content_parts_are_joined_text(tiny_tokenizer):
    parts = [{"type": "text", "text": "Name "}, {"type": "text", "text": "a colour."}]
    row = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": [
        {"type": "text", "text": "Red."}]}]}
    text, ids, _ = learned_text(tiny_tokenizer, row, format="messages")
    assert text == "Red.</s>" and "Name a colour." in tiny_tokenizer.decode(ids)


@pytest.mark.parametrize(("messages", "match"), [
    ([{"role": "user", "content": None}, {"role": "assistant", "content": "x"}], r"message 1 \(user\) has no content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
      {"role": "assistant", "content": "x"}], r"content part 1: type 'image_url' is not supported"),
    ([{"role": "robot", "content": "x"}], r"message 1 has an unknown role: 'robot'"),
    ([{"role": "user", "content": 3}], r"content of type int"),
], ids=["null-content", "image-part", "unknown-role", "number-content"])
def test_unreadable_messages_are_data_errors_never_trained_as_repr(tiny_tokenizer, messages, match):
    with pytest.raises(DataError, match=match):
        learned_text(tiny_tokenizer, {"messages": messages}, format="messages")


def test_prompt_completion_is_tokenized_in_one_call(tiny_tokenizer):
    text, ids, _ = learned_text(tiny_tokenizer, {"prompt": "The sky is", "completion": " blue."},
                                format="prompt_completion")
    assert text == " blue.</s>"
    assert ids == tiny_tokenizer("The sky is blue.")["input_ids"] + [tiny_tokenizer.eos_token_id]


def test_a_prompt_ending_in_a_space_is_not_split_where_one_call_would_not_split(tiny_tokenizer):
    """'is ' + 'blue.' is the text 'is blue.': tokenized whole, the token carrying ' blue' is learned."""
    _, ids, labels = learned_text(tiny_tokenizer, {"prompt": "The sky is ", "completion": "blue."},
                                  format="prompt_completion")
    assert ids == tiny_tokenizer("The sky is blue.")["input_ids"] + [tiny_tokenizer.eos_token_id]
    learned = tiny_tokenizer.decode([t for t, lab in zip(ids, labels, strict=True) if lab != D.IGNORE_INDEX])
    assert learned.endswith("blue.</s>") and "sky" not in learned


def test_train_on_prompt_learns_everything(tiny_tokenizer):
    _, ids, labels = learned_text(tiny_tokenizer, {"instruction": "Hi.", "output": "Yo."}, trainOnPrompt=True)
    assert labels == ids


def test_missing_column_is_a_data_error_naming_the_mapping(tiny_tokenizer):
    with pytest.raises(DataError, match=r"no 'instruction' value .* map it with data.columns"):
        learned_text(tiny_tokenizer, {"question": "?", "output": "!"})


def test_unknown_sharegpt_role_is_a_data_error(tiny_tokenizer):
    with pytest.raises(DataError, match="unknown 'from'"):
        learned_text(tiny_tokenizer, {"conversations": [{"from": "robot", "value": "x"}]}, format="sharegpt")


def test_text_blocks_concatenate_with_eos_and_drop_the_tail(tiny_tokenizer):
    rows = [{"text": "one two three four five"}, {"text": "six seven eight nine ten"}] * 3
    examples, stats = D.tokenize(rows, spec(format="text", blockSize=16), tiny_tokenizer)
    stream = []
    for row in rows:
        stream += tiny_tokenizer(row["text"], add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    assert examples["input_ids"] == [stream[i:i + 16] for i in range(0, len(stream) - 15, 16)]
    assert examples["labels"] == examples["input_ids"]
    assert stats.kept == len(stream) // 16 and stats.rows == 6


@pytest.mark.parametrize(("policy", "kept", "truncated", "dropped"), [
    ("truncate", 2, 1, 0), ("drop", 1, 0, 1)], ids=["truncate", "drop"])
def test_truncation_policy_is_counted(tiny_tokenizer, policy, kept, truncated, dropped):
    rows = [{"instruction": "Hi.", "output": "Yo."}, {"instruction": "Hi.", "output": "word " * 40}]
    examples, stats = D.tokenize(rows, spec(maxLength=24, truncation=policy), tiny_tokenizer)
    assert (stats.kept, stats.truncated, stats.dropped_too_long) == (kept, truncated, dropped)
    assert len(examples) == kept and all(len(ids) <= 24 for ids in examples["input_ids"])


def test_sample_whose_answer_is_truncated_away_is_dropped_and_counted(tiny_tokenizer):
    rows = [{"instruction": "word " * 40, "output": "Yo."}]
    examples, stats = D.tokenize(rows, spec(maxLength=16), tiny_tokenizer)
    assert len(examples) == 0 and stats.dropped_cut_before_reply == 1 and stats.dropped_no_target == 0


def test_padding_is_masked_by_attention_mask_not_by_token_id(tiny_tokenizer):
    """pad == eos: the real EOS at the end of an answer keeps its label; padding gets -100 and mask 0."""
    assert tiny_tokenizer.pad_token_id == tiny_tokenizer.eos_token_id
    rows = [{"instruction": "Hi.", "output": "Yo."}, {"instruction": "Name a colour.", "output": "Red is one."}]
    examples = list(D.tokenize(rows, spec(), tiny_tokenizer)[0])
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

    from finetune_trainer.data import prepared

    monkeypatch.setattr(prepared, "tokenize_parts", no_tokenizing)  # what prepare() calls
    second = D.prepare(data, tiny_tokenizer, tmp_path / "cache", seed=1)
    assert second.train["input_ids"] == first.train["input_ids"]
    data_file.write_text(data_file.read_text() + "\n" + json.dumps({"instruction": "new", "output": "row"}))
    with pytest.raises(AssertionError, match="tokenized again"):
        D.prepare(data, tiny_tokenizer, tmp_path / "cache", seed=1)  # changed data -> new key -> re-tokenize


def test_no_trainable_example_is_a_data_error_naming_the_source_the_counts_and_a_row(tiny_tokenizer, tmp_path):
    data = spec(train=[{"inline": [{"instruction": "word " * 50, "output": "x"}]}], maxLength=16)
    with pytest.raises(DataError, match="no trainable example") as caught:
        D.prepare(data, tiny_tokenizer, tmp_path, seed=1)
    text = str(caught.value)
    assert "from inline rows: 1 row(s), 1 cut at data.maxLength=16 before their reply began" in text, text
    assert 'the first row (inline rows, row 1): {"instruction": "word word' in text, text
    # A file whose prompts fill maxLength: its name, the count and the first row show why.
    rows = tmp_path / "long-prompts.jsonl"
    rows.write_text("".join(json.dumps({"instruction": "word " * 50, "output": "x"}) + "\n" for _ in range(2)))
    with pytest.raises(DataError) as caught:
        D.prepare(spec(train=[{"path": str(rows)}], maxLength=16), tiny_tokenizer, tmp_path / "c2", seed=1)
    text = str(caught.value)
    assert f"from {rows}: 2 row(s), 2 cut at data.maxLength=16 before their reply began" in text, text
    assert f'the first row ({rows}, row 1): {{"instruction": "word word' in text, text


def test_missing_file_is_a_data_error(tiny_tokenizer, tmp_path):
    with pytest.raises(DataError, match="no data file"):
        D.prepare(spec(train=[{"path": str(tmp_path / "nope.jsonl")}]), tiny_tokenizer, tmp_path, seed=1)


# --- permanent data problems name the file and the row -----------------------------------------------------------
def write(path, text):
    path.write_text(text)
    return str(path)


def test_malformed_jsonl_names_the_file_and_line(tiny_tokenizer, tmp_path):
    good = json.dumps({"instruction": "Q", "output": "A"})
    path = write(tmp_path / "train.jsonl", f"{good}\n{good}\n{{\"instruction\": \"Q\", \"output\": \n{good}\n")
    with pytest.raises(DataError, match=r"train.jsonl, line 3: not valid JSON"):
        D.prepare(spec(train=[{"path": path}]), tiny_tokenizer, tmp_path / "cache", seed=1)


def test_empty_file_is_a_data_error_naming_it(tiny_tokenizer, tmp_path):
    path = write(tmp_path / "empty.jsonl", "")
    with pytest.raises(DataError, match=r"empty.jsonl: the file is empty"):
        D.prepare(spec(train=[{"path": path}]), tiny_tokenizer, tmp_path / "cache", seed=1)


def test_a_bad_row_names_its_file_and_row_number(tiny_tokenizer, tmp_path):
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}] * 4
    rows.append({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]})
    (tmp_path / "data").mkdir()
    write(tmp_path / "data" / "a.jsonl", json.dumps(rows[0]) + "\n")
    path = write(tmp_path / "data" / "b.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=rf"{path}, row 5: message 2 \(assistant\) has no content \(null\)"):
        D.prepare(spec(format="messages", train=[{"path": str(tmp_path / "data")}]), tiny_tokenizer,
                  tmp_path / "cache", seed=1)


def test_validation_data_without_a_trainable_row_is_a_data_error(tiny_tokenizer, tmp_path):
    data = spec(train=[{"inline": [{"instruction": "Q", "output": "A"}]}],
                validation=[{"inline": [{"instruction": "word " * 50, "output": "x"}]}], maxLength=16)
    with pytest.raises(DataError, match="no trainable example in the validation data"):
        D.prepare(data, tiny_tokenizer, tmp_path, seed=1)


def test_many_workers_tokenize_the_same_examples(tiny_tokenizer, tmp_path):
    rows = [{"instruction": f"What is {a} plus {b}?", "output": f"{a + b}."} for a in range(40) for b in range(20)]
    path = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    one = D.prepare(spec(train=[{"path": path}]), tiny_tokenizer, tmp_path / "one", seed=1)
    two = D.prepare(spec(train=[{"path": path}], preprocessingWorkers=2), tiny_tokenizer, tmp_path / "two", seed=1)
    assert len(one.train) == len(rows) and one.train["input_ids"] == two.train["input_ids"]
    assert one.stats == two.stats


# --- continued pretraining on real text ---------------------------------------------------------------------------
PROSE = "The fox ran.\nIt was quick.\n\nThe dog slept.\nIt was lazy.\n"
CODE = "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n"


@pytest.mark.parametrize(("split", "documents"), [
    ("document", [PROSE, CODE]),
    ("paragraph", ["The fox ran.\nIt was quick.", "The dog slept.\nIt was lazy.\n", "def add(a, b):\n    return a + b",
                   "\nprint(add(1, 2))\n"]),
], ids=["document", "paragraph"])
def test_a_text_file_is_a_document_with_its_newlines(tiny_tokenizer, tmp_path, split, documents):
    (tmp_path / "corpus").mkdir()
    write(tmp_path / "corpus" / "a-prose.txt", PROSE)
    write(tmp_path / "corpus" / "b-code.txt", CODE)
    data = spec(format="text", blockSize=16, textSplit=split, train=[{"path": str(tmp_path / "corpus")}])
    parts = D.load_rows(data.train, data)
    assert [row["text"] for part in parts for row in part.rows] == documents
    blocks, stats = D.tokenize(parts, data, tiny_tokenizer)
    stream = []
    for doc in documents:
        stream += tiny_tokenizer(doc, add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    assert blocks["input_ids"] == [stream[i:i + 16] for i in range(0, len(stream) - 15, 16)]
    assert stream.count(tiny_tokenizer.eos_token_id) == len(documents)  # one EOS between documents, none per line
    assert stats.rows == len(documents)


def test_jsonl_text_rows_are_one_document_each(tiny_tokenizer, tmp_path):
    path = write(tmp_path / "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in (PROSE, CODE)))
    data = spec(format="text", blockSize=16, train=[{"path": path}])
    assert [r["text"] for p in D.load_rows(data.train, data) for r in p.rows] == [PROSE, CODE]


def test_text_split_applies_to_format_text_only():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="textSplit applies to format text only"):
        spec(textSplit="line")


# --- the model's limits and what the trained model carries --------------------------------------------------------
def test_a_sequence_longer_than_the_models_positions_is_refused(tiny_model_dir):
    from transformers import AutoConfig

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.errors import ConfigError
    from finetune_trainer.training.model import check_lengths

    config = AutoConfig.from_pretrained(tiny_model_dir)
    base = {"model": {"name": str(tiny_model_dir)}, "data": {"format": "text", "train": [{"inline": [{"text": "x"}]}]}}
    job = FineTuneJobSpec.model_validate({**base, "data": {**base["data"], "blockSize": 8192}})
    with pytest.raises(ConfigError, match=r"spec.data.blockSize is 8192 but .* max_position_embeddings 4096"):
        check_lengths(job, config)
    check_lengths(FineTuneJobSpec.model_validate({**base, "data": {**base["data"], "blockSize": 4096}}), config)


def test_a_tokenizer_without_a_template_gets_one_that_ends_turns_with_its_eos(tiny_model_dir, tmp_path):
    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.data.chat import DEFAULT_CHAT_TEMPLATE, ChatEncoder
    from finetune_trainer.training.model import load_tokenizer

    bare = tmp_path / "bare"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    job = FineTuneJobSpec.model_validate({"model": {"name": str(tiny_model_dir), "tokenizer": str(bare)},
                                          "data": {"format": "messages", "train": [{"inline": [{"x": 1}]}]}})
    loaded = load_tokenizer(job)
    assert loaded.chat_template == DEFAULT_CHAT_TEMPLATE
    encoder = ChatEncoder.for_tokenizer(loaded)
    assert encoder.end_markers == (loaded.eos_token,)
    ids, labels = encoder.encode([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    assert labels[-2] == loaded.eos_token_id  # the reply's EOS is learned (the newline after it is not)


def test_a_flash_attention_kernel_the_image_lacks_is_refused_with_the_way_out(tiny_model_dir):
    import importlib.util

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.errors import ConfigError
    from finetune_trainer.training.model import check_attention

    assert importlib.util.find_spec("flash_attn") is None, "the images and the test venv ship no flash-attn"
    base = {"model": {"name": str(tiny_model_dir)}, "distributed": {"gpusPerNode": 8},
            "data": {"format": "text", "train": [{"inline": [{"text": "x"}]}]}}
    flash = FineTuneJobSpec.model_validate({**base,
                                            "model": {**base["model"], "attnImplementation": "flash_attention_2"}})
    with pytest.raises(ConfigError, match=r"attnImplementation is flash_attention_2, .*no flash_attn .*use sdpa"):
        check_attention(flash)
    check_attention(FineTuneJobSpec.model_validate(base))


def test_the_stats_keep_the_longest_row_before_max_length(tiny_tokenizer, tmp_path):
    """What the RowsTruncated warning says: how long the longest row was, so the user can pick a maxLength."""
    rows = [{"instruction": "word " * 40, "output": "x"}, {"instruction": "Q", "output": "A"}]
    data = spec(train=[{"inline": rows}], maxLength=32)
    prepared = D.prepare(data, tiny_tokenizer, tmp_path, seed=1)
    stats = prepared.stats["train"]
    assert stats["truncated"] + stats["dropped_cut_before_reply"] == 1  # the first row: its prompt fills 32
    assert stats["longest"] > 40, stats


def _page_rows() -> dict[str, dict]:
    """docs/tasks/data-formats.md's sample row of each format, under its `### \\`format\\`` heading."""
    import re

    from tests.conftest import ROOT

    page = (ROOT / "docs" / "tasks" / "data-formats.md").read_text()
    return {m.group(1): json.loads(m.group(2))
            for m in re.finditer(r"^### `(\w+)`\n\n```json\n(.*?)\n```", page, re.M | re.S)}


def test_the_data_formats_page_shows_a_row_of_every_format_and_each_trains():
    """Every format of the API has a sample row on the page, and the trainer reads it into something to learn."""
    from typing import get_args

    from finetune_operator.api.data import DataFormat

    assert sorted(_page_rows()) == sorted(get_args(DataFormat))


@pytest.mark.parametrize("fmt", ["alpaca", "sharegpt", "messages", "prompt_completion"])
def test_the_pages_sample_row_of_a_chat_or_completion_format_has_tokens_to_learn(tiny_tokenizer, fmt):
    _, _, labels = learned_text(tiny_tokenizer, _page_rows()[fmt], format=fmt)
    assert any(label != D.IGNORE_INDEX for label in labels)


@pytest.mark.parametrize("fmt", ["preference", "unpaired"])
def test_the_pages_sample_pair_or_example_is_read_as_written(tiny_tokenizer, fmt):
    from finetune_trainer.data.preference import checked_pair

    row = _page_rows()[fmt]
    pair = checked_pair(row, spec(format=fmt), tiny_tokenizer, "data-formats.md")
    assert pair["prompt"] == row["prompt"] and (pair.get("label") is True or pair["chosen"] == row["chosen"])


def test_the_pages_text_row_is_a_document_cut_into_blocks(tiny_tokenizer):
    from finetune_trainer.data.tokenizing import tokenize

    blocks, _ = tokenize([_page_rows()["text"]] * 4, spec(format="text", maxLength=16), tiny_tokenizer)
    assert len(blocks) >= 1 and all(len(b["input_ids"]) == 16 for b in blocks)
