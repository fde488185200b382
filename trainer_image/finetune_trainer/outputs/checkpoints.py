"""Checkpoint integrity: verify what was saved, mark it complete atomically, resume from the newest complete one."""

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "FINETUNE_COMPLETE"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
WEIGHT_PATTERNS = ("model*.safetensors", "adapter_model.safetensors", "pytorch_model*.bin", "adapter_model.bin",
                   "global_step*/*", "pytorch_model_fsdp*", "pytorch_model_fsdp*/*")


class IncompleteCheckpoint(Exception):
    pass


def weight_files(directory: Path) -> list[Path]:
    return sorted({p for pattern in WEIGHT_PATTERNS for p in directory.glob(pattern) if p.is_file()})


def verify(directory: Path) -> dict:
    """Raises IncompleteCheckpoint unless weights are present and non-empty and trainer_state.json parses."""
    files = weight_files(directory)
    if not files:
        raise IncompleteCheckpoint(f"{directory}: no weight files")
    empty = [f.name for f in files if f.stat().st_size == 0]
    if empty:
        raise IncompleteCheckpoint(f"{directory}: empty weight files {empty}")
    try:
        state = json.loads((directory / "trainer_state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise IncompleteCheckpoint(f"{directory}: trainer_state.json unreadable ({exc})") from exc
    # "files" is every file of the checkpoint (what a copy must hold), "weightFiles" and "bytes" its weights.
    return {"step": int(state.get("global_step", 0)), "files": sum(1 for p in directory.rglob("*") if p.is_file()),
            "weightFiles": len(files), "bytes": sum(f.stat().st_size for f in files)}


def provenance(spec: Any) -> dict[str, Any]:
    """What produced a checkpoint, as far as resuming it depends on: the base model and the method (LoRA shapes,
    quantization), and the data's fingerprint (the data section: sources, format, mapping, lengths, packing; a
    file's content is not read). Recorded in every completion marker."""
    data = json.dumps(spec.data.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True)
    return {"model": spec.model.name, "revision": spec.model.revision, "quantization": spec.model.quantization,
            "method": spec.method.model_dump(mode="json", by_alias=True, exclude_none=True),
            "data": hashlib.sha256(data.encode()).hexdigest()[:16]}


def produced_by(directory: Path) -> dict[str, Any] | None:
    """The provenance a completion marker recorded (None for markers written before provenance was recorded)."""
    try:
        return json.loads((directory / COMPLETE_MARKER).read_text()).get("producedBy")
    except (OSError, json.JSONDecodeError):
        return None


# What a checkpoint's weights depend on (another value cannot be resumed at all), and what its data position does.
MODEL_KEYS = ("model", "revision", "quantization", "method")
DATA_KEYS = ("data",)


def incompatibility(directory: Path, spec: Any, keys: tuple[str, ...] = MODEL_KEYS + DATA_KEYS) -> str | None:
    """Why the checkpoint cannot be resumed by this spec (another model, method or shapes, other data), or None.
    A key the marker did not record (written by an older trainer) is not held against it."""
    recorded, wanted = produced_by(directory), provenance(spec)
    if recorded is None:
        return None
    changed = [key for key in keys if key in recorded and recorded.get(key) != wanted[key]]
    if not changed:
        return None
    return "; ".join(f"{key}: checkpoint {json.dumps(recorded.get(key))}, this job {json.dumps(wanted[key])}"
                     for key in changed)


def mark_complete(directory: Path, producer: dict[str, Any] | None = None,
                  timings: dict[str, float] | None = None) -> dict:
    """Verifies, then writes the marker by rename, so a crash mid-write never leaves a marker that lies. `timings`:
    how long training stood still for the save (stallSeconds) and how long the save took (saveSeconds)."""
    summary = {**verify(directory), "completedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               **({"producedBy": producer} if producer is not None else {}), **(timings or {})}
    tmp = directory / f".{COMPLETE_MARKER}.tmp"
    tmp.write_text(json.dumps(summary))
    os.replace(tmp, directory / COMPLETE_MARKER)
    return summary


def step_of(directory: Path) -> int | None:
    match = CHECKPOINT_PATTERN.match(directory.name)
    return int(match.group(1)) if match else None


def newest_complete(output_dir: Path, at_most: int | None = None,
                    accept: Callable[[int | None], bool] | None = None) -> Path | None:
    """The highest-step checkpoint (at most step `at_most`, and whose step `accept`s) that carries the marker and
    still verifies; partial ones are skipped."""
    if not output_dir.is_dir():
        return None
    candidates = sorted((d for d in output_dir.iterdir() if d.is_dir() and step_of(d) is not None
                         and (at_most is None or (step_of(d) or 0) <= at_most)
                         and (accept is None or accept(step_of(d)))), key=step_of, reverse=True)
    for directory in candidates:
        if not (directory / COMPLETE_MARKER).exists():
            continue
        try:
            verify(directory)
        except IncompleteCheckpoint:
            continue
        return directory
    return None
