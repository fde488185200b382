"""Data: sources -> rows -> segments -> token ids with labels; tokenized once and cached by content hash."""

import glob
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_operator.api.data import DataSource, DataSpec

from . import formats
from .errors import DataError

IGNORE_INDEX = -100
EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text",
              ".text": "text"}
CACHE_VERSION = "1"  # bump when tokenization changes, so stale caches are never reused


@dataclass
class TokenizeStats:
    rows: int = 0
    kept: int = 0
    truncated: int = 0
    dropped_too_long: int = 0
    dropped_no_target: int = 0
    trainable_tokens: int = 0
    tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class PreparedData:
    train: Any
    eval: Any | None
    stats: dict[str, dict[str, int]] = field(default_factory=dict)


# --- loading ----------------------------------------------------------------------------------------------------
def _files_of(path: str) -> list[str]:
    if os.path.isdir(path):
        found = sorted(p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True)
                       if Path(p).suffix in EXTENSIONS)
    else:
        found = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    missing = [p for p in found if not os.path.isfile(p)]
    if not found or missing:
        raise DataError(f"no data file at {path}" + (f" (missing: {missing[:3]})" if missing else ""))
    return found


def load_source(source: DataSource, streaming: bool = False):
    """One source as a datasets.Dataset (or IterableDataset when streaming)."""
    import datasets

    try:
        if source.inline is not None:
            rows = datasets.Dataset.from_list(list(source.inline))
            return rows.to_iterable_dataset() if streaming else rows
        if source.hub is not None:
            hub = source.hub
            return datasets.load_dataset(hub.name, hub.config, split=hub.split, revision=hub.revision,
                                         streaming=streaming)
        files = _files_of(str(source.path))
        kinds = {source.file_type or EXTENSIONS.get(Path(f).suffix) for f in files}
        if None in kinds or len(kinds) != 1:
            raise DataError(f"cannot tell the file type of {source.path} ({sorted(map(str, kinds))}); set fileType")
        kind = "json" if kinds == {"jsonl"} else kinds.pop()
        return datasets.load_dataset(kind, data_files=files, split="train", streaming=streaming)
    except DataError:
        raise
    except Exception as exc:  # datasets raises many types for unreadable data; all are data errors to the user
        raise DataError(f"cannot load {source.model_dump(exclude_none=True, by_alias=True)}: {exc}") from exc


def load_rows(sources: list[DataSource], streaming: bool = False):
    import datasets

    parts = [load_source(s, streaming) for s in sources]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


# --- tokenization ----------------------------------------------------------------------------------------------
def row_segments(row: dict[str, Any], data: DataSpec, tokenizer) -> formats.Segments:
    eos = tokenizer.eos_token or ""
    columns, fmt = data.columns, data.format
    if fmt == "prompt_completion":
        return formats.prompt_completion_segments(row, columns, eos)
    if fmt == "alpaca" and not tokenizer.chat_template:
        return formats.alpaca_plain_segments(row, columns, eos)
    messages = {"alpaca": formats.alpaca_messages, "sharegpt": formats.sharegpt_messages,
                "messages": formats.messages_messages}[fmt](row, columns)
    template = tokenizer.chat_template or formats.DEFAULT_CHAT_TEMPLATE

    def render(msgs, add_generation_prompt):
        if not msgs:
            return ""
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             chat_template=template)

    return formats.chat_segments(messages, render)


def tokenize_segments(segments: formats.Segments, tokenizer, train_on_prompt: bool) -> tuple[list[int], list[int]]:
    """Token ids and labels; untrainable segments get IGNORE_INDEX unless the whole sample is trained on."""
    input_ids: list[int] = []
    labels: list[int] = []
    if tokenizer.bos_token_id is not None and not (segments and segments[0][0].startswith(tokenizer.bos_token)):
        input_ids.append(tokenizer.bos_token_id)
        labels.append(IGNORE_INDEX)
    for text, trainable in segments:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids += ids
        labels += ids if (trainable or train_on_prompt) else [IGNORE_INDEX] * len(ids)
    return input_ids, labels


def sft_example(row: dict[str, Any], data: DataSpec, tokenizer, stats: TokenizeStats) -> dict[str, list[int]] | None:
    """One row -> token ids and labels, or None when it is dropped (too long under truncation drop, no target)."""
    stats.rows += 1
    ids, labels = tokenize_segments(row_segments(row, data, tokenizer), tokenizer, data.train_on_prompt)
    if len(ids) > data.max_length:
        if data.truncation == "drop":
            stats.dropped_too_long += 1
            return None
        stats.truncated += 1
        ids, labels = ids[: data.max_length], labels[: data.max_length]
    trainable = sum(1 for t in labels if t != IGNORE_INDEX)
    if trainable == 0:
        stats.dropped_no_target += 1
        return None
    stats.kept += 1
    stats.trainable_tokens += trainable
    stats.tokens += len(ids)
    return {"input_ids": ids, "labels": labels}


