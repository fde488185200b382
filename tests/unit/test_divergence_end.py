"""runPolicy.divergence at the edges of a run: a run of any length is judged at its end (never Succeeded with
weights the guard calls diverged), a loss that rose on new rows while the model still knows the rows it started on is
not divergence, and a resumed run continues the judgement of the run it resumes (it never names a checkpoint saved
above its threshold as good).

The watch is driven as the Trainer drives it: per-step losses, logged at step 1 and every `every` steps as the mean
since the last log, saves every `save_steps`, the watch's own end-of-run log and judgement."""

import json
import random
import signal
import statistics
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from finetune_operator.api.run_policy import DivergencePolicy
from finetune_trainer.outputs import checkpoints
from finetune_trainer.training import advice
from finetune_trainer.training.divergence import REBASED_KEY, DivergenceWatch, FirstRows

VOCAB = 2048  # ln = 7.62: the loss of a uniform guess over the tiny model's vocabulary
# The per-step losses of the tiny model fully fine-tuned at learning rate 10 (benchmarks/divergence_guard.py).
LR_10 = [6.13, 1984, 2698, 3832, 4418, 5200, 4445, 5920, 7134, 8471, 8367, 10383, 8462, 6783, 7855, 6912, 5550, 5530,
         4664, 5339, 4454, 4545, 4989, 4112, 4523, 4370, 4250, 3762, 3209, 3289, 3106, 3947, 5061, 4255, 3786, 4761,
         5248, 5061, 4118, 4288, 4176, 4811, 5285, 4561, 3975]


def train(per_step: list[float], every: int = 1, save_steps: int = 0, policy: DivergencePolicy | None = None,
          history: list[dict] | None = None, eval_every: int = 0, eval_loss: float = 0.0,
          first_rows=None, vocab: int | None = VOCAB, choices: int | None = None):
    """Runs the watch over `per_step` optimizer steps (after `history`'s, for a resumed run); returns the watch,
    the warnings (reason, message), the steps saved and the steps logged. `first_rows`: what measuring the rows of
    the first step again gives (the trainer's FineTuneTrainer.first_rows_loss), or a function of the step giving
    it; None where nothing measures them."""
    said: list[tuple[str, str]] = []
    args = SimpleNamespace(logging_strategy="steps")
    state, control = TrainerState(), TrainerControl()
    measure = (None if first_rows is None else first_rows if callable(first_rows) and not isinstance(first_rows, tuple)
               else lambda step: first_rows)
    watch = DivergenceWatch(policy or DivergencePolicy(), lambda *w: said.append(w), vocab,
                            None if measure is None else lambda: measure(state.global_step), choices=choices)
    state.log_history = list(history or [])
    start = max((h["step"] for h in state.log_history), default=0)
    state.global_step, state.max_steps = start, start + len(per_step)
    watch.on_train_begin(args, state, control)
    saves, logged, since = [], [], []
    for loss in per_step:
        state.global_step += 1
        step = state.global_step
        since.append(loss)
        control.should_log = step == 1 or step % every == 0  # logging_first_step, then loggingSteps
        control.should_save = bool(save_steps) and (step % save_steps == 0 or step == state.max_steps)
        watch.on_step_end(args, state, control)
        if control.should_log:  # Trainer.log: the history first, then the callbacks
            logs = {"loss": statistics.fmean(since), "grad_norm": 1.0}
            state.log_history.append({**logs, "step": step})
            watch.on_log(args, state, control, logs=logs)
            logged.append(step)
            since = []
        if eval_every and step % eval_every == 0:
            watch.on_log(args, state, control, logs={"eval_loss": eval_loss})
        if control.should_save:
            saves.append(step)
        if control.should_training_stop:
            watch.history = state.log_history
            return watch, said, saves, logged
    watch.judge_end(state.global_step)
    watch.history = state.log_history  # what a checkpoint saved now would hold
    return watch, said, saves, logged


