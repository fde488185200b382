"""What the step-time benchmarks against TRL share (grpo_step_time.py, preference_step_time.py): the small Llama
both sides train, runs of each case interleaved (a slow minute of a shared machine hits both sides), and each
case's medians, ratio and per-run range, printed as one table."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from finetune_trainer.tiny_model import build_tiny_model


def small_llama(directory: Path) -> Path:
    """Llama 4 layers x 256, vocabulary 8,192: big enough that a step is the model's work, small enough for CPU."""
    return build_tiny_model(directory, layers=4, hidden=256, heads=8, kv_heads=4, intermediate=688, vocab_size=8192)


def interleaved(cases: list[str], repeats: int, measure: Callable[[str, int], dict]) -> dict[str, list[dict]]:
    """measure(case, repeat) for every case, `repeats` rounds, each round running every case once."""
    runs: dict[str, list[dict]] = {case: [] for case in cases}
    for repeat in range(repeats):
        for case in cases:
            runs[case].append(measure(case, repeat))
    return runs


def ratio_row(key: str, case: str, runs: list[dict], steps: int) -> dict:
    """Medians of each side's seconds per step ("ours", "trl" in every run) and TRL's over ours (>= 1: as fast)."""
    ours, trl = (statistics.median(r[side] for r in runs) for side in ("ours", "trl"))
    return {key: case, "steps": steps, "repeats": len(runs), "oursSecondsPerStep": ours, "trlSecondsPerStep": trl,
            "ratio": trl / ours, "ratioRange": [min(r["trl"] / r["ours"] for r in runs),
                                                max(r["trl"] / r["ours"] for r in runs)]}


def print_table(rows: list[dict], key: str, same: str, same_title: str) -> None:
    width = max(len(key), *(len(str(r[key])) for r in rows)) + 2
    print(f"{key:<{width}}{'ours s/step':>13}{'TRL s/step':>12}{'TRL/ours':>10}{'  per-run range':<18}"
          f"{same_title:>10}")
    for r in rows:
        low, high = r["ratioRange"]
        print(f"{r[key]:<{width}}{r['oursSecondsPerStep']:>13.4f}{r['trlSecondsPerStep']:>12.4f}"
              f"{r['ratio']:>9.2f}x  {low:.2f}x-{high:.2f}x{'':<6}{str(r[same]):>10}")
