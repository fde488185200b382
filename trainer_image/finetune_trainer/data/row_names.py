"""How a message names a row: by its line in a JSON Lines file (datasets skips blank lines, so a row's index is
not its line, and an editor shows lines), else by its row number in the file, the hub split or the inline rows."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune_operator.api.storage import is_s3
from finetune_trainer import objectstore

JSON_SUFFIXES = (".jsonl", ".json")


def json_lines(path: str) -> list[int] | None:
    """The line numbers of a JSON Lines file's rows (its non-blank lines), or None for a file that is not JSON
    Lines (a .json array) or cannot be read here."""
    opener = objectstore.filesystem().open if is_s3(path) else open
    try:
        with opener(path, "r", encoding="utf-8", errors="replace") as f:
            numbers = []
            for number, line in enumerate(f, start=1):
                stripped = line.strip()
                if not stripped:
                    continue
                if not numbers and stripped.startswith("["):
                    return None
                numbers.append(number)
            return numbers
    except Exception:  # s3fs and botocore raise many types: the rows are then named by number
        return None


def row_namer(part: Any) -> Callable[[int], str]:
    """i (0-based, in the order datasets reads the part) -> "FILE, line N" for a JSON Lines file, else "PART, row
    N"."""
    lines = json_lines(part.name) if Path(part.name).suffix in JSON_SUFFIXES else None

    def name(i: int) -> str:
        if lines is not None and i < len(lines):
            return f"{part.name}, line {lines[i]}"
        return f"{part.name}, row {i + 1}"
    return name
