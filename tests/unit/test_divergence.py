"""runPolicy.divergence: a run whose loss stays far above its first step's stops (exit 79, not retried) with the
checkpoint from before it kept; a shorter spike is a warning and saves no checkpoint while it lasts; normal and
noisy runs never trip it."""

import math
import random

import pytest
from transformers import TrainerControl, TrainerState

from finetune_operator.api.run_policy import DivergencePolicy
from finetune_trainer.training.callbacks import DivergenceWatch


def drive(losses: list[float], policy: DivergencePolicy | None = None, history: list[dict] | None = None,
          every: int = 10):
    """Feeds logged losses (one per `every` steps, the first at step 1) to a watch; returns it, the warnings, and
    the steps at which a save was allowed."""
    warnings: list[tuple[str, str]] = []
    watch = DivergenceWatch(policy or DivergencePolicy(), lambda reason, message: warnings.append((reason, message)))
    state, control = TrainerState(), TrainerControl()
    state.log_history = list(history or [])
    watch.on_train_begin(None, state, control)
    saves = []
    for i, loss in enumerate(losses):
        state.global_step = 1 if i == 0 else i * every
        control.should_save = True  # what the Trainer's save_steps would ask for at every log
        watch.on_step_end(None, state, control)
        watch.on_log(None, state, control, logs={"loss": loss, "grad_norm": 1.0})
        if control.should_save:
            saves.append(state.global_step)
        if control.should_training_stop:
            break
    return watch, warnings, saves


def test_a_learning_rate_far_too_high_stops_the_run_with_the_numbers():
    watch, warnings, saves = drive([6.0, 5.1, 3180.0, 5825.0, 703.0, 650.0])
    assert watch.diverged_at == 40 and watch.value == 703.0
    assert "3 logged losses in a row above 18 (max(3 x the first step's 6, first + 3)) from step 20 to 40" in \
        watch.message
    assert "up to 5825" in watch.message
    assert watch.last_good_step == 10 and saves == [1, 10]  # no save once the loss rose
    assert warnings == []


def test_a_short_spike_warns_and_saves_nothing_while_it_lasts():
    watch, warnings, saves = drive([6.0, 4.0, 40.0, 35.0, 3.5, 3.0])
    assert watch.diverged_at is None
    assert [reason for reason, _ in warnings] == ["LossSpike"]
    assert "spiked to 40 at step 20-30" in warnings[0][1] and "came back to 3.5 at step 40" in warnings[0][1]
    assert saves == [1, 10, 50]  # the step that logs the recovery is not saved either (decided at its step end)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_loss_stops_at_once(value):
    watch, _, saves = drive([6.0, 5.0, value, 4.0])
    assert watch.diverged_at == 20 and "the loss became" in watch.message and saves == [1, 10]


def test_a_non_finite_gradient_norm_stops_at_once():
    watch = DivergenceWatch(DivergencePolicy())
    state, control = TrainerState(global_step=7), TrainerControl()
    watch.on_log(None, state, control, logs={"loss": 2.0, "grad_norm": math.inf})
    assert watch.diverged_at == 7 and "gradient norm became inf" in watch.message
    assert control.should_training_stop and not control.should_save


def test_warn_keeps_training_and_says_so_once():
    watch, warnings, _ = drive([6.0, 100.0, 200.0, 300.0, 400.0, 500.0],
                               DivergencePolicy.model_validate({"action": "warn"}))
    assert watch.diverged_at is None
    assert [reason for reason, _ in warnings] == ["LossDiverging"]


def test_off_ignores_the_loss_but_never_a_nan():
    off = DivergencePolicy.model_validate({"action": "off"})
    assert drive([6.0, 100.0, 200.0, 300.0, 400.0], off)[0].diverged_at is None
    assert drive([6.0, math.nan], off)[0].diverged_at == 10


def test_a_resumed_run_keeps_the_first_loss_of_the_run_it_continues():
    watch, _, _ = drive([30.0, 40.0, 50.0], history=[{"loss": 6.0, "step": 1}, {"loss": 4.0, "step": 10}])
    assert watch.first == 6.0 and watch.diverged_at is not None


def test_tuned_thresholds():
    policy = DivergencePolicy.model_validate({"factor": 10, "minIncrease": 0, "patience": 2})
    assert drive([6.0, 50.0, 55.0, 58.0], policy)[0].diverged_at is None
    assert drive([6.0, 61.0, 70.0], policy)[0].diverged_at == 20


@pytest.mark.parametrize("seed", range(20))
def test_normal_and_noisy_runs_never_trip_it(seed):
    """A falling loss with the noise of tiny batches (each logged loss x0.3-3), from a random model's 6.2 or a
    pretrained model's 0.5: no stop, no warning."""
    rng = random.Random(seed)
    for start in (6.2, 2.0, 0.5):
        losses = [start] + [max(0.05, start * (0.2 + 0.8 * math.exp(-i / 50))) * rng.uniform(0.3, 3.0)
                            for i in range(1, 400)]
        watch, warnings, _ = drive(losses)
        assert watch.diverged_at is None and warnings == [], (start, watch.message, warnings)


def test_a_resume_on_another_world_size_says_what_it_does_to_the_global_batch(tmp_path):
    import json
    from types import SimpleNamespace

    from finetune_trainer.outputs import checkpoints
    from finetune_trainer.training import advice

    saved = SimpleNamespace(world_size=1, per_device_train_batch_size=2, gradient_accumulation_steps=1)
    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    (checkpoint / checkpoints.COMPLETE_MARKER).write_text(json.dumps({"producedBy": advice.topology(saved)}))
    said: list[tuple[str, str]] = []
    advice.batch_changed(checkpoint, saved, lambda *w: said.append(w))
    assert said == []  # the same topology: nothing to say
    advice.batch_changed(checkpoint, SimpleNamespace(**{**vars(saved), "world_size": 2}), lambda *w: said.append(w))
    assert [reason for reason, _ in said] == ["GlobalBatchChanged"]
    assert "global batch of 2 on 1 process(es), on 2: the global batch is now 4" in said[0][1]
    assert "each remaining step takes 2x the samples" in said[0][1]
