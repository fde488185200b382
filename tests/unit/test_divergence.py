"""runPolicy.divergence: a run whose loss stays far above its early level stops (exit 79, not retried) with the
checkpoint from before it kept; a shorter spike is a warning and saves no checkpoint while it lasts; normal, noisy
and easy-first-batch runs never trip it."""

import math
import random

import pytest
import yaml
from transformers import TrainerControl, TrainerState

from finetune_operator.api.run_policy import DivergencePolicy
from finetune_trainer.training.divergence import DivergenceWatch

VOCAB = 2048  # ln = 7.62: the loss of a uniform guess over the tiny model's vocabulary


def drive(losses: list[float], policy: DivergencePolicy | None = None, history: list[dict] | None = None,
          every: int = 1, vocab: int | None = VOCAB):
    """Feeds logged losses (one per `every` optimizer steps, the first at step 1) to a watch; returns it, the
    warnings, and the steps at which a save was allowed."""
    warnings: list[tuple[str, str]] = []
    watch = DivergenceWatch(policy or DivergencePolicy(), lambda reason, message: warnings.append((reason, message)),
                            vocab)
    state, control = TrainerState(), TrainerControl()
    state.log_history = list(history or [])
    state.global_step = max((h["step"] for h in state.log_history), default=0)
    watch.on_train_begin(None, state, control)
    start = state.global_step
    saves = []
    for i, loss in enumerate(losses):
        if start:  # a resumed run logs every `every` steps after its checkpoint
            state.global_step = start + (i + 1) * every
        else:  # the Trainer logs step 1 (logging_first_step), then every `every` steps
            state.global_step = i + 1 if every == 1 else max(1, i * every)
        control.should_save = True  # what the Trainer's save_steps would ask for at every log
        watch.on_step_end(None, state, control)
        watch.on_log(None, state, control, logs={"loss": loss, "grad_norm": 1.0})
        if control.should_save:
            saves.append(state.global_step)
        if control.should_training_stop:
            break
    return watch, warnings, saves


def falling(start: float, steps: int, rng: random.Random, floor: float = 0.05) -> list[float]:
    return [max(floor, start * (0.2 + 0.8 * math.exp(-i / 50))) * rng.uniform(0.3, 3.0) for i in range(steps)]


def test_a_learning_rate_far_too_high_stops_the_run_with_the_numbers():
    losses = [6.0, 5.1] + [3180.0, 5825.0] + [703.0] * 30
    watch, warnings, saves = drive(losses, every=1)
    assert watch.diverged_at == 22 and watch.value == 703.0  # 20 optimizer steps above the threshold
    assert "every loss logged from step 3 to 22 (20 optimizer steps, 20 logs) is above 22.87" in watch.message
    assert "ln(vocabulary size) = 7.625, the loss of a uniform guess" in watch.message
    assert "up to 5825" in watch.message
    assert watch.last_good_step == 2 and saves == [1, 2]  # no save once the loss rose
    assert warnings == []


def test_a_divergence_after_the_warm_up_is_measured_against_the_runs_own_early_loss():
    losses = [2.0, 1.9, 2.1, 1.8] + [1.7] * 26 + [9.0] * 25
    watch, _, _ = drive(losses, every=1)
    assert watch.diverged_at == 54  # the last 10 steps average above 5.25 from step 35: 20 steps later
    assert "every loss logged from step 35 to 54 (20 optimizer steps, 20 logs) is above 5.25 = max(3 x early, " \
        "early + 3), early being the mean of the 20 losses logged in the first steps, 1.75" in watch.message


def test_an_easy_first_batch_does_not_make_a_healthy_run_diverged():
    """The issue's case: a model that already knows the first batch's rows (loss 0.006), then new rows at 7.9
    falling to 7.5. The old rule (max(3 x first, first + 3) = 3.006) stopped it at step 10."""
    rng = random.Random(42)
    new_rows = [7.9 - 0.4 * i / 200 + rng.uniform(-0.3, 0.3) for i in range(200)]
    for every in (1, 5):
        watch, warnings, _ = drive([0.006] + new_rows[::every], every=every)
        assert watch.diverged_at is None and warnings == [], (every, watch.message, warnings)


@pytest.mark.parametrize("seed", range(10))
def test_a_mix_of_known_and_new_rows_never_trips_it(seed):
    """Batches of rows the model already knows (~0) and new rows (~8) in any proportion: the mean of the warm-up
    and the later windows come from the same mix, and no single hard batch opens a spike."""
    rng = random.Random(seed)
    for known in (0.2, 0.5, 0.8, 0.95):
        losses = [rng.uniform(0.001, 0.05) if rng.random() < known else rng.uniform(6.5, 8.5) for _ in range(400)]
        for every in (1, 5):
            watch, warnings, _ = drive(losses if every == 1 else [
                sum(losses[i:i + every]) / every for i in range(0, 400, every)], every=every)
            assert watch.diverged_at is None and warnings == [], (known, every, watch.message)


def test_a_short_spike_warns_saves_nothing_while_it_lasts_and_saves_once_it_is_over():
    losses = [6.0] + [4.0] * 24 + [40.0] * 10 + [3.5, 3.0]
    watch, warnings, saves = drive(losses)
    assert watch.diverged_at is None
    assert [reason for reason, _ in warnings] == ["LossSpike"]
    # It starts once the last 10 steps average above 12.3 (step 28), and is over at the first loss below it.
    assert "spiked to 40 at step 28-35 (above 12.3, 8 optimizer step(s); 20 stop the run)" in warnings[0][1]
    assert "came back to 3.5 at step 36" in warnings[0][1]
    assert 27 in saves and not set(range(28, 36)) & set(saves) and 36 in saves  # the save due is made at 36


