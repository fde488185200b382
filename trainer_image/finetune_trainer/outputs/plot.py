"""loss.png at the end of a run, drawn with matplotlib from progress.jsonl (the records the status is made of):
training and validation loss against the step, the learning rate on a second axis, each resume and gang restart
marked where it started; a second panel for preference objectives (reward margin and accuracy) or for GRPO (the mean
reward, each reward's mean, the KL divergence) when the records carry them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

TRAIN, EVAL, RATE, MARGIN, ACCURACY, RESTART = "#1f77b4", "#ff7f0e", "#7f7f7f", "#2ca02c", "#9467bd", "#d62728"
SIZE_INCHES, DPI = (9.6, 5.4), 100  # 960 x 540, the size a README or a notebook shows whole


def model_label(name: str) -> str:
    """How a plot's title names the model: a Hub id as it is, a directory or a bucket prefix by its last part
    (the title is read beside the run: /tmp/pytest-of-root/.../tiny-llama says nothing that tiny-llama does not)."""
    scheme, sep, rest = name.partition("://")
    local = not sep and (name.startswith(("/", "./", "../", "~")) or Path(name).is_dir())
    if local or sep:
        last = (rest if sep else name).rstrip("/").rsplit("/", 1)[-1]
        return last or name
    return name


def read_progress(path: Path) -> list[dict[str, Any]]:
    """The step records of progress.jsonl (the data preparation's heartbeat has no step)."""
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if isinstance(r.get("step"), int)]


def restarts(records: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    """(step, label) where a process took over the run: a gang restart (a new attempt) or a resume (the same
    attempt, or a local run, started again from a checkpoint). Records carry the attempt and the step their
    process started at."""
    marks: list[tuple[int, str]] = []
    segment: tuple[Any, Any] | None = None
    for r in records:
        current = (r.get("attempt"), r.get("startStep"))
        if current == (None, None):
            continue
        if segment is not None and current != segment:
            step = int(r.get("startStep") or 0)
            attempt = r.get("attempt")
            marks.append((step, f"restart (attempt {attempt})" if attempt is not None and attempt != segment[0]
                          else f"resumed at step {step}"))
        segment = current
    return marks


def loss_figure(records: Sequence[dict[str, Any]], title: str) -> Any:
    """The figure (matplotlib.figure.Figure), or None when no step logged a finite loss."""
    from matplotlib.figure import Figure

    train, evaluation, rate = (_series(records, k) for k in ("loss", "evalLoss", "learningRate"))
    margin, accuracy = _series(records, "rewardsMargin"), _series(records, "rewardsAccuracy")
    reward = _series(records, "reward")
    if not train and not evaluation:
        return None
    preference = bool(margin or accuracy)
    figure = Figure(figsize=SIZE_INCHES, dpi=DPI, layout="constrained")
    # GRPO's loss says little (a policy-gradient objective near 0): its rewards get as much room.
    axes = (figure.subplots(2, 1, sharex=True, height_ratios=(2, 1) if preference else (1, 1))
            if preference or reward else [figure.subplots()])
    loss_axis = axes[0]
    loss_axis.set_title(title)
    loss_axis.set_ylabel("loss")
    loss_axis.grid(True, color="#e1e1e1")
    lines = []
    if train:
        lines += loss_axis.plot(*zip(*train, strict=True), color=TRAIN, linewidth=2, label="training loss")
    if evaluation:
        lines += loss_axis.plot(*zip(*evaluation, strict=True), color=EVAL, linewidth=2, marker="o", markersize=4,
                                label="validation loss")
    if rate:
        rate_axis = loss_axis.twinx()
        rate_axis.set_ylabel("learning rate", color=RATE)
        rate_axis.tick_params(axis="y", colors=RATE)
        rate_axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        lines += rate_axis.plot(*zip(*rate, strict=True), color=RATE, linewidth=1, label="learning rate")
    for step, label in restarts(records):
        for axis in axes:
            axis.axvline(step, color=RESTART, linestyle="--", linewidth=1)
        loss_axis.annotate(label, (step, 1), xycoords=("data", "axes fraction"), xytext=(3, -3),
                           textcoords="offset points", va="top", fontsize=8, color=RESTART, rotation=90)
    loss_axis.legend(handles=lines, loc="upper right", framealpha=0.9)
    if preference:
        pref = axes[1]
        pref.grid(True, color="#e1e1e1")
        pref.set_ylabel("reward margin")
        handles = []
        if margin:
            handles += pref.plot(*zip(*margin, strict=True), color=MARGIN, linewidth=2, label="chosen - rejected")
        if accuracy:
            acc_axis = pref.twinx()
            acc_axis.set_ylim(0, 1.05)
            acc_axis.set_ylabel("accuracy", color=ACCURACY)
            handles += acc_axis.plot(*zip(*accuracy, strict=True), color=ACCURACY, linewidth=2,
                                     label="preference accuracy")
        pref.legend(handles=handles, loc="lower right", framealpha=0.9)
    elif reward:
        reward_panel(axes[1], records, reward)
    axes[-1].set_xlabel("step")
    return figure


def reward_panel(axis: Any, records: Sequence[dict[str, Any]], reward: list[tuple[int, float]]) -> None:
    """GRPO: the mean weighted reward, each reward's own mean (thin), the KL divergence on a second axis."""
    axis.grid(True, color="#e1e1e1")
    axis.set_ylabel("reward")
    handles = axis.plot(*zip(*reward, strict=True), color=MARGIN, linewidth=2, label="mean reward (weighted sum)")
    names = list(dict.fromkeys(f["name"] for r in records for f in r.get("rewardFunctions") or []))
    for name in names:
        points = _series(({"step": r["step"], "mean": f.get("mean")} for r in records
                          for f in r.get("rewardFunctions") or [] if f.get("name") == name), "mean")
        if points:
            handles += axis.plot(*zip(*points, strict=True), linewidth=1, alpha=0.8, label=name)
    kl = _series(records, "kl")
    if kl:
        kl_axis = axis.twinx()
        kl_axis.set_ylabel("KL", color=ACCURACY)
        handles += kl_axis.plot(*zip(*kl, strict=True), color=ACCURACY, linewidth=1, linestyle=":", label="KL")
    axis.legend(handles=handles, loc="lower right", framealpha=0.9, fontsize=8)


def write_loss_plot(records: Sequence[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Writes the plot; None when there is nothing to draw (no step logged a loss)."""
    figure = loss_figure(records, title)
    if figure is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".png.tmp")
    figure.savefig(tmp, format="png", dpi=DPI)
    tmp.replace(path)
    return path


def _series(records: Iterable[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) per step, the last record of a step winning; NaN/inf dropped (a diverged loss is not drawn)."""
    points: dict[int, float] = {}
    for r in records:
        value = r.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            points[r["step"]] = float(value)
    return sorted(points.items())
