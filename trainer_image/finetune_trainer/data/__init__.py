"""Data: sources -> rows -> token ids with labels, tokenized once with `datasets` (batched, in
data.preprocessingWorkers processes, like transformers' run_clm.py) and cached by content hash.

Every row keeps where it came from, so a bad row is a DataError naming its file and row number (exit 65: the data
must change, retrying cannot help)."""

import glob
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_operator.api.data import DataSource, DataSpec
from finetune_operator.api.storage import is_s3
from finetune_trainer import objectstore
from finetune_trainer.data import formats
from finetune_trainer.data.chat import IGNORE_INDEX, ChatEncoder, Encoded, labels_from_spans
from finetune_trainer.errors import DataError

EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text",
              ".text": "text", ".md": "text"}
CACHE_VERSION = "4"  # bump when tokenization changes, so stale caches are never reused
# Past this many files a directory or glob is loaded as one dataset (rows then name the pattern, not the file).
MAX_FILES_ONE_BY_ONE = 64
# What happened to each row (the `status` column of the tokenized dataset).
KEPT, TRUNCATED, DROPPED_TOO_LONG, DROPPED_NO_TARGET = 0, 1, 2, 3
MAP_BATCH = 256
__all__ = ["IGNORE_INDEX", "PreparedData", "TokenizeStats", "prepare", "load_rows", "sft_example", "text_blocks"]


@dataclass
class TokenizeStats:
    rows: int = 0
    kept: int = 0
    truncated: int = 0
    dropped_too_long: int = 0
    dropped_no_target: int = 0
    trainable_tokens: int = 0
    tokens: int = 0
    system_folded: int = 0  # rows whose system prompt the template refused, folded into the first user turn

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    def count(self, status: int, ids: list[int], labels: list[int], folded: bool = False) -> None:
        self.rows += 1
        self.system_folded += folded
        if status == DROPPED_TOO_LONG:
            self.dropped_too_long += 1
        elif status == DROPPED_NO_TARGET:
            self.dropped_no_target += 1
        else:
            self.kept += 1
            self.truncated += status == TRUNCATED
            self.tokens += len(ids)
            self.trainable_tokens += sum(1 for t in labels if t != IGNORE_INDEX)


@dataclass
class PreparedData:
    train: Any
    eval: Any | None
    stats: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Part:
    """Rows of one file (or one hub split, or the inline rows), and how a message names them."""

    name: str
    rows: Any  # datasets.Dataset or IterableDataset


# --- loading ----------------------------------------------------------------------------------------------------
def _files_of(path: str) -> list[str]:
    if is_s3(path):
        return _objects_of(path)
    if os.path.isdir(path):
        found = sorted(p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True)
                       if Path(p).suffix in EXTENSIONS)
    else:
        found = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    missing = [p for p in found if not os.path.isfile(p)]
    if not found or missing:
        raise DataError(f"no data file at {path}" + (f" (missing: {missing[:3]})" if missing else ""))
    return found


def _objects_of(uri: str) -> list[str]:
    """s3:// files: a glob, every data file under a prefix, or one object; none is a DataError naming the URI."""
    fs = objectstore.filesystem()
    try:
        if glob.has_magic(uri):
            found = sorted(fs.glob(uri))
        elif fs.isfile(uri):
            found = [uri]
        else:
            found = sorted(k for k in fs.find(uri.rstrip("/") + "/") if Path(k).suffix in EXTENSIONS)
    except Exception as exc:  # s3fs and botocore raise many types
        raise objectstore.failure(exc, uri) from exc
    if not found:
        raise DataError(f"no data file at {uri} (the bucket has no object matching it)")
    return [f"s3://{k.removeprefix('s3://')}" for k in found]


def _size(path: str) -> int:
    return int(objectstore.filesystem().size(path)) if is_s3(path) else os.path.getsize(path)