def tokenize_sft(rows, data: DataSpec, tokenizer) -> tuple[list[dict[str, list[int]]], TokenizeStats]:
    stats = TokenizeStats()
    examples = [e for e in (sft_example(row, data, tokenizer, stats) for row in rows) if e is not None]
    return examples, stats


def text_blocks(rows, data: DataSpec, tokenizer, stats: TokenizeStats) -> Iterator[dict[str, list[int]]]:
    """Continued pretraining: every document + EOS, concatenated and cut into full blocks (the tail is dropped).

    A generator holding less than one block plus one document, so a stream of any length is cut the same way."""
    block = data.block_size or data.max_length
    column = data.columns.text or "text"
    stream: list[int] = []
    for row in rows:
        stats.rows += 1
        text = row.get(column)
        if text is None:
            raise DataError(f"text row has no '{column}' column (columns: {sorted(row)}); map it with data.columns")
        stream += tokenizer(str(text), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        full = len(stream) // block * block
        for i in range(0, full, block):
            stats.kept += 1
            stats.tokens += block
            stats.trainable_tokens += block
            yield {"input_ids": stream[i: i + block], "labels": stream[i: i + block]}
        del stream[:full]


def tokenize_text_blocks(rows, data: DataSpec, tokenizer) -> tuple[list[dict[str, list[int]]], TokenizeStats]:
    stats = TokenizeStats()
    return list(text_blocks(rows, data, tokenizer, stats)), stats


def tokenize(rows, data: DataSpec, tokenizer):
    fn = tokenize_text_blocks if data.format == "text" else tokenize_sft
    return fn(rows, data, tokenizer)


# --- the whole preparation, cached ------------------------------------------------------------------------------
def cache_key(data: DataSpec, tokenizer) -> str:
    """Hash of (data config, source contents or identities, tokenizer vocabulary and template)."""
    h = hashlib.sha256(CACHE_VERSION.encode())
    h.update(json.dumps(data.model_dump(mode="json", exclude={"preprocessing_workers"}), sort_keys=True).encode())
    for source in [*data.train, *(data.validation or [])]:
        if source.path is not None:
            for f in _files_of(source.path):
                st = os.stat(f)
                h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    h.update(str(tokenizer.chat_template).encode())
    h.update(f"{tokenizer.bos_token_id}:{tokenizer.eos_token_id}".encode())
    return h.hexdigest()[:20]


def prepare(data: DataSpec, tokenizer, cache_dir: Path, seed: int) -> PreparedData:
    """Tokenizes train/eval (or loads them from the cache); call it on the main process first."""
    import datasets

    target = cache_dir / cache_key(data, tokenizer)
    if (target / "complete").exists():
        train = datasets.load_from_disk(str(target / "train"))
        evaluation = datasets.load_from_disk(str(target / "eval")) if (target / "eval").exists() else None
        return PreparedData(train, evaluation, json.loads((target / "stats.json").read_text()))

    rows = load_rows(data.train)
    eval_rows = load_rows(data.validation) if data.validation else None
    if eval_rows is None and data.validation_split_percentage > 0:
        split = rows.train_test_split(test_size=data.validation_split_percentage / 100, seed=seed)
        rows, eval_rows = split["train"], split["test"]
    if data.max_train_samples is not None:
        rows = rows.select(range(min(data.max_train_samples, len(rows))))
    if eval_rows is not None and data.max_eval_samples is not None:
        eval_rows = eval_rows.select(range(min(data.max_eval_samples, len(eval_rows))))

    train_examples, train_stats = tokenize(rows, data, tokenizer)
    if not train_examples:
        raise DataError(f"no trainable example in the training data ({train_stats.as_dict()}); "
                        "check the format, the column mapping and maxLength")
    stats = {"train": train_stats.as_dict()}
    train = datasets.Dataset.from_list(train_examples)
    evaluation = None
    if eval_rows is not None:
        eval_examples, eval_stats = tokenize(eval_rows, data, tokenizer)
        stats["eval"] = eval_stats.as_dict()
        evaluation = datasets.Dataset.from_list(eval_examples) if eval_examples else None

    # Written to a temporary directory and renamed, so a crash never leaves a half cache that looks complete.
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    train.save_to_disk(str(tmp / "train"))
    if evaluation is not None:
        evaluation.save_to_disk(str(tmp / "eval"))
    (tmp / "stats.json").write_text(json.dumps(stats))
    (tmp / "complete").write_text("")
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; its cache is equivalent
        pass
    return PreparedData(train, evaluation, stats)