def test_one_hard_batch_is_neither_a_spike_nor_a_skipped_save():
    watch, warnings, saves = drive([4.0] * 30 + [40.0] + [4.0] * 10)
    assert watch.diverged_at is None and warnings == [] and saves == list(range(1, 42))


def test_patience_is_counted_in_optimizer_steps_not_in_logged_lines():
    policy = DivergencePolicy.model_validate({"patience": 30})
    losses = [2.0] * 5 + [50.0] * 10  # with loggingSteps 5: steps 25-70 above, 45 steps
    assert drive(losses, policy, every=5)[0].diverged_at == 50  # above from step 25, 30 steps after step 20
    assert drive([2.0] * 25 + [50.0] * 10, policy, every=1)[0].diverged_at is None  # 10 steps only


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_loss_stops_at_once(value):
    watch, _, saves = drive([6.0, 5.0, value, 4.0])
    assert watch.diverged_at == 3 and "the loss became" in watch.message and saves == [1, 2]


def test_a_non_finite_gradient_norm_stops_at_once():
    watch = DivergenceWatch(DivergencePolicy())
    state, control = TrainerState(global_step=7), TrainerControl()
    watch.on_log(None, state, control, logs={"loss": 2.0, "grad_norm": math.inf})
    assert watch.diverged_at == 7 and "gradient norm became inf" in watch.message
    assert control.should_training_stop and not control.should_save


def test_warn_keeps_training_and_says_so_once():
    watch, warnings, _ = drive([6.0] + [100.0 * i for i in range(1, 60)],
                               DivergencePolicy.model_validate({"action": "warn"}))
    assert watch.diverged_at is None
    assert [reason for reason, _ in warnings] == ["LossDiverging"]


def test_off_ignores_the_loss_but_never_a_nan_and_remembers_where_the_loss_rose():
    off = DivergencePolicy.model_validate({"action": "off"})
    watch, warnings, saves = drive([6.0] * 10 + [100.0] * 30, off)
    assert watch.diverged_at is None and warnings == [] and saves == list(range(1, 41))  # nothing held back
    watch, _, _ = drive([6.0] * 10 + [100.0] * 5 + [math.nan], off)
    assert watch.diverged_at == 16 and watch.last_good_step == 10  # the last loss under the threshold


@pytest.mark.parametrize("written", ["off", "'off'", "false"])
def test_off_as_yaml_writes_it_unquoted_is_off(written):
    """YAML 1.1 (kubectl, PyYAML) reads an unquoted off as false: the docs' spelling must be accepted."""
    assert DivergencePolicy.model_validate(yaml.safe_load(f"action: {written}")).action == "off"
    with pytest.raises(ValueError, match="'stop', 'warn' or 'off'"):
        DivergencePolicy.model_validate({"action": True})  # only false stands for a word


def test_a_resumed_run_keeps_the_early_loss_of_the_run_it_continues():
    history = [{"loss": 2.0, "step": s} for s in range(1, 31)]
    watch, _, _ = drive([20.0] * 25, history=history)
    assert watch.early_done and watch.baseline == 2.0
    # The losses before the checkpoint are replayed (their level too): stopped where the whole run would stop.
    assert watch.diverged_at == drive([2.0] * 30 + [20.0] * 25)[0].diverged_at == 52


def test_tuned_thresholds():
    policy = DivergencePolicy.model_validate({"factor": 10, "minIncrease": 0, "patience": 2, "warmupSteps": 3})
    assert drive([6.0] * 3 + [50.0, 55.0, 58.0] * 4, policy)[0].diverged_at is None
    assert drive([6.0] * 3 + [61.0] * 12, policy)[0].diverged_at == 14  # the level is above 60 from step 13


@pytest.mark.parametrize("seed", range(20))
def test_normal_and_noisy_runs_never_trip_it(seed):
    """A falling loss with the noise of tiny batches (each logged loss x0.3-3), from a random model's 6.2 or a
    pretrained model's 0.5, logged every step or every 5: no stop, no warning."""
    rng = random.Random(seed)
    for start in (6.2, 2.0, 0.5):
        for every in (1, 5):
            watch, warnings, _ = drive([start] + falling(start, 400, rng)[1::every], every=every)
            assert watch.diverged_at is None and warnings == [], (start, every, watch.message, warnings)


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


def test_rows_cut_at_max_length_are_announced_once_with_the_count():
    from types import SimpleNamespace

    from finetune_trainer.training import advice

    spec = SimpleNamespace(data=SimpleNamespace(max_length=128, format="alpaca"))
    said: list[tuple[str, str]] = []
    advice.row_outcomes(spec, {"train": {"rows": 300, "kept": 300, "truncated": 12, "longest": 900,
                                         "reply_tokens_cut": 40, "trainable_tokens": 5000,
                                         "first": {"truncated": "train.jsonl, row 7"}},
                               "eval": {"rows": 10, "truncated": 0}}, lambda *w: said.append(w))
    assert [reason for reason, _ in said] == ["RowsTruncated"]
    assert said[0][1].startswith("12 of 300 training row(s) were longer than data.maxLength=128 tokens (the "
                                 "first: train.jsonl, row 7; the longest: 900 tokens) and were cut: 40 reply token(s) "
                                 "past the cut are not trained")
    advice.row_outcomes(spec, {"train": {"rows": 300, "truncated": 0}}, lambda *w: said.append(w))
    assert len(said) == 1  # nothing cut: nothing said