def load_source(source: DataSource, data: DataSpec, streaming: bool = False) -> list[Part]:
    """One source as Parts: a file is a part (so a row names its file), a hub split or the inline rows are one."""
    import datasets

    if source.inline is not None:
        rows = datasets.Dataset.from_list(list(source.inline))
        return [Part("inline rows", rows.to_iterable_dataset() if streaming else rows)]
    if source.hub is not None:
        hub = source.hub
        name = f"hub dataset {hub.name}" + (f" ({hub.config})" if hub.config else "") + f" split {hub.split}"
        try:
            rows = datasets.load_dataset(hub.name, hub.config, split=hub.split, revision=hub.revision,
                                         streaming=streaming)
        except Exception as exc:  # datasets raises many types for unreachable or unreadable data
            raise DataError(f"cannot load {name}: {exc}") from exc
        return [Part(name, rows)]
    files = _files_of(str(source.path))
    kinds = {source.file_type or EXTENSIONS.get(Path(f).suffix) for f in files}
    if None in kinds or len(kinds) != 1:
        raise DataError(f"cannot tell the file type of {source.path} ({sorted(map(str, kinds))}); set fileType")
    kind = kinds.pop()
    groups = [[f] for f in files] if len(files) <= MAX_FILES_ONE_BY_ONE else [files]
    return [Part(group[0] if len(group) == 1 else str(source.path), _load_files(group, kind, data, streaming))
            for group in groups]


def _load_files(files: list[str], kind: str, data: DataSpec, streaming: bool):
    import datasets

    kwargs: dict[str, Any] = {}
    if kind == "text":
        # A text file is one document by default: newlines kept, one EOS after it (data.textSplit).
        kwargs = {"sample_by": data.text_split, "keep_linebreaks": True}
    loader = "json" if kind == "jsonl" else kind
    if any(is_s3(f) for f in files):
        kwargs["storage_options"] = objectstore.storage_options()  # datasets reads them through fsspec's s3fs
        objectstore.allow_datasets_remote_files()
    for f in files:
        if _size(f) == 0:
            raise DataError(f"{f}: the file is empty")
    try:
        rows = datasets.load_dataset(loader, data_files=files, split="train", streaming=streaming, **kwargs)
    except Exception as exc:  # pyarrow's JSON errors carry no line number: find the bad line ourselves
        if loader == "json":
            for f in files:
                _check_json_lines(f)
        raise DataError(f"cannot read {', '.join(files[:3])}: {exc}") from exc
    if not streaming and len(rows) == 0:
        raise DataError(f"{', '.join(files[:3])}: no rows")
    return rows


