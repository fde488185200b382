"""loss.png at the end of a run: training and validation loss against the step, the learning rate on a second axis.

Drawn with Pillow (locked in requirements/trainer.lock as TensorBoard's dependency), so the trainer needs no
plotting library; the data comes from progress.jsonl, the records the status is made of.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

WIDTH, HEIGHT = 960, 540
LEFT, RIGHT, TOP, BOTTOM = 80, 90, 50, 60
TRAIN, EVAL, RATE, AXIS, GRID = (31, 119, 180), (255, 127, 14), (120, 120, 120), (40, 40, 40), (225, 225, 225)


def read_progress(path: Path) -> list[dict[str, Any]]:
    """The step records of progress.jsonl (the data preparation's heartbeat has no step)."""
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if isinstance(r.get("step"), int)]


def write_loss_plot(records: Sequence[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Writes the plot; None when there is nothing to draw (no step logged a loss)."""
    from PIL import Image, ImageDraw

    train = _series(records, "loss")
    evaluation = _series(records, "evalLoss")
    rate = _series(records, "learningRate")
    if not train and not evaluation:
        return None
    steps = [s for s, _ in train + evaluation + rate]
    x_axis = _Axis(min(steps), max(steps), LEFT, WIDTH - RIGHT)
    losses = [v for _, v in train + evaluation]
    y_loss = _Axis(min(losses), max(losses), HEIGHT - BOTTOM, TOP)
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    for value in y_loss.ticks():
        y = y_loss.at(value)
        draw.line([(LEFT, y), (WIDTH - RIGHT, y)], fill=GRID)
        draw.text((LEFT - 8, y), _label(value), fill=AXIS, anchor="rm")
    for value in x_axis.ticks():
        x = x_axis.at(value)
        draw.line([(x, HEIGHT - BOTTOM), (x, HEIGHT - BOTTOM + 5)], fill=AXIS)
        draw.text((x, HEIGHT - BOTTOM + 8), _label(value), fill=AXIS, anchor="mt")
    draw.rectangle([(LEFT, TOP), (WIDTH - RIGHT, HEIGHT - BOTTOM)], outline=AXIS)
    if rate:
        y_rate = _Axis(0.0, max(v for _, v in rate), HEIGHT - BOTTOM, TOP)
        for value in y_rate.ticks():
            draw.text((WIDTH - RIGHT + 8, y_rate.at(value)), f"{value:.1e}", fill=RATE, anchor="lm")
        _polyline(draw, [(x_axis.at(s), y_rate.at(v)) for s, v in rate], RATE, width=1)
    _polyline(draw, [(x_axis.at(s), y_loss.at(v)) for s, v in train], TRAIN, width=2)
    _polyline(draw, [(x_axis.at(s), y_loss.at(v)) for s, v in evaluation], EVAL, width=2)
    for s, v in evaluation:
        x, y = x_axis.at(s), y_loss.at(v)
        draw.ellipse([(x - 3, y - 3), (x + 3, y + 3)], fill=EVAL)
    draw.text((WIDTH / 2, 20), title, fill=AXIS, anchor="mm")
    draw.text((WIDTH / 2, HEIGHT - 18), "step", fill=AXIS, anchor="mm")
    legend = [("training loss", TRAIN, train), ("validation loss", EVAL, evaluation), ("learning rate", RATE, rate)]
    shown = [(name, color) for name, color, series in legend if series]
    width = sum(40 + int(draw.textlength(name)) for name, _ in shown)
    draw.rectangle([(LEFT + 4, TOP + 4), (LEFT + 14 + width, TOP + 24)], fill="white", outline=GRID)
    x = LEFT + 10
    for name, color, series in legend:
        if series:
            draw.line([(x, TOP + 14), (x + 24, TOP + 14)], fill=color, width=3)
            draw.text((x + 30, TOP + 14), name, fill=AXIS, anchor="lm")
            x += 40 + int(draw.textlength(name))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".png.tmp")
    image.save(tmp, format="PNG")
    tmp.replace(path)
    return path


def _series(records: Iterable[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) per step, the last record of a step winning; NaN/inf dropped (a diverged loss is not drawn)."""
    points: dict[int, float] = {}
    for r in records:
        value = r.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            points[r["step"]] = float(value)
    return sorted(points.items())


def _polyline(draw: Any, points: list[tuple[float, float]], color: tuple[int, int, int], width: int) -> None:
    if len(points) > 1:
        draw.line(points, fill=color, width=width, joint="curve")
    elif points:
        x, y = points[0]
        draw.ellipse([(x - 2, y - 2), (x + 2, y + 2)], fill=color)


class _Axis:
    def __init__(self, low: float, high: float, start: float, end: float):
        if high - low < 1e-12:
            low, high = low - 0.5, high + 0.5
        pad = (high - low) * 0.05
        self.low, self.high, self.start, self.end = low - pad, high + pad, start, end

    def at(self, value: float) -> float:
        return self.start + (value - self.low) / (self.high - self.low) * (self.end - self.start)

    def ticks(self, count: int = 5) -> list[float]:
        raw = (self.high - self.low) / count
        magnitude = 10 ** math.floor(math.log10(raw))
        step = min((m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw), default=10 * magnitude)
        first = math.ceil(self.low / step) * step
        return [first + i * step for i in range(count + 2) if first + i * step <= self.high]


def _label(value: float) -> str:
    return f"{value:.4g}"
