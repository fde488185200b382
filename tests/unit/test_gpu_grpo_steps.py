"""The GPU suite's GRPO case times our steps from the progress records (benchmarks/gpu_grpo.py step_seconds): the
tokens a step added over its rate, which the trainer's progress callback measures from one log to the next."""

import json
import time
from types import SimpleNamespace

import pytest

from benchmarks.gpu_grpo import first_step_apart, median_after_first, step_seconds


def records_of_a_run(tmp_path, pauses: list[float]) -> tuple[list[dict], list[float]]:
    """The real progress callback over steps of the given lengths (loggingSteps 1, as the case runs): its records,
    and each step's time from one log to the next as measured here."""
    from transformers import TrainerState

    from finetune_trainer.training.callbacks import ProgressCallback

    callback = ProgressCallback(tmp_path)
    state, args = TrainerState(), SimpleNamespace(world_size=1)
    state.max_steps = len(pauses)
    callback.on_train_begin(args, state, None)
    measured, last = [], time.monotonic()
    for step, pause in enumerate(pauses, start=1):
        time.sleep(pause)
        state.global_step, state.num_input_tokens_seen = step, state.num_input_tokens_seen + 100 + 7 * step
        now = time.monotonic()
        callback.on_log(args, state, None, logs={"loss": 1.0, "learning_rate": 1e-5})
        measured.append(now - last)
        last = now
    records = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    return records, measured


def test_each_step_is_the_time_from_one_log_to_the_next(tmp_path):
    records, measured = records_of_a_run(tmp_path, [0.2, 0.05, 0.3, 0.1])  # apart by more than a busy clock
    derived = step_seconds(records)
    assert all(abs(d - m) < 0.04 for d, m in zip(derived, measured, strict=True)), (derived, measured)
    assert median_after_first(derived) == round(sorted(derived[1:])[1], 3)


def test_a_step_whose_record_before_it_is_missing_has_no_time(tmp_path):
    """A missing record (the suite keeps only records written after its start) leaves the next one's tokens
    counting two steps over a rate measured over one: twice its time, were it counted."""
    records, measured = records_of_a_run(tmp_path, [0.05, 0.1, 0.1, 0.05])
    derived = step_seconds([records[0], *records[2:]])
    assert derived[1] is None, (derived, measured)
    assert abs(derived[2] - measured[3]) < 0.04, (derived, measured)


def run(*values: tuple[float, float]) -> list[dict]:
    return [{"step": i, "loss": loss, "reward": reward} for i, (loss, reward) in enumerate(values, start=1)]


@pytest.mark.parametrize(("theirs", "apart"), [
    (run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5)), None),  # the same run
    (run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5004)), None),  # within the tolerance
    (run((0.5, 1.1), (0.4, 1.2), (0.3, 1.5)), 1),  # the first generation differed already
    (run((0.5, 1.0), (0.41, 1.2), (0.3, 1.5)), 2),  # the loss drifted first
    (run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5), (0.2, 1.6)), 4),  # TRL logged a step we did not
    (run((0.5, 1.0), (0.4, 1.2)), 3),  # we logged a step TRL did not
    ([{"step": 1, "loss": 0.5, "reward": None}, *run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5))[1:]], 1),  # no reward
])
def test_the_first_step_where_our_grpo_run_and_trls_part(theirs, apart):
    assert first_step_apart(run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5)), theirs) == apart


@pytest.mark.parametrize(("ours", "theirs", "apart"), [
    # A NaN is never the same run (the old sameRunAsTrl's `abs(a - b) < 1e-3` said so too): the loss of one side
    # only, and of both.
    (run((0.5, 1.0), (float("nan"), 1.2), (0.3, 1.5)), run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5)), 2),
    (run((0.5, 1.0), (float("nan"), 1.2)), run((0.5, 1.0), (float("nan"), 1.2)), 2),
    # The first step apart is the first either way: a step TRL logged and we did not (2) comes before one of ours
    # whose loss differs (3).
    ([r for r in run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5)) if r["step"] != 2],
     run((0.5, 1.0), (0.4, 1.2), (0.35, 1.5)), 2),
])
def test_a_nan_or_a_missing_step_before_a_difference_is_where_the_runs_part(ours, theirs, apart):
    assert first_step_apart(ours, theirs) == apart


def test_each_steps_loss_and_reward_are_paired_by_step():
    """A step one side did not log must not shift the other side's steps onto the wrong rows."""
    from benchmarks.gpu_grpo import per_step

    ours = [r for r in run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5)) if r["step"] != 2]
    assert per_step(ours, run((0.5, 1.0), (0.4, 1.2), (0.3, 1.5))) == [
        [1, 0.5, 0.5, 1.0, 1.0], [2, None, 0.4, None, 1.2], [3, 0.3, 0.3, 1.5, 1.5]]