def _check_json_lines(path: str) -> None:
    """Raises a DataError naming the first malformed line of a JSON Lines file (a .json array is left to datasets)."""
    opener = objectstore.filesystem().open if is_s3(path) else open
    with opener(path, "r", encoding="utf-8", errors="replace") as f:
        first = f.read(1)
        if first == "[":
            return
        f.seek(0)
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}, line {number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(value, dict):
                raise DataError(f"{path}, line {number}: a row must be a JSON object, got {type(value).__name__}")


def load_rows(sources: list[DataSource], data: DataSpec, streaming: bool = False) -> list[Part]:
    return [part for s in sources for part in load_source(s, data, streaming)]


# --- one row -> ids and labels ----------------------------------------------------------------------------------
def uses_chat_template(data: DataSpec, tokenizer: Any) -> bool:
    """Rows are rendered with the chat template: conversations always, Alpaca rows when the tokenizer has one."""
    return data.format in ("sharegpt", "messages") or (data.format == "alpaca" and bool(tokenizer.chat_template))


@dataclass(frozen=True)
class RowEncoder:
    """What turns a row into (ids, labels) for one data spec and tokenizer; picklable for worker processes."""

    data: DataSpec
    tokenizer: Any
    chat: ChatEncoder | None

    @classmethod
    def build(cls, data: DataSpec, tokenizer: Any) -> "RowEncoder":
        chat = ChatEncoder.for_tokenizer(tokenizer) if uses_chat_template(data, tokenizer) else None
        return cls(data, tokenizer, chat)

    def encode(self, row: dict[str, Any]) -> tuple[list[int], list[int]]:
        ids, labels, _ = self.encode_row(row)
        return ids, labels

    def encode_row(self, row: dict[str, Any]) -> Encoded:
        fmt, columns = self.data.format, self.data.columns
        if self.chat is not None:
            return self.chat.encode_many([formats.CHAT_FORMATS[fmt](row, columns)], self.data.train_on_prompt)[0]
        prompt, completion = (formats.alpaca_prompt if fmt == "alpaca" else formats.prompt_completion)(row, columns)
        return Encoded(*encode_completion(prompt, completion, self.tokenizer, self.data.train_on_prompt), False)

    def encode_batch(self, rows: list[dict[str, Any]], where: list[str]) -> list[Encoded]:
        """Rows encoded together (conversations tokenized in one call); a bad row is a DataError naming `where`."""
        if self.chat is None:
            return [_named(where[i], self.encode_row, row) for i, row in enumerate(rows)]
        fmt, columns = self.data.format, self.data.columns
        conversations = [_named(where[i], formats.CHAT_FORMATS[fmt], row, columns) for i, row in enumerate(rows)]
        try:
            return self.chat.encode_many(conversations, self.data.train_on_prompt)
        except DataError:  # a template refused one of them: say which
            for i, conversation in enumerate(conversations):
                _named(where[i], self.chat.encode, conversation)
            raise


def _named(where: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None


def encode_completion(prompt: str, completion: str, tokenizer: Any, train_on_prompt: bool = False
                      ) -> tuple[list[int], list[int]]:
    """prompt + completion tokenized in one call, as `tokenizer(text)` at inference (its BOS if it adds one), then
    the real EOS; the completion and the EOS are learned (a token straddling the boundary is learned too)."""
    text = prompt + completion
    encoded = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
        offsets.append((len(text), len(text) + 1))
    spans = [(0, len(text) + 1)] if train_on_prompt else [(len(prompt), len(text) + 1)]
    return ids, labels_from_spans(ids, offsets, spans)


def fit(ids: list[int], labels: list[int], data: DataSpec) -> tuple[list[int], list[int], int]:
    """maxLength and truncation applied: (ids, labels, status)."""
    ids, labels, status, _ = fit_counted(ids, labels, data)
    return ids, labels, status


def fit_counted(ids: list[int], labels: list[int], data: DataSpec) -> tuple[list[int], list[int], int, int]:
    """fit, and the number of learned tokens it kept (counted once)."""
    status = KEPT
    if len(ids) > data.max_length:
        if data.truncation == "drop":
            return [], [], DROPPED_TOO_LONG, 0
        ids, labels, status = ids[: data.max_length], labels[: data.max_length], TRUNCATED
    learned = len(labels) - labels.count(IGNORE_INDEX)
    if not learned:
        return [], [], DROPPED_NO_TARGET, 0
    return ids, labels, status, learned


def sft_example(row: dict[str, Any], encoder: RowEncoder, stats: TokenizeStats, where: str = "row"
                ) -> dict[str, list[int]] | None:
    """One row -> token ids and labels, or None when it is dropped (too long under truncation drop, no target)."""
    try:
        ids, labels, folded = encoder.encode_row(row)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None
    ids, labels, status = fit(ids, labels, encoder.data)
    stats.count(status, ids, labels, folded)
    return {"input_ids": ids, "labels": labels} if status in (KEPT, TRUNCATED) else None


def _sft_batch(batch: dict[str, list[Any]], indices: list[int], encoder: RowEncoder, name: str
               ) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"input_ids": [], "labels": [], "status": [], "trainable": [], "folded": []}
    rows = [dict(zip(batch.keys(), values, strict=True)) for values in zip(*batch.values(), strict=True)]
    encoded = encoder.encode_batch(rows, [f"{name}, row {index + 1}" for index in indices])
    for ids, labels, folded in encoded:
        ids, labels, status, learned = fit_counted(ids, labels, encoder.data)
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["status"].append(status)
        out["folded"].append(folded)
        out["trainable"].append(learned)
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
            for f in _files_of(source.path):
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


def _split(parts: list[Part], data: DataSpec, seed: int) -> tuple[list[Part], list[Part] | None]:
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


def _take(parts: list[Part], limit: int | None) -> list[Part]:
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
        _count(stats, done)
        if stats.kept - before < len(done):  # some rows were dropped: a filter pass (skipped in the usual case)
            done = done.filter(lambda status: [s in (KEPT, TRUNCATED) for s in status], input_columns="status",
                               batched=True, batch_size=4096)
        tokenized.append(done.remove_columns(["status", "trainable", "folded"]))
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


def _count(stats: TokenizeStats, done: Any) -> None:
    """Row outcomes and token counts from the tokenized columns, as arrays (never the whole dataset as lists)."""
    import numpy as np
    import pyarrow.compute as pc

    status = np.asarray(done.data.column("status"))
    kept = (status == KEPT) | (status == TRUNCATED)
    stats.rows += len(status)
    stats.kept += int(kept.sum())
    stats.truncated += int((status == TRUNCATED).sum())
    stats.dropped_too_long += int((status == DROPPED_TOO_LONG).sum())
    stats.dropped_no_target += int((status == DROPPED_NO_TARGET).sum())
    stats.trainable_tokens += int(np.asarray(done.data.column("trainable"))[kept].sum())
    stats.system_folded += int(np.asarray(done.data.column("folded")).sum())
    lengths = np.asarray(pc.list_value_length(done.data.column("input_ids")).fill_null(0))
    stats.tokens += int(lengths[kept].sum())


FILES_MANIFEST = "arrow-files.json"


def _persist(dataset: Any, directory: Path, owned: Path) -> None:
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


def _load(directory: Path) -> Any:
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
                              "folded": datasets.Value("bool")})


