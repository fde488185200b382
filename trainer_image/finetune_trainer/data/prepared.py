"""prepare(): train and validation data tokenized once and cached by content hash (or loaded from the cache)."""

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_operator.api.data import DataSpec
from finetune_trainer.data.encoding import TokenizeStats
from finetune_trainer.data.loading import Part, load_rows
from finetune_trainer.data.tokenizing import cache_key, load_cached, persist, split_validation, take, tokenize_parts
from finetune_trainer.errors import DataError


@dataclass
class PreparedData:
    train: Any
    eval: Any | None
    stats: dict[str, dict[str, int]] = field(default_factory=dict)


def nothing_trainable(kind: str, parts: list[Part], stats: TokenizeStats, data: DataSpec) -> str:
    """Why no row of `parts` gave a trainable example: the sources, what happened to the rows, and the first row
    as read (with the columns the format expects), so the user sees the mismatch instead of a dict of counts."""
    why = []
    if stats.dropped_too_long:
        why.append(f"{stats.dropped_too_long} longer than data.maxLength={data.max_length} (truncation: drop)")
    if stats.dropped_cut_before_reply:
        why.append(f"{stats.dropped_cut_before_reply} cut at data.maxLength={data.max_length} before their reply "
                   "began (the prompt alone fills it)")
    if stats.dropped_no_target:
        why.append(f"{stats.dropped_no_target} with nothing to learn (no reply, or an empty one, in the columns "
                   f"format {data.format} reads)")
    first = _first_row(parts)
    return (f"no trainable example in the {kind} data from {_sources(parts)}: {stats.rows} row(s)"
            + (f", {'; '.join(why)}" if why else "") + (f"; the first row ({first[0]}): {first[1]}" if first else "")
            + f"; check data.format ({data.format}), data.columns and data.maxLength")


def _first_row(parts: list[Part]) -> tuple[str, str] | None:
    for part in parts:
        try:
            row = next(iter(part.rows))
        except (StopIteration, TypeError):
            continue
        text = json.dumps(row, ensure_ascii=False, default=str)
        return f"{part.name}, row 1", text if len(text) <= 300 else text[:297] + "..."
    return None


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
        raise DataError(nothing_trainable("training", parts, train_stats, data))
    stats = {"train": train_stats.as_dict()}
    evaluation = None
    if eval_parts:
        if on_progress is not None:
            on_progress(f"tokenizing the validation data: {_rows(eval_parts)} rows")
        evaluation, eval_stats = tokenize_parts(eval_parts, data, tokenizer, tmp / "scratch-eval")
        stats["eval"] = eval_stats.as_dict()
        if len(evaluation) == 0:
            raise DataError(nothing_trainable("validation", eval_parts, eval_stats, data))

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
