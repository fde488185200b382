"""prepare(): train and validation data tokenized once and cached by content hash (or loaded from the cache)."""

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_operator.api.data import DataSpec
from finetune_trainer.data.loading import Part, load_rows
from finetune_trainer.data.tokenizing import cache_key, load_cached, persist, split_validation, take, tokenize_parts
from finetune_trainer.errors import DataError


@dataclass
class PreparedData:
    train: Any
    eval: Any | None
    stats: dict[str, dict[str, int]] = field(default_factory=dict)


def _rows(parts: list[Part]) -> str:
    return f"{sum(len(p.rows) for p in parts):,}"


def _sources(parts: list[Part]) -> str:
    return f"{len(parts)} source(s)" if len(parts) != 1 else parts[0].name


def prepare(data: DataSpec, tokenizer: Any, cache_dir: Path, seed: int,
            on_progress: Callable[[str], None] | None = None) -> PreparedData:
    """Tokenizes train/eval (or loads them from the cache); call it on the main process first."""

    target = cache_dir / cache_key(data, tokenizer)
    if (target / "complete").exists():
        train = load_cached(target / "train")
        evaluation = load_cached(target / "eval") if (target / "eval").exists() else None
        return PreparedData(train, evaluation, json.loads((target / "stats.json").read_text()))

    parts = load_rows(data.train, data)
    eval_parts = load_rows(data.validation, data) if data.validation else None
    if eval_parts is None:
        parts, eval_parts = split_validation(parts, data, seed)
    parts = take(parts, data.max_train_samples)
    if eval_parts is not None:
        eval_parts = take(eval_parts, data.max_eval_samples)

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    if on_progress is not None:
        on_progress(f"tokenizing the training data: {_rows(parts)} rows from {_sources(parts)}")
    train, train_stats = tokenize_parts(parts, data, tokenizer, tmp / "scratch")
    if len(train) == 0:
        raise DataError(f"no trainable example in the training data ({train_stats.as_dict()}); "
                        "check the format, the column mapping and maxLength")
    stats = {"train": train_stats.as_dict()}
    evaluation = None
    if eval_parts:
        if on_progress is not None:
            on_progress(f"tokenizing the validation data: {_rows(eval_parts)} rows")
        evaluation, eval_stats = tokenize_parts(eval_parts, data, tokenizer, tmp / "scratch-eval")
        stats["eval"] = eval_stats.as_dict()
        if len(evaluation) == 0:
            raise DataError(f"no trainable example in the validation data ({eval_stats.as_dict()}); "
                            "check its format and columns, or remove it")

    # Written to a temporary directory and renamed, so a crash never leaves a half cache that looks complete.
    persist(train, tmp / "train", tmp)
    if evaluation is not None:
        persist(evaluation, tmp / "eval", tmp)
    (tmp / "stats.json").write_text(json.dumps(stats))
    shutil.rmtree(tmp / "scratch", ignore_errors=True)
    shutil.rmtree(tmp / "scratch-eval", ignore_errors=True)
    (tmp / "complete").write_text("")
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; its cache is equivalent
        shutil.rmtree(tmp, ignore_errors=True)
    return prepare(data, tokenizer, cache_dir, seed)  # the saved copy: memory-mapped, not the scratch files
