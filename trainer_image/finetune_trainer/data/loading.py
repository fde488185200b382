"""Sources -> rows: files, directories, globs and s3:// objects (json, jsonl, parquet, csv, text), hub datasets and
inline rows, each part named so a bad row names its file and row number."""

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api.data import DataSource, DataSpec
from finetune_operator.api.storage import is_s3
from finetune_trainer import objectstore
from finetune_trainer.errors import DataError

EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text",
              ".text": "text", ".md": "text"}
# Past this many files a directory or glob is loaded as one dataset (rows then name the pattern, not the file).
MAX_FILES_ONE_BY_ONE = 64


@dataclass(frozen=True)
class Part:
    """Rows of one file (or one hub split, or the inline rows), and how a message names them."""

    name: str
    rows: Any  # datasets.Dataset or IterableDataset


# --- loading ----------------------------------------------------------------------------------------------------


# A dataset repository's card (the Hub's layout: README.md beside data/*.jsonl), not data, in a directory.
DATASET_CARDS = ("readme.md",)


def files_of(path: str, file_type: str | None = None) -> list[str]:
    """The data files of a source path. In a directory (or under an s3:// prefix): the files of `file_type` when
    it is set, else every data file but a dataset card (README.md) beside other data."""
    if is_s3(path):
        return _objects_of(path, file_type)
    if os.path.isdir(path):
        found = _data_files(sorted(p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True)
                                   if Path(p).suffix in EXTENSIONS and os.path.isfile(p)), file_type)
    else:
        found = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    missing = [p for p in found if not os.path.isfile(p)]
    if not found or missing:
        raise DataError(f"no data file at {path}" + (f" (missing: {missing[:3]})" if missing else ""))
    return found


def _data_files(found: list[str], file_type: str | None) -> list[str]:
    if file_type is not None:
        return [f for f in found if _kind_of(Path(f).suffix) == _kind_of(file_type)]
    data = [f for f in found if Path(f).name.lower() not in DATASET_CARDS]
    return data or found


def _kind_of(suffix_or_type: str) -> str | None:
    """json and jsonl are one kind (datasets' json loader reads both)."""
    kind = EXTENSIONS.get(suffix_or_type, suffix_or_type.lstrip("."))
    return "json" if kind in ("json", "jsonl") else kind


def _objects_of(uri: str, file_type: str | None = None) -> list[str]:
    """s3:// files: a glob, every data file under a prefix, or one object; none is a DataError naming the URI."""
    fs = objectstore.filesystem()
    try:
        if glob.has_magic(uri):
            found = sorted(fs.glob(uri))
        elif fs.isfile(uri):
            found = [uri]
        else:
            found = _data_files(sorted(k for k in fs.find(uri.rstrip("/") + "/") if Path(k).suffix in EXTENSIONS),
                                file_type)
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
        mixed = mixed_types(source.inline)
        if mixed is not None:  # pyarrow's own error names neither the row nor the column
            raise DataError(f"inline rows, {mixed}")
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
    files = files_of(str(source.path), source.file_type)
    kinds = {source.file_type or EXTENSIONS.get(Path(f).suffix) for f in files}
    if None in kinds or len(kinds) != 1:
        by_kind = {str(kind): [f for f in files if EXTENSIONS.get(Path(f).suffix) == kind] for kind in kinds}
        examples = "; ".join(f"{kind}: {', '.join(map(os.path.basename, names[:2]))}"
                             + (f" and {len(names) - 2} more" if len(names) > 2 else "")
                             for kind, names in sorted(by_kind.items()))
        raise DataError(f"{source.path} holds files of more than one type ({examples}); set fileType to the one "
                        "that is the data (in a directory only files of that type are read), or point path at "
                        "those files")
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
        rows = 0
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            rows += 1
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}, line {number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(value, dict):
                raise DataError(f"{path}, line {number}: a row must be a JSON object, got {type(value).__name__}")
        if not rows:
            raise DataError(f"{path}: no rows (the file holds only blank lines); JSON Lines has one JSON object per "
                            "line")


def _kind(value: Any) -> str | None:
    if value is None:
        return None  # a missing value fits any column
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "an object"


def mixed_types(rows: Any) -> str | None:
    """Where a column first changes type (a table column has one: pyarrow refuses the file, without saying
    where), as "row N: 'col' is text where earlier rows have true/false; ...", or None."""
    seen: dict[str, tuple[str, int]] = {}
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            continue
        for column, value in row.items():
            kind = _kind(value)
            if kind is None:
                continue
            first, where = seen.setdefault(column, (kind, number))
            if first != kind:
                return (f"row {number}: '{column}' is {kind} where row {where} has {first}; a column holds one "
                        "type in every row (write them all the same way)")
    return None


def load_rows(sources: list[DataSource], data: DataSpec, streaming: bool = False) -> list[Part]:
    return [part for s in sources for part in load_source(s, data, streaming)]


# --- one row -> ids and labels ----------------------------------------------------------------------------------
