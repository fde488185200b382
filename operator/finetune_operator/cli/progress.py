"""The live progress line of `finetune run`, drawn from the trainer's progress.jsonl."""

import json
import time
from pathlib import Path
from typing import Any, TextIO


class ProgressLine:
    """Follows progress.jsonl and draws one line (a bar on a terminal, a line per record otherwise); the trainer's
    warnings and notes (notices.jsonl) are printed on lines of their own, each once, as they come."""

    def __init__(self, path: Path, out: TextIO, notices: Path | None = None):
        self.progress, self.notices = _Follow(path), _Follow(notices) if notices is not None else None
        # A resumed run appends the history it restored from the bucket: older than this run, not shown again.
        self.since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.out = out
        self.last: dict[str, Any] | None = None
        self.eval_loss: float | None = None  # the newest evaluation, shown on every later line
        self.tty = out.isatty()

    def poll(self) -> None:
        for record in self.notices.new_records() if self.notices is not None else []:
            self._say(record)
        for record in self.progress.new_records():
            if str(record.get("time") or self.since) < self.since:
                continue
            same_step = (self.last is not None and record.get("step") is not None
                         and record.get("step") == self.last.get("step"))
            if record.get("evalLoss") is not None:
                self.eval_loss = record["evalLoss"]
            self.last = {**record, "evalLoss": self.eval_loss}
            if self.tty:
                continue
            if same_step and record.get("evalLoss") is not None:  # an evaluation after the step's own record
                perplexity = record.get("evalPerplexity")
                print(f"  eval loss {record['evalLoss']:.4f}"
                      + (f" (perplexity {perplexity:.4g})" if perplexity is not None else "")
                      + held_out_preference(record)
                      + f" at step {record.get('step')}", file=self.out, flush=True)
            elif not same_step:
                print(render_progress(self.last), file=self.out, flush=True)
        if self.tty and self.last is not None:
            print("\r" + render_progress(self.last), end="", file=self.out, flush=True)

    def _say(self, record: dict[str, Any]) -> None:
        notice = record.get("notice")
        text = f"warning: {notice['reason']}: {notice['message']}" if notice else str(record["note"])
        print(("\r\033[K" if self.tty else "") + text, file=self.out, flush=True)  # over the bar, which is redrawn

    def close(self) -> None:
        if self.tty and self.last is not None:
            print(file=self.out)


class _Follow:
    """The whole JSON lines a file gained since the last look (only this run's: it starts at the file's end)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new_records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open(encoding="utf-8") as f:
            f.seek(self.offset)
            text = f.read()
        complete = text[: text.rfind("\n") + 1]  # a line still being written is read next time
        self.offset += len(complete.encode("utf-8"))
        records = []
        for line in complete.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # never fatal to the console: a line it cannot read is skipped
                continue
        return records


def held_out_preference(record: dict[str, Any]) -> str:
    """A preference objective's evaluation, in words: its held-out accuracy and margin (it has no perplexity)."""
    parts = [f"{name} {record[key]:.4g}" for name, key in (("accuracy", "evalRewardsAccuracy"),
                                                           ("margin", "evalRewardsMargin"))
             if isinstance(record.get(key), int | float)]
    return f" (held-out preference {', '.join(parts)})" if parts else ""


def render_progress(r: dict[str, Any], width: int = 24) -> str:
    if r.get("phase") == "Preparing":
        return f"preparing: {r.get('message', '')} ({r.get('elapsedSeconds', 0)}s)"
    step, total = r.get("step", 0), r.get("maxSteps") or 0
    done = int(width * step / total) if total else 0
    parts = [f"[{'#' * done}{'.' * (width - done)}] {step}/{total}"]
    if r.get("loss") is not None:
        parts.append(f"loss {r['loss']:.4f}")
    if r.get("evalLoss") is not None:
        parts.append(f"eval {r['evalLoss']:.4f}")
    if r.get("learningRate") is not None:
        parts.append(f"lr {r['learningRate']:.2e}")
    if r.get("tokensPerSecond"):
        parts.append(f"{r['tokensPerSecond']:.0f} tok/s")
    if r.get("mfu") is not None:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    if r.get("peakMemoryGiB") is not None:
        parts.append(f"{r['peakMemoryGiB']:.1f} GiB")
    if r.get("eta"):
        parts.append(f"ETA {r['eta']}")
    upload = r.get("upload") or {}
    if upload.get("behindSince"):  # output.uri: the store is slow or down; training goes on, uploads retry
        why = " ".join(str(upload.get("lastError") or "").split())
        parts.append(f"uploads behind: {upload['pending']} checkpoint(s) since {upload.get('behindSince', '?')}"
                     + (f", retrying: {why[:160]}" if why else ""))  # why, not only the node log
    return "  ".join(parts)