def noisy_falling(start: float, steps: int, rng: random.Random, floor: float = 0.05) -> list[float]:
    """A healthy run's per-step losses: falling, with the noise of tiny batches (x0.3-3)."""
    return [max(floor, start * (0.2 + 0.8 * 2.718 ** (-i / 50))) * rng.uniform(0.3, 3.0) for i in range(steps)]


LENGTHS = range(2, 46)
EVERY = (1, 2, 5, 10, 25)


@pytest.mark.parametrize("every", EVERY, ids=lambda e: f"loggingSteps{e}")
def test_a_run_too_short_for_the_patience_never_ends_succeeded_with_diverged_weights(every):
    """The issue's runs: learning rate 10 for 10, 15, 20 steps (and 15 with loggingSteps 5, 40 with 25) exited 0
    with a final loss in the thousands. Every length from 2 steps on, every loggingSteps, is now judged diverged:
    by patience where the run is long enough, else at its end."""
    for steps in LENGTHS:
        watch, said, _, logged = train(LR_10[:steps], every=every)
        assert watch.diverged_at is not None, (steps, every, logged)
        assert logged[-1] == min(steps, watch.diverged_at)  # the last step is logged, whatever loggingSteps is
        if watch.diverged_at == steps and steps - 1 < 20:  # judged at the end: says so, and why it is not patience
            assert "training ended with the loss above its threshold" in watch.message, watch.message
            assert "the final weights are not saved" in watch.message
        assert said == []


# A reward model (objective reward, full, learning rate 5) as a review ran it: its pair loss starts at ln 2 and blew
# up at its second step; with no uniform guess to stand for its early loss, the blown-up warm-up became the early
# level and every length ended Succeeded.
REWARD_LR_5 = [0.68, 264, 7529, 730, 5120, 2210, 880, 4410, 3960, 1270, 610, 2890]


@pytest.mark.parametrize("every", EVERY, ids=lambda e: f"loggingSteps{e}")
def test_a_reward_model_that_blows_up_in_its_warm_up_is_judged_against_a_pair_scored_alike(every):
    for steps in range(2, 46):
        watch, _, _, _ = train((REWARD_LR_5[:1] + REWARD_LR_5[1:] * 4)[:steps], every=every, vocab=None, choices=2)
        assert watch.diverged_at is not None, (steps, every)
        assert "ln 2 (a pair's chosen and rejected scored alike)" in watch.message, watch.message


@pytest.mark.parametrize("every", EVERY, ids=lambda e: f"loggingSteps{e}")
def test_a_healthy_reward_model_of_any_length_ends_succeeded(every):
    rng = random.Random(0)
    per_step = [max(0.02, 0.69 * 0.97 ** i * rng.uniform(0.3, 2.5)) for i in range(45)]
    for steps in range(2, 46):
        watch, said, _, _ = train(per_step[:steps], every=every, vocab=None, choices=2)
        assert watch.diverged_at is None and said == [], (steps, every, watch.message)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("every", EVERY, ids=lambda e: f"loggingSteps{e}")
def test_healthy_runs_of_every_length_end_succeeded_without_a_warning(every, seed):
    """The other side of the end judgement: noisy healthy runs from a random model (6.2) or a fine-tuned one
    (0.5), an easy first batch, with validation losses far above the threshold (an eval-only spike), never end
    diverged and say nothing, at any length."""
    rng = random.Random(seed)
    runs = {"fresh": noisy_falling(6.2, 45, rng), "fine-tuned": noisy_falling(0.5, 45, rng),
            "easy first batch": [0.006] + [7.9 + rng.uniform(-0.3, 0.3) for _ in range(44)]}
    for name, per_step in runs.items():
        for steps in LENGTHS:
            watch, said, _, _ = train(per_step[:steps], every=every, eval_every=3, eval_loss=1e4)
            assert watch.diverged_at is None and said == [], (name, steps, watch.message, said)


