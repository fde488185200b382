"""Rows -> a tokenized dataset with `datasets` (batched, in data.preprocessingWorkers processes, like
transformers' run_clm.py): SFT rows or documents cut into blocks, the validation split, the cache key and the
arrow files the cache keeps."""

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune_operator.api.data import DataSpec
from finetune_operator.api.storage import is_s3
from finetune_trainer import objectstore
from finetune_trainer.data.encoding import (
    FOLDED,
    KEPT,
    OUTCOMES,
    TRUNCATED,
    RowEncoder,
    TokenizeStats,
    fit_counted,
)
from finetune_trainer.data.loading import Part, files_of
from finetune_trainer.errors import DataError

CACHE_VERSION = "6"  # bump when tokenization changes, so stale caches are never reused
MAP_BATCH = 256


def _sft_batch(batch: dict[str, list[Any]], indices: list[int], encoder: RowEncoder, name: str
               ) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"input_ids": [], "labels": [], "status": [], "trainable": [], "folded": [],
                                 "length": [], "cut": [], "row": []}
    rows = [dict(zip(batch.keys(), values, strict=True)) for values in zip(*batch.values(), strict=True)]
    encoded = encoder.encode_batch(rows, [f"{name}, row {index + 1}" for index in indices])
    for index, (ids, labels, folded) in zip(indices, encoded, strict=True):
        out["length"].append(len(ids))  # before maxLength: the longest row is announced with the truncation
        ids, labels, status, learned, cut = fit_counted(ids, labels, encoder.data)
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["status"].append(status)
        out["folded"].append(folded)
        out["trainable"].append(learned)
        out["cut"].append(cut)
        out["row"].append(index + 1)  # what a message calls it: the first row of each outcome is named
    return out


def _documents_batch(batch: dict[str, list[Any]], indices: list[int], tokenizer: Any, column: str, name: str
                     ) -> dict[str, list[Any]]:
    texts = batch.get(column)
    if texts is None:
        raise DataError(f"{name}: text rows have no '{column}' column (columns: {sorted(batch)}); "
                        "map it with data.columns")
    for index, text in zip(indices, texts, strict=True):
        if not isinstance(text, str):
            raise DataError(f"{name}, row {index + 1}: '{column}' is {type(text).__name__}, expected text")
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return {"input_ids": [doc + [tokenizer.eos_token_id] for doc in ids]}  # one EOS after every document


def text_blocks(docs: Any, block: int, stats: TokenizeStats) -> Iterator[dict[str, list[int]]]:
    """Continued pretraining: tokenized documents (each ending in EOS), concatenated and cut into full blocks (the
    tail is dropped). Holds less than one block plus one document, so a corpus of any size is cut in bounded memory."""
    stream: list[int] = []
    for doc in docs:
        stats.rows += 1
        stream += doc["input_ids"]
        full = len(stream) // block * block
        for i in range(0, full, block):
            stats.kept += 1
            stats.tokens += block
            stats.trainable_tokens += block
            yield {"input_ids": stream[i: i + block], "labels": stream[i: i + block]}
        del stream[:full]


def tokenize_documents(part: Part, data: DataSpec, tokenizer: Any) -> Any:
    """A text Part's documents as token ids, each followed by EOS (lazily, when the part is streamed)."""
    kwargs: dict[str, Any] = {"batched": True, "batch_size": MAP_BATCH, "with_indices": True,
                              "remove_columns": _columns(part.rows),
                              "fn_kwargs": {"tokenizer": tokenizer, "column": data.columns.text or "text",
                                            "name": part.name}}
    if not _is_iterable(part.rows):
        kwargs.update(num_proc=_workers(data, part.rows), desc=f"tokenizing {Path(part.name).name}")
    return part.rows.map(_documents_batch, **kwargs)


def _is_iterable(rows: Any) -> bool:
    import datasets

    return isinstance(rows, datasets.IterableDataset)


def _columns(rows: Any) -> list[str] | None:
    names = getattr(rows, "column_names", None)
    return list(names) if names else None


