"""data.streaming: the streamed examples are the cached path's examples; files stay shards; nothing is cached."""

import json
from collections import Counter

import pytest

from finetune_operator.api.data import DataSpec
from finetune_trainer import data as D
from finetune_trainer.data.streaming import prepare_streaming, tokenized_stream

ROWS = [{"instruction": f"What is {a} times {b}?", "output": f"{a * b}."} for a in range(1, 7) for b in range(1, 7)]
DOCS = [{"text": " ".join(f"word{i}-{j}" for j in range(i % 9 + 1))} for i in range(60)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def spec(tmp_path, rows, files=1, **kw) -> tuple[DataSpec, list[str]]:
    chunk = -(-len(rows) // files)
    paths = [write_jsonl(tmp_path / f"part-{i}.jsonl", rows[i * chunk:(i + 1) * chunk]) for i in range(files)]
    return DataSpec.model_validate({"format": "alpaca", "train": [{"path": str(tmp_path / "part-*.jsonl")}],
                                    "maxLength": 64, **kw}), paths


def as_tuples(examples):
    return Counter((tuple(e["input_ids"]), tuple(e["labels"])) for e in examples)


def test_streamed_sft_examples_are_the_cached_paths_examples_one_shard_per_file(tmp_path, tiny_tokenizer):
    data, paths = spec(tmp_path, ROWS, files=3)
    cached, stats = D.tokenize(D.load_rows(data.train, data), data, tiny_tokenizer)
    stream = tokenized_stream(D.load_rows(data.train, data, streaming=True), data, tiny_tokenizer)
    assert stream.n_shards == len(paths) == 3  # accelerate can hand each process its own files
    assert as_tuples(stream) == as_tuples(cached) and stats.kept == len(ROWS)


def test_streamed_text_blocks_equal_the_cached_blocks(tmp_path, tiny_tokenizer):
    data, _ = spec(tmp_path, DOCS, format="text", blockSize=16)
    cached, stats = D.tokenize(D.load_rows(data.train, data), data, tiny_tokenizer)
    streamed = list(tokenized_stream(D.load_rows(data.train, data, streaming=True), data, tiny_tokenizer))
    assert stats.kept > 5 and [e["input_ids"] for e in streamed] == cached["input_ids"]
    assert all(len(e["input_ids"]) == 16 and e["labels"] == e["input_ids"] for e in streamed)


def test_text_blocks_cut_as_they_go_match_cutting_the_whole_stream(tiny_tokenizer):
    data = DataSpec.model_validate({"format": "text", "train": [{"inline": DOCS}], "blockSize": 16})
    whole: list[int] = []
    for doc in DOCS:
        whole += tiny_tokenizer(doc["text"], add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    expected = [whole[i:i + 16] for i in range(0, len(whole) - 15, 16)]
    blocks, _ = D.tokenize(DOCS, data, tiny_tokenizer)
    assert blocks["input_ids"] == expected


def test_prepare_streaming_caps_shuffles_and_caches_nothing(tmp_path, tiny_tokenizer):
    data, _ = spec(tmp_path, ROWS, files=2, maxTrainSamples=10,
                   validation=[{"inline": ROWS[:5]}], maxEvalSamples=3)
    prepared = prepare_streaming(data, tiny_tokenizer, seed=3)
    train = list(prepared.train)
    assert len(train) == 10 and len(list(prepared.eval)) == 3
    in_file_order = list(tokenized_stream(D.load_rows(data.train, data, streaming=True), data, tiny_tokenizer).take(10))
    assert as_tuples(train) == as_tuples(in_file_order) and train != in_file_order  # same examples, shuffled
    assert not (tmp_path / ".cache").exists()


def test_a_missing_text_column_is_a_data_error_when_streamed(tmp_path, tiny_tokenizer):
    data, _ = spec(tmp_path, [{"body": "x"}], format="text")
    with pytest.raises(D.DataError, match="no 'text' column"):
        list(tokenized_stream(D.load_rows(data.train, data, streaming=True), data, tiny_tokenizer))
