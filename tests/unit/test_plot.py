"""loss.png: drawn with matplotlib from progress records as the trainer writes them; checked on the figure's own
artists (what is drawn, with which data) and on the PNG written."""

import json
import math

import pytest
from PIL import Image

from finetune_trainer.outputs.plot import (
    EVAL,
    RATE,
    RESTART,
    TRAIN,
    loss_figure,
    model_label,
    read_progress,
    restarts,
    write_loss_plot,
)


def lines_by_label(figure):
    return {line.get_label(): line for axis in figure.axes for line in axis.get_lines()
            if not line.get_label().startswith("_")}


def records_with_a_restart():
    """Attempt 1 trains to step 40 (checkpoint at 30), attempt 2 resumes from 30; validation every 10 steps."""
    first = [{"step": s, "loss": 5 * math.exp(-s / 20) + 0.1, "learningRate": 1e-3 * min(1, s / 10), "attempt": 1,
              "startStep": 0} for s in range(1, 41)]
    second = [{"step": s, "loss": 5 * math.exp(-s / 20) + 0.1, "learningRate": 1e-3, "attempt": 2,
               "startStep": 30} for s in range(31, 61)]
    evals = [{"step": s, "evalLoss": 5 * math.exp(-s / 25) + 0.3, "attempt": 1 if s <= 40 else 2,
              "startStep": 0 if s <= 40 else 30} for s in (10, 20, 30, 40, 50, 60)]
    return sorted(first + evals[:4], key=lambda r: r["step"]) + sorted(second + evals[4:], key=lambda r: r["step"])


def test_the_plot_draws_training_loss_validation_loss_the_learning_rate_and_marks_the_restart(tmp_path):
    records = records_with_a_restart()
    records.append({"phase": "Preparing", "rows": 10})  # the heartbeat: no step, not drawn
    (tmp_path / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    read = read_progress(tmp_path / "progress.jsonl")
    assert len(read) == len(records) - 1
    figure = loss_figure(read, "job: model (lora)")
    lines = lines_by_label(figure)
    assert set(lines) == {"training loss", "validation loss", "learning rate"}
    assert (lines["training loss"].get_color(), lines["validation loss"].get_color(),
            lines["learning rate"].get_color()) == (TRAIN, EVAL, RATE)
    steps, losses = lines["training loss"].get_data()
    assert list(steps) == list(range(1, 61))  # steps 31-40, trained twice, drawn once: the newest attempt's
    assert losses[0] > losses[-1]
    assert list(lines["validation loss"].get_xdata()) == [10, 20, 30, 40, 50, 60]
    assert figure.axes[0].get_title() == "job: model (lora)"
    marks = [line for axis in figure.axes for line in axis.get_lines() if line.get_color() == RESTART]
    assert [list(m.get_xdata())[0] for m in marks] == [30]
    assert "restart (attempt 2)" in [t.get_text() for t in figure.axes[0].texts]
    path = write_loss_plot(read, tmp_path / "loss.png", "job: model (lora)")
    assert Image.open(path).size == (960, 540)


def test_a_resume_of_a_local_run_is_marked_as_a_resume():
    records = [{"step": 1, "loss": 2.0, "startStep": 0}, {"step": 2, "loss": 1.5, "startStep": 0},
               {"step": 3, "loss": 1.4, "startStep": 2}]
    assert restarts(records) == [(2, "resumed at step 2")]
    assert restarts([{"step": 1, "loss": 1.0}]) == []  # records of an older trainer: nothing to mark


def test_preference_objectives_get_a_panel_of_reward_margin_and_accuracy(tmp_path):
    records = [{"step": s, "loss": 0.69 - s / 100, "rewardsMargin": s / 20, "rewardsAccuracy": min(1.0, 0.5 + s / 40)}
               for s in range(1, 21)]
    figure = loss_figure(records, "dpo")
    lines = lines_by_label(figure)
    assert {"training loss", "chosen - rejected", "preference accuracy"} <= set(lines)
    assert len({id(a) for a in figure.axes}) >= 3  # loss, margin, and accuracy's own axis
    assert write_loss_plot(records, tmp_path / "dpo.png", "dpo") is not None


def test_nothing_to_draw_writes_nothing_and_a_diverged_loss_is_left_out(tmp_path):
    assert write_loss_plot([], tmp_path / "a.png", "t") is None
    assert write_loss_plot([{"step": 1, "loss": float("nan")}], tmp_path / "b.png", "t") is None
    assert not (tmp_path / "a.png").exists() and not (tmp_path / "b.png").exists()
    figure = loss_figure([{"step": 1, "loss": 2.0}, {"step": 2, "loss": float("inf")}], "t")
    assert list(lines_by_label(figure)["training loss"].get_xdata()) == [1]


@pytest.mark.parametrize(("name", "label"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("gpt2", "gpt2"),
    ("/tmp/pytest-of-root/pytest-3/tiny-model0/tiny-llama", "tiny-llama"),
    ("/models/tiny-llama/", "tiny-llama"),
    ("./runs/models/tiny-llama", "tiny-llama"),
    ("s3://models/qwen2.5-7b-instruct", "qwen2.5-7b-instruct"),
    ("s3://models/", "models"),
], ids=["hub-id", "hub-name", "tmp-path", "trailing-slash", "relative", "bucket", "bucket-root"])
def test_the_title_names_the_model_without_the_directories_it_sits_in(name, label):
    assert model_label(name) == label


def test_a_relative_directory_that_exists_is_a_path_not_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert model_label("org/model") == "model"
