"""runPolicy.divergence: the guard that stops a run whose loss stays far above its early level, and judges the end
of every run by the same rule, so that a run of any length never ends Succeeded with weights it calls diverged."""

import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from transformers import TrainerCallback

# A spike starts when the losses logged over this many optimizer steps average above the threshold, so one hard batch
# in a mix of easy and hard rows never opens one.
LEVEL_WINDOW_STEPS = 10
# Written into the log history (and so into every checkpoint's trainer_state.json) where the guard took a shifted
# loss as its new early level: a resumed run replays it.
REBASED_KEY = "divergence_rebased_to"


class FirstRows(NamedTuple):
    """The loss of the rows of this process's first optimizer step: `then` before that step, `now` measured again."""

    now: float
    then: float


class DivergenceWatch(TrainerCallback):
    """Stops a run that diverged; main() then exits with DIVERGED (79, permanent: a retry diverges again).

    A NaN or infinite loss or gradient norm stops it at once. Otherwise the loss is compared with the run's early
    loss (`baseline`): the mean of the losses logged in the first warmupSteps optimizer steps, never above the loss
    of a uniform guess over the vocabulary (ln V), which stands in for it until the warm-up is over. A mean, because
    a mix of rows the model knows (loss ~0) and new ones (~ln V) is bimodal: a median lands in either mode, a mean is
    what later windows of the same mix average to; one easy first batch moves it by 1/N. A run that blows up inside
    the warm-up, or ends before it is over, is measured against ln V.

    A spike starts when the mean of the losses logged over the last LEVEL_WINDOW_STEPS steps is above the threshold
    (a single hard batch is not one) and lasts while the logged losses stay above it. No checkpoint is saved while it
    lasts, so the checkpoints before it are never rotated out by diverged ones. A spike lasting `patience` optimizer
    steps (over at least two logged losses) is divergence (stop, or a warning with action: warn), unless the model
    still knew the rows it started on when its loss rose: below the threshold a uniform guess would have
    (`ceiling`), the rows of the first optimizer step are measured again when a spike begins (`first_rows`, set by
    the trainer) and, when their loss is within the same threshold of what it was before that step, the loss rose
    because the rows did (a fixed data order, a curriculum, new rows resumed on): a LossShifted warning at patience,
    after which the guard measures against the new level.
    One that comes back sooner, after at least a quarter of the patience and two logged losses, is a warning (a
    shorter one is a hard stretch of batches, not news), and the save that was due during it is made at the step
    the loss is back. A spike still open when training ends (`judge_end`) is judged the same way, however short.
    Warnings go to `warn` (reason, message): the log and a Warning Event on the FineTuneJob. With action: off nothing
    is said or held back, but spikes are still tracked so that a NaN names the last good checkpoint.

    A resumed run replays the losses logged before its checkpoint (the history is in it), so it keeps the early loss,
    the spike, the last good step and any new level (REBASED_KEY) of the run it continues."""

    def __init__(self, policy: Any, warn: Callable[[str, str], None] | None = None, vocab_size: int | None = None,
                 first_rows: Callable[[], FirstRows | None] | None = None, choices: int | None = None):
        self.policy = policy
        self.first_rows = first_rows
        self._say = warn or (lambda reason, message: None)
        # The loss of a uniform guess: over the vocabulary (ln V), or over `choices` (a reward model's pair: ln 2).
        guessed = choices or vocab_size
        self.chance = math.log(guessed) if guessed and guessed > 1 else None
        self.chance_of = "ln 2 (a pair's chosen and rejected scored alike)" if choices == 2 else (
            f"ln({choices} choices)" if choices else "ln(vocabulary size)")
        self.diverged_at: int | None = None
        self.value: float | None = None
        self.message: str | None = None
        self.early: list[float] = []  # losses logged in the warm-up window
        self.early_done = False
        self.rebased: float | None = None  # the level measured against after a loss that jumped and fell
        self.recent: deque[tuple[int, float]] = deque()  # (step, loss) logged in the last LEVEL_WINDOW_STEPS
        self.level: float | None = None  # their mean
        self.spike: list[tuple[int, float]] = []
        self.spike_from = 0  # the last logged step before the spike: its length counts from there
        self.last_good_step = 0  # the last logged step whose loss was under the threshold
        self.logged: list[tuple[int, bool]] = []  # (step, under the threshold) of every logged loss
        self.warned_persistent = False
        self.save_owed = False  # a save that fell inside a spike, made once the loss is back
        self.replaying = False
        self._rebased_at: int | None = None
        self.rows_when_rose: FirstRows | None = None  # the first rows measured when the spike began

    @property
    def acting(self) -> bool:
        return self.policy.action != "off"

    @property
    def baseline(self) -> float | None:
        """The early loss the threshold is relative to; None while neither it nor the vocabulary is known."""
        if self.rebased is not None:
            return self.rebased
        if not self.early_done:
            return self.chance
        mean = statistics.fmean(self.early)
        return mean if self.chance is None else min(mean, self.chance)

    def _threshold_for(self, early: float | None) -> float | None:
        return None if early is None else max(self.policy.factor * early, early + self.policy.min_increase)

    @property
    def threshold(self) -> float | None:
        return self._threshold_for(self.baseline)

    @property
    def ceiling(self) -> float | None:
        """The threshold of a run whose early loss is a uniform guess: a loss above it is no new rows being learnt."""
        return self._threshold_for(self.chance)

    def kept_good(self, step: int | None) -> bool:
        """Whether a checkpoint saved at `step` holds weights from before the loss rose: at or before the last good
        step, and the loss logged at it (or first logged after it) under the threshold."""
        if step is None or step > self.last_good_step:
            return False
        return next((under for logged, under in self.logged if logged >= step), False)

    def _observe_early(self, step: int, loss: float) -> None:
        if self.early_done or not math.isfinite(loss):
            return
        self.early.append(loss)
        self.early_done = step >= self.policy.warmup_steps and len(self.early) >= 3

    def on_train_begin(self, args, state, control, **kwargs):
        # A resumed run continues the run it resumes: its losses are replayed quietly (no warning, no control, no
        # decision: where the run took a shifted loss as its new level, the history says so).
        self.replaying = True
        try:
            for entry in state.log_history:
                if isinstance(entry.get("loss"), (int, float)) and "train_loss" not in entry:
                    self._judge(int(entry.get("step", 0)), float(entry["loss"]), None)
                if isinstance(entry.get(REBASED_KEY), (int, float)):
                    self._take_level(int(entry.get("step", 0)), float(entry[REBASED_KEY]))
        finally:
            self.replaying = False
        if not self.logged:
            self.last_good_step = self.spike_from = state.global_step

    def withholds_saves(self) -> bool:
        """Whether a checkpoint saved now would hold weights inside a spike (none is saved while one lasts)."""
        return bool(self.spike) and self.acting

    def on_step_end(self, args, state, control, **kwargs):
        if self.spike and self.acting and control.should_save:
            control.should_save = False
            self.save_owed = True
        # The last step is always logged: the loss of the end of the run is what judge_end judges (with loggingSteps
        # 25 and maxSteps 40 the Trainer would log steps 1 and 25 only).
        if 0 < state.max_steps <= state.global_step and getattr(args, "logging_strategy", "steps") != "no":
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        for key in ("loss", "grad_norm"):
            value = logs.get(key)
            if isinstance(value, float) and not math.isfinite(value):
                self._stop(state.global_step, control, value, f"the {'loss' if key == 'loss' else 'gradient norm'} "
                                                              f"became {value} at step {state.global_step}")
                return
        loss = logs.get("loss")
        if not isinstance(loss, (int, float)) or "train_loss" in logs:
            return
        self._judge(state.global_step, float(loss), control)
        if self._rebased_at == state.global_step and state.log_history \
                and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1][REBASED_KEY] = self.rebased  # saved with the next checkpoint, for a resume

    def _judge(self, step: int, loss: float, control: Any) -> None:
        self._observe_early(step, loss)
        self.recent.append((step, loss))
        while self.recent[0][0] <= step - LEVEL_WINDOW_STEPS:
            self.recent.popleft()
        self.level = statistics.fmean(value for _, value in self.recent)
        threshold = self.threshold
        under = threshold is None or loss <= threshold
        self.logged.append((step, under))
        if under or (not self.spike and self.level <= threshold):
            if self.spike:
                self._spike_over(step, loss, control)
            if under:
                self.last_good_step = step
            self.spike_from = step
            return
        self.spike.append((step, loss))
        if not self.acting or self.replaying:
            return
        if control is not None:
            control.should_save = False
        if len(self.spike) == 1:  # the loss rose: did the model still know its first rows then?
            self.rows_when_rose = self._first_rows()
        if len(self.spike) < 2 or step - self.spike_from < self.policy.patience:
            return
        rows = self._rows()
        if rows is not None and rows.now <= self._rows_limit(rows):
            self._shifted(step, rows, control)
            return
        text = self._describe(step, rows)
        if self.policy.action == "stop":
            self._stop(step, control, loss, text)
        elif not self.warned_persistent:
            self.warned_persistent = True
            self.warn("LossDiverging", text + " (runPolicy.divergence.action: warn, training goes on)")

    def judge_end(self, step: int) -> None:
        """Training ended (not stopped on request): a spike still open is judged now, however short the run, by the
        same rule as at `patience`: the final weights are the spike's."""
        if self.diverged_at is not None or not self.spike or not self.acting:
            return
        rows = self._rows()
        if rows is not None and rows.now <= self._rows_limit(rows):
            self.warn("LossAboveEarlyLevel",
                       f"training ended with the loss above {self.threshold:.4g} ({self._early_text()}) since step "
                       f"{self.spike[0][0]} (at the end {self.spike[-1][1]:.4g}), but {self._rows_text(rows)}: the "
                       f"rows are new, the model did not diverge; no checkpoint was saved since step "
                       f"{self.spike_from}, the final model is the end of the run")
            return
        text = self._describe(step, rows, ended=True)
        if self.policy.action == "stop":
            self.diverged_at, self.value, self.message = step, self.spike[-1][1], text
        elif not self.warned_persistent:
            self.warned_persistent = True
            self.warn("LossDiverging", text + " (runPolicy.divergence.action: warn, the final model is saved)")

    def _first_rows(self) -> FirstRows | None:
        """The first step's rows measured again, unless the loss is above the ceiling (no rows are that new)."""
        ceiling = self.ceiling
        if self.first_rows is None or (ceiling is not None and self.level is not None and self.level > ceiling):
            return None
        return self.first_rows()

    def _rows(self) -> FirstRows | None:
        """What decides a spike: the first rows as measured when the loss rose. Measured then, because a model that
        goes on learning new rows forgets old ones (a LoRA curriculum's memorised rows went from 0.06 to 4.4 within
        its patience) while a diverged model had already lost them when its loss rose. None above the ceiling."""
        ceiling = self.ceiling
        if ceiling is not None and self.level is not None and self.level > ceiling:
            return None
        return self.rows_when_rose if self.rows_when_rose is not None else self._first_rows()

    def _rows_limit(self, rows: FirstRows) -> float:
        then = rows.then if self.chance is None else min(rows.then, self.chance)
        return max(self.policy.factor * then, then + self.policy.min_increase)

    def _rows_text(self, rows: FirstRows) -> str:
        return (f"when it rose the rows of the first optimizer step, measured again, had a loss of {rows.now:.4g} "
                f"(before that step {rows.then:.4g}; diverged above {self._rows_limit(rows):.4g})")

    def _shifted(self, step: int, rows: FirstRows, control: Any) -> None:
        old, first, lasted = self.threshold, self.spike[0][0], step - self.spike_from
        self._take_level(step, self.level if self.level is not None else self.spike[-1][1])
        self._rebased_at = step
        self.warn("LossShifted",
                   f"the loss rose above {old:.4g} at step {first} and stayed there for {lasted} optimizer steps, "
                   f"but {self._rows_text(rows)}: the rows are new (a fixed data order, a curriculum, other data "
                   f"resumed on), the model did not diverge. From step {step} the threshold is {self.threshold:.4g}, "
                   f"measured from the loss's level now, {self.rebased:.4g}; no checkpoint was saved meanwhile, one "
                   "is saved now")
        if self.save_owed and control is not None:
            control.should_save = True
        self.save_owed = False

    def _take_level(self, step: int, level: float) -> None:
        """The loss now is the new early level (LossShifted, or its record in a resumed run's history)."""
        self.rebased = level if self.chance is None else min(level, self.chance)
        self.spike.clear()
        self.rows_when_rose = None
        self.warned_persistent = False
        self.last_good_step = self.spike_from = step
        if self.logged and self.logged[-1][0] == step:
            self.logged[-1] = (step, True)

    def warn(self, reason: str, message: str) -> None:
        """A warning (the log, a Warning Event), unless the losses of a resumed run's history are replayed."""
        if not self.replaying:
            self._say(reason, message)

    def _early_text(self) -> str:
        if self.rebased is not None:
            return f"early being the level the loss shifted to, {self.rebased:.4g}"
        chance = f"{self.chance_of} = {self.chance:.4g}, the loss of a uniform guess"
        if not self.early_done:
            return "early being " + chance + ", until the first warmupSteps are logged"
        mean = statistics.fmean(self.early)
        text = f"the mean of the {len(self.early)} losses logged in the first steps, {mean:.4g}"
        return "early being " + (text if self.chance is None or mean <= self.chance else f"{chance} (below {text})")

    def _describe(self, step: int, rows: FirstRows | None, ended: bool = False) -> str:
        peak = max(value for _, value in self.spike)
        lasted = step - self.spike_from
        span = (f"every loss logged from step {self.spike[0][0]} to {step} ({lasted} optimizer steps, "
                f"{len(self.spike)} logs) is above {self.threshold:.4g} = max({self.policy.factor:g} x early, early + "
                f"{self.policy.min_increase:g}), {self._early_text()}; up to {peak:.4g}, ")
        measured = "" if rows is None else f"; {self._rows_text(rows)}: the model, not the data, got worse"
        if not ended:
            return f"the loss diverged: {span}now {self.spike[-1][1]:.4g}{measured}"
        return (f"the loss diverged: training ended with the loss above its threshold: {span}at the end "
                f"{self.spike[-1][1]:.4g}{measured}. A run is judged at its end however short it is (patience, "
                f"{self.policy.patience} steps, is how long a longer run would have gone on): the final weights are "
                "not saved")

    def _spike_over(self, step: int, loss: float, control: Any) -> None:
        steps = [s for s, _ in self.spike]
        peak = max(value for _, value in self.spike)
        lasted = steps[-1] - self.spike_from
        if (self.acting and not self.warned_persistent and len(steps) >= 2
                and lasted >= max(2, self.policy.patience // 4)):
            self.warn("LossSpike", f"the loss spiked to {peak:.4g} at step {steps[0]}"
                       f"{'' if len(steps) == 1 else f'-{steps[-1]}'} (above {self.threshold:.4g}, {lasted} "
                       f"optimizer step(s); {self.policy.patience} stop the run) and came back to {loss:.4g} at step "
                       f"{step}; no checkpoint was saved during the spike")
        if self.save_owed and self.acting and control is not None:
            control.should_save = True  # the Trainer saves after on_log: these weights are past the spike
        self.spike.clear()
        self.rows_when_rose = None
        self.warned_persistent = self.save_owed = False

    def _stop(self, step: int, control: Any, value: float, text: str) -> None:
        if self.replaying:
            return
        self.diverged_at, self.value, self.message = step, value, text
        if control is not None:
            control.should_training_stop = True
            control.should_save = False  # never checkpoint diverged weights over good ones