def curriculum(rng: random.Random, known_steps: int = 30, new_steps: int = 90) -> list[float]:
    """A memorised model on a fixed data order (train_sampling_strategy: sequential): its known rows first (loss
    ~0.05), then new rows, whose loss starts at 8.2 and falls as they are learnt (the issue's run: 8.19 -> 7.36)."""
    known = [0.05 * rng.uniform(0.5, 1.5) for _ in range(known_steps)]
    new = [8.2 * (0.75 + 0.25 * 2.718 ** (-i / 40)) + rng.uniform(-0.3, 0.3) for i in range(new_steps)]
    return known + new


STILL_KNOWN = FirstRows(now=0.3, then=0.05)  # the first step's rows, measured again: still known
FORGOTTEN = FirstRows(now=9.5, then=2.0)  # ... a model that got worse on them


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("every", EVERY, ids=lambda e: f"loggingSteps{e}")
def test_a_loss_that_rose_on_new_rows_while_the_model_still_knows_its_first_rows_is_not_divergence(every, seed):
    """The issue's sequential curriculum was stopped (exit 79, step 63) while the new rows' loss fell. The guard now
    measures the rows of the first step again: still known, so the rows changed, not the model. A LossShifted
    warning, the new level is the early one from then on, checkpoints are saved again; at every loggingSteps."""
    watch, said, saves, _ = train(curriculum(random.Random(seed)), every=every, save_steps=10, first_rows=STILL_KNOWN)
    assert watch.diverged_at is None, watch.message
    assert [reason for reason, _ in said] == ["LossShifted"], said
    assert "when it rose the rows of the first optimizer step, measured again, had a loss of 0.3 (before that " \
        "step 0.05; diverged above 3.05): the rows are new" in said[0][1]
    assert watch.rebased is not None and 5 < watch.rebased <= 7.625  # at most ln V
    shifted = watch._rebased_at  # the save held back during the spike is made there, then every 10 steps
    due = list(range(-(-shifted // 10) * 10, 121, 10))
    assert [s for s in saves if s >= shifted] == ([] if shifted in due else [shifted]) + due


def test_a_curriculum_that_forgets_its_first_rows_while_it_learns_new_ones_is_not_stopped():
    """The benchmark's LoRA curriculum: its memorised rows went from 0.06 to 4.4 within the patience, while the new
    rows were learnt. What decides is what the model knew when the loss rose, not what it forgot since."""
    forgetting = lambda step: FirstRows(now=0.06 if step <= 35 else min(4.4, 0.06 + 0.3 * (step - 35)), then=0.05)  # noqa: E731
    watch, said, _, _ = train(curriculum(random.Random(0)), first_rows=forgetting)
    assert watch.diverged_at is None and [reason for reason, _ in said] == ["LossShifted"], (watch.message, said)


def test_without_a_measure_of_the_first_rows_the_same_curriculum_is_stopped():
    """Preference objectives do not measure their first rows again (their loss is no per-token loss): for them a
    loss that stays above the threshold for `patience` steps is divergence, as before."""
    watch, _, _, _ = train(curriculum(random.Random(0)))
    assert watch.diverged_at is not None and "measured again" not in watch.message


def test_a_run_that_ends_on_new_rows_it_is_still_learning_succeeds_and_says_so():
    watch, said, _, _ = train(curriculum(random.Random(0), new_steps=16), save_steps=10, first_rows=STILL_KNOWN)
    assert watch.diverged_at is None
    assert [reason for reason, _ in said] == ["LossAboveEarlyLevel"], said
    assert "the rows are new, the model did not diverge" in said[0][1]
    assert "the final model is the end of the run" in said[0][1]


@pytest.mark.parametrize("every", EVERY, ids=lambda e: f"loggingSteps{e}")
def test_a_loss_that_rose_because_the_model_got_worse_is_divergence_even_below_a_uniform_guess(every):
    """What the exemption must not let through: a fine-tuned model (loss 2) whose loss climbs to 10 (below a
    uniform guess's threshold, 22.9) and hovers there, and which lost its first rows too: stopped after patience,
    and at the end of a run too short for it, with the measure in the message."""
    rng = random.Random(3)
    rise = [2.0 + rng.uniform(-0.2, 0.2) for _ in range(80)] + [3.5, 5.0, 6.5, 8.0, 9.5]
    hover = [10.0 - 0.01 * i + rng.uniform(-0.5, 0.5) for i in range(60)]
    watch, said, _, _ = train(rise + hover, every=every, first_rows=FORGOTTEN)
    assert watch.diverged_at is not None and said == [], said
    assert "had a loss of 9.5 (before that step 2; diverged above 6): the model, not the data, got worse" \
        in watch.message
    watch, _, _, _ = train(rise + hover[:8], every=every, first_rows=FORGOTTEN)
    assert watch.diverged_at == 93 and "training ended with the loss above its threshold" in watch.message


def test_a_loss_far_above_a_uniform_guess_is_divergence_whatever_the_first_rows_say():
    """Learning rate 10's thousands: no rows are that new, nothing is measured."""
    asked: list[int] = []
    watch = DivergenceWatch(DivergencePolicy(), None, VOCAB, lambda: asked.append(1) or STILL_KNOWN)
    state, control = TrainerState(max_steps=100), TrainerControl()
    watch.on_train_begin(None, state, control)
    for step, loss in enumerate([6.13] * 25 + LR_10[1:], start=1):
        state.global_step = step
        watch.on_log(None, state, control, logs={"loss": loss})
        if control.should_training_stop:
            break
    assert watch.diverged_at == 45 and asked == []


def test_a_run_resumed_after_the_loss_shifted_keeps_the_new_level():
    """The level a run took after LossShifted is in its log history, so in every checkpoint after it: a resume
    continues from it instead of finding the spike again (its process measures other first rows)."""
    per_step = curriculum(random.Random(1))
    whole, said, _, _ = train(per_step, first_rows=STILL_KNOWN)
    assert [reason for reason, _ in said] == ["LossShifted"]
    before, _, _, _ = train(per_step[:100], first_rows=STILL_KNOWN)  # the run as far as its checkpoint-100
    history = before.history
    assert [entry[REBASED_KEY] for entry in history if REBASED_KEY in entry] == [whole.rebased]
    resumed, said, _, _ = train(per_step[100:], history=history)
    assert resumed.diverged_at is None and said == [] and resumed.rebased == whole.rebased
    forgotten = [{k: v for k, v in entry.items() if k != REBASED_KEY} for entry in history]
    assert train(per_step[100:], history=forgotten)[0].diverged_at is not None  # what the record prevents


def save_checkpoint(output_dir, step: int) -> None:
    directory = output_dir / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"weights")
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    checkpoints.mark_complete(directory)


def test_a_resumed_run_never_names_a_checkpoint_saved_above_its_threshold_as_the_good_one(tmp_path):
    """The issue's resumed run saved checkpoint-175 with a loss of 18.46, above its threshold 13.85 (one logged loss
    above it does not open a spike), diverged, and named checkpoint-175 "the last checkpoint before the loss began
    to rise (verified, kept)": its model generates 'hhhh'. The run before the resume saved checkpoint-150."""
    early = [4.617] * 150  # threshold max(3 x 4.617, 4.617 + 3) = 13.85
    history = [{"loss": loss, "step": step} for step, loss in enumerate(early, start=1)]
    rising = [4.6] * 24 + [18.46] + [30.0 + i for i in range(40)]  # step 175 is above, then the loss stays up
    watch, _, saves, _ = train(rising, history=history, save_steps=25)
    assert saves == [175] and watch.diverged_at is not None
    assert round(watch.threshold, 2) == 13.85 and watch.last_good_step == 174
    assert not watch.kept_good(175) and watch.kept_good(150)
    for step in (150, 175):
        save_checkpoint(tmp_path, step)
    text = advice.diverged(tmp_path, watch)
    assert f"the last checkpoint before the loss began to rise is {tmp_path / 'checkpoint-150'} (verified, kept)" \
        in text
    assert f"later ones (the newest: {tmp_path / 'checkpoint-175'}) hold the diverged weights" in text


def test_a_resumed_run_is_judged_as_the_run_it_continues():
    """Resumed at any step, the guard stops where the run would have stopped had it not been interrupted, and
    names the same last good step: the losses before the checkpoint are replayed from its history."""
    rng = random.Random(7)
    per_step = [2.0 + rng.uniform(-0.3, 0.3) for _ in range(40)] + [9.0 + rng.uniform(-1, 1) for _ in range(40)]
    whole, _, _, _ = train(per_step)
    for resume in range(1, 60):
        history = [{"loss": loss, "step": step} for step, loss in enumerate(per_step[:resume], start=1)]
        resumed, _, _, _ = train(per_step[resume:], history=history)
        assert (resumed.diverged_at, resumed.last_good_step) == (whole.diverged_at, whole.last_good_step), resume


@pytest.mark.parametrize("config", ["gemma3", "llama"])
def test_the_guards_vocabulary_is_read_where_a_multimodal_config_keeps_it(config):
    """Gemma-3 loads as Gemma3ForConditionalGeneration, whose config has no vocab_size of its own (its text config
    has): read from the top, the guard had no ln V, as a reward model had no ln 2 above."""
    from transformers import Gemma3Config, LlamaConfig

    from finetune_trainer.training.trainer import _vocab_size

    made = Gemma3Config() if config == "gemma3" else LlamaConfig(vocab_size=32000)
    expected = made.get_text_config().vocab_size
    assert expected and _vocab_size(SimpleNamespace(config=made)) == expected


@pytest.mark.parametrize("every", EVERY, ids=lambda e: f"loggingSteps{e}")
def test_a_stop_inside_a_spike_saves_nothing_and_one_before_it_saves(every):
    """A stop (suspend, preemption, an elastic resize) at every step of a run that spikes at step 31: the real
    watch and GracefulStop in build_trainer's order. Inside the spike no checkpoint is saved (a review saw step 37
    saved with the spike open, which checkpoints.keep would rotate the good ones out for); before it, one is."""
    from finetune_trainer.training.callbacks import GracefulStop

    per_step = [6.0] * 30 + [500.0] * 15
    for stop_at in range(2, 46):
        watch = DivergenceWatch(DivergencePolicy(), None, VOCAB)
        stop = GracefulStop(watch.withholds_saves)
        args = SimpleNamespace(logging_strategy="steps", save_strategy="steps", device="cpu")
        state, control = TrainerState(), TrainerControl()
        state.max_steps = len(per_step)
        watch.on_train_begin(args, state, control)
        since, saved = [], None
        for loss in per_step:
            state.global_step += 1
            step = state.global_step
            since.append(loss)
            control.should_log, control.should_save = step == 1 or step % every == 0, step % 10 == 0
            stop.requested = signal.SIGTERM if step == stop_at else None
            watch.on_step_end(args, state, control)
            stop.on_step_end(args, state, control)
            if control.should_log:  # the Trainer logs, then saves what should_save still says
                logs = {"loss": statistics.fmean(since), "grad_norm": 1.0}
                state.log_history.append({**logs, "step": step})
                watch.on_log(args, state, control, logs=logs)
                since = []
            if control.should_training_stop:
                saved = step if control.should_save else None
                break
        assert control.should_training_stop, stop_at
        if watch.spike:
            assert saved is None, (stop_at, every)
        else:
            assert saved == stop_at and not stop.withheld, (stop_at, every)