def _features():
    import datasets

    return datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                              "labels": datasets.Sequence(datasets.Value("int32"))})


def _rows(parts: list[Part]) -> str:
    return f"{sum(len(p.rows) for p in parts):,}"


def _sources(parts: list[Part]) -> str:
    return f"{len(parts)} source(s)" if len(parts) != 1 else parts[0].name


def prepare(data: DataSpec, tokenizer: Any, cache_dir: Path, seed: int,
            on_progress: Callable[[str], None] | None = None) -> PreparedData:
    """Tokenizes train/eval (or loads them from the cache); call it on the main process first."""

    target = cache_dir / cache_key(data, tokenizer)
    if (target / "complete").exists():
        train = _load(target / "train")
        evaluation = _load(target / "eval") if (target / "eval").exists() else None
        return PreparedData(train, evaluation, json.loads((target / "stats.json").read_text()))

    parts = load_rows(data.train, data)
    eval_parts = load_rows(data.validation, data) if data.validation else None
    if eval_parts is None:
        parts, eval_parts = _split(parts, data, seed)
    parts = _take(parts, data.max_train_samples)
    if eval_parts is not None:
        eval_parts = _take(eval_parts, data.max_eval_samples)

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
    _persist(train, tmp / "train", tmp)
    if evaluation is not None:
        _persist(evaluation, tmp / "eval", tmp)
    (tmp / "stats.json").write_text(json.dumps(stats))
    shutil.rmtree(tmp / "scratch", ignore_errors=True)
    shutil.rmtree(tmp / "scratch-eval", ignore_errors=True)
    (tmp / "complete").write_text("")
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; its cache is equivalent
        shutil.rmtree(tmp, ignore_errors=True)
    return prepare(data, tokenizer, cache_dir, seed)  # the saved copy: memory-mapped, not the scratch files
