"""loss.png: drawn from progress records as the trainer writes them."""

import math

from PIL import Image

from finetune_trainer.outputs.plot import EVAL, RATE, TRAIN, read_progress, write_loss_plot


def count(image, color):
    return sum(1 for pixel in image.get_flattened_data() if pixel == color)


def test_the_plot_draws_training_loss_validation_loss_and_the_learning_rate(tmp_path):
    records = [{"step": s, "loss": 5 * math.exp(-s / 20) + 0.1, "learningRate": 1e-3 * min(1, s / 10)}
               for s in range(1, 61)]
    records += [{"step": s, "evalLoss": 5 * math.exp(-s / 25) + 0.3} for s in (10, 20, 30, 40, 50, 60)]
    records.append({"phase": "Preparing", "rows": 10})  # the heartbeat: no step, not drawn
    (tmp_path / "progress.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in records))
    path = write_loss_plot(read_progress(tmp_path / "progress.jsonl"), tmp_path / "loss.png", "job: model (lora)")
    image = Image.open(path).convert("RGB")
    assert image.size == (960, 540)
    assert count(image, TRAIN) > 500 and count(image, EVAL) > 100 and count(image, RATE) > 100
    # The training loss falls: its pixels near the left are higher up (smaller y) than near the right.
    train = [(x, y) for x in range(image.width) for y in range(image.height) if image.getpixel((x, y)) == TRAIN
             and y > 80]  # below the legend
    left, right = min(train), max(train)
    assert left[1] < right[1]


def test_nothing_to_draw_writes_nothing_and_a_diverged_loss_is_left_out(tmp_path):
    assert write_loss_plot([], tmp_path / "a.png", "t") is None
    assert write_loss_plot([{"step": 1, "loss": float("nan")}], tmp_path / "b.png", "t") is None
    assert not (tmp_path / "a.png").exists() and not (tmp_path / "b.png").exists()
    one = write_loss_plot([{"step": 1, "loss": 2.0}, {"step": 2, "loss": float("inf")}], tmp_path / "c.png", "t")
    assert one is not None and count(Image.open(one).convert("RGB"), TRAIN) > 0