def _workers(data: DataSpec, rows: Any) -> int | None:
    workers = min(data.preprocessing_workers, max(len(rows) // MAP_BATCH, 1))
    return workers if workers > 1 else None


# --- the whole preparation, cached ------------------------------------------------------------------------------
def cache_key(data: DataSpec, tokenizer: Any) -> str:
    """Hash of (data config, source contents or identities, tokenizer vocabulary and template)."""
    h = hashlib.sha256(CACHE_VERSION.encode())
    h.update(json.dumps(data.model_dump(mode="json", exclude={"preprocessing_workers"}), sort_keys=True).encode())
    for source in [*data.train, *(data.validation or [])]:
        if source.path is not None:
            for f in files_of(source.path, source.file_type):
                h.update(f"{f}:{_identity(f)}".encode())
    h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    h.update(str(tokenizer.chat_template).encode())
    h.update(f"{tokenizer.bos_token_id}:{tokenizer.eos_token_id}".encode())
    return h.hexdigest()[:20]


def _identity(path: str) -> str:
    """What changes when a file's contents change: size and mtime; an object's size and ETag."""
    if is_s3(path):
        info = objectstore.filesystem().info(path)
        return f"{info.get('size')}:{info.get('ETag') or info.get('LastModified')}"
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


def split_validation(parts: list[Part], data: DataSpec, seed: int) -> tuple[list[Part], list[Part] | None]:
    """validationSplitPercentage: held out of every part, so rows keep naming their file."""
    if data.validation_split_percentage <= 0:
        return parts, None
    train, evaluation = [], []
    for part in parts:
        if len(part.rows) < 2:
            train.append(part)
            continue
        split = part.rows.train_test_split(test_size=data.validation_split_percentage / 100, seed=seed)
        train.append(Part(part.name, split["train"]))
        evaluation.append(Part(part.name, split["test"]))
    return train, evaluation


def take(parts: list[Part], limit: int | None) -> list[Part]:
    if limit is None:
        return parts
    out = []
    for part in parts:
        if limit <= 0:
            break
        rows = part.rows.select(range(min(limit, len(part.rows))))
        out.append(Part(part.name, rows))
        limit -= len(rows)
    return out


def tokenize_parts(parts: list[Part], data: DataSpec, tokenizer: Any, scratch: Path) -> tuple[Any, TokenizeStats]:
    """The parts as one tokenized Dataset (input_ids, labels) and what happened to their rows."""
    import datasets

    stats = TokenizeStats()
    if data.format == "text":
        block = data.block_size or data.max_length
        docs = datasets.concatenate_datasets([tokenize_documents(p, data, tokenizer) for p in parts])
        scratch.mkdir(parents=True, exist_ok=True)
        blocks = datasets.Dataset.from_generator(
            text_blocks, gen_kwargs={"docs": docs, "block": block, "stats": stats},
            cache_dir=str(scratch), features=_features())
        if stats.rows == 0:  # the generator ran in this process: count again if it came from a cache
            stats.rows, stats.kept = len(docs), len(blocks)
            stats.tokens = stats.trainable_tokens = len(blocks) * block
        return blocks, stats
    encoder = RowEncoder.build(data, tokenizer)
    tokenized = []
    scratch.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(parts):
        # Written straight into the scratch directory: prepare() keeps these files as the cache (no rewrite).
        done = part.rows.map(_sft_batch, batched=True, batch_size=MAP_BATCH, with_indices=True,
                             num_proc=_workers(data, part.rows), remove_columns=part.rows.column_names,
                             fn_kwargs={"encoder": encoder, "name": part.name}, features=_sft_features(),
                             cache_file_name=str(scratch / f"part-{i:05d}.arrow"),
                             desc=f"tokenizing {Path(part.name).name}")
        before = stats.kept
        _count(stats, done, part.name)
        if stats.kept - before < len(done):  # some rows were dropped: a filter pass (skipped in the usual case)
            done = done.filter(lambda status: [s in (KEPT, TRUNCATED) for s in status], input_columns="status",
                               batched=True, batch_size=4096)
        tokenized.append(done.remove_columns(["status", "trainable", "folded", "length", "cut", "row"]))
    return datasets.concatenate_datasets(tokenized), stats


def tokenize(rows: list[dict[str, Any]] | list[Part], data: DataSpec, tokenizer: Any, scratch: Path | None = None
             ) -> tuple[Any, TokenizeStats]:
    """Rows (or Parts) tokenized as prepare() does, without its cache: for tests, benchmarks and the preflight."""
    import tempfile

    import datasets

    parts = rows if rows and isinstance(rows[0], Part) else [Part("rows", datasets.Dataset.from_list(list(rows)))]
    if scratch is not None:
        return tokenize_parts(parts, data, tokenizer, scratch)
    with tempfile.TemporaryDirectory() as tmp:
        tokenized, stats = tokenize_parts(parts, data, tokenizer, Path(tmp))
        return tokenized.flatten_indices() if len(tokenized) else tokenized, stats


def _count(stats: TokenizeStats, done: Any, name: str) -> None:
    """Row outcomes and token counts from the tokenized columns, as arrays (never the whole dataset as lists), and
    where the first row of each outcome is."""
    import numpy as np
    import pyarrow.compute as pc

    status = np.asarray(done.data.column("status"))
    kept = (status == KEPT) | (status == TRUNCATED)
    rows = np.asarray(done.data.column("row"))
    stats.rows += len(status)
    stats.kept += int(kept.sum())
    for outcome, counter in OUTCOMES.items():
        hit = status == outcome
        if hit.any():
            setattr(stats, counter, getattr(stats, counter) + int(hit.sum()))
            stats.example(counter, f"{name}, row {int(rows[hit.argmax()])}")
    folded = np.asarray(done.data.column("folded"))
    if folded.any():
        stats.example(FOLDED, f"{name}, row {int(rows[folded.argmax()])}")
    stats.trainable_tokens += int(np.asarray(done.data.column("trainable"))[kept].sum())
    stats.reply_tokens_cut += int(np.asarray(done.data.column("cut"))[kept].sum())
    stats.system_folded += int(folded.sum())
    if len(status):
        stats.longest = max(stats.longest, int(np.asarray(done.data.column("length")).max()))
    lengths = np.asarray(pc.list_value_length(done.data.column("input_ids")).fill_null(0))
    stats.tokens += int(lengths[kept].sum())


FILES_MANIFEST = "arrow-files.json"


def persist(dataset: Any, directory: Path, owned: Path) -> None:
    """The tokenized dataset under `directory`: its own arrow files moved there when it is nothing but whole files
    we wrote (the usual case: no rewrite of hundreds of MB), else a save_to_disk copy."""
    files = [Path(f["filename"]) for f in dataset.cache_files]
    if dataset._indices is None and files and all(owned in f.parents for f in files):
        directory.mkdir(parents=True)
        names = []
        for n, f in enumerate(files):
            name = f"{n:05d}.arrow"
            shutil.move(str(f), directory / name)
            names.append(name)
        (directory / FILES_MANIFEST).write_text(json.dumps({"files": names, "columns": dataset.column_names}))
        return
    dataset.save_to_disk(str(directory))


def load_cached(directory: Path) -> Any:
    import datasets

    manifest = directory / FILES_MANIFEST
    if not manifest.exists():
        return datasets.load_from_disk(str(directory))
    spec = json.loads(manifest.read_text())
    parts = [datasets.Dataset.from_file(str(directory / name)) for name in spec["files"]]
    return datasets.concatenate_datasets(parts).select_columns(spec["columns"])


def _sft_features():
    """What _sft_batch writes, in the narrowest types (half the bytes of the int64 lists arrow would infer)."""
    import datasets

    return datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                              "labels": datasets.Sequence(datasets.Value("int32")),
                              "status": datasets.Value("int8"), "trainable": datasets.Value("int32"),
                              "folded": datasets.Value("bool"), "length": datasets.Value("int32"),
                              "cut": datasets.Value("int32"), "row": datasets.Value("int64")})


def _features():
    import datasets

    return datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                              "labels": datasets.Sequence(datasets.Value("int32"))})
