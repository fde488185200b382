"""Cross-section rules of the preference objectives: a setting that TRL's trainer would ignore, or refuse only once
the pods run, is refused at validation with its path (spec.py runs them with the other rules)."""

from typing import Any

from .errors import FieldError
from .method import PREFERENCE_OBJECTIVES, SMOOTHED_LOSSES

EXO_PAIR_SMOOTHING = 0.001  # the EXO paper's value, as TRL's error message gives it
# KTO's losses that estimate the KL term against a neighbour's completion (KTOTrainer: all but apo_zero_unpaired).
KL_LOSSES = ("kto",)


def preference_rules(spec: Any) -> list[FieldError]:
    """method.preference against the loss that reads it, data settings only SFT reads, KTO's sampling."""
    objective = spec.method.objective
    if objective not in PREFERENCE_OBJECTIVES:
        return []
    return _smoothing(spec.method) + _sft_only_data(spec.data, objective) + _kto_batches(spec)


def _smoothing(method: Any) -> list[FieldError]:
    pref, objective = method.preference, method.objective
    if objective not in SMOOTHED_LOSSES:
        return []  # labelSmoothing is refused for them by spec._preference_settings
    loss = pref.loss_type or {"dpo": "sigmoid", "cpo": "sigmoid", "simpo": "simpo"}[objective]
    where = "method.preference.labelSmoothing"
    if loss == "exo_pair" and pref.label_smoothing == 0:
        return [FieldError(where, 0.0, "lossType exo_pair divides by the assumed share of flipped labels: it needs "
                           "labelSmoothing above 0 (TRL fails at the first step otherwise)",
                           f"set labelSmoothing: {EXO_PAIR_SMOOTHING} (the EXO paper's value)")]
    if pref.label_smoothing and loss not in SMOOTHED_LOSSES[objective]:
        uses = " or ".join(SMOOTHED_LOSSES[objective])
        return [FieldError(where, pref.label_smoothing, f"method.objective {objective} with lossType {loss} ignores "
                           f"labelSmoothing (TRL reads it only for {uses})",
                           f"remove labelSmoothing, or set lossType: {SMOOTHED_LOSSES[objective][0]}")]
    return []


def _sft_only_data(data: Any, objective: str) -> list[FieldError]:
    """TRL's trainers tokenize the pairs themselves: they truncate at data.maxLength (the reward model leaves long
    pairs out) and learn only the answers, whatever these SFT settings say."""
    errors = []
    if data.truncation != "truncate":
        errors.append(FieldError("data.truncation", data.truncation, f"method.objective {objective} tokenizes "
                                 "through TRL, which truncates at data.maxLength (reward: leaves long pairs out, "
                                 "counted) whatever truncation says", "remove truncation"))
    if data.train_on_prompt:
        errors.append(FieldError("data.trainOnPrompt", True, f"method.objective {objective} learns the answers; "
                                 "the prompt is never part of a preference loss", "remove trainOnPrompt"))
    return errors


def _kto_batches(spec: Any) -> list[FieldError]:
    """KTOTrainer estimates its KL term from each example's neighbour in a batch taken in order: any other sampler
    breaks that pairing (TRL refuses it once the pods run), and a batch of one has no neighbour."""
    pref = spec.method.preference
    if spec.method.objective != "kto" or (pref.loss_type or "kto") not in KL_LOSSES:
        return []
    errors = []
    strategy = spec.training.extra_args.get("train_sampling_strategy", "sequential")
    if strategy != "sequential":
        errors.append(FieldError("training.extraArgs.train_sampling_strategy", strategy, "method.objective kto "
                                 "(lossType kto) pairs each example with its neighbour's completion to estimate "
                                 "the KL term, which needs the examples in a fixed order",
                                 "remove it (the examples are shuffled once with training.seed), set sequential "
                                 "to keep the data's own order, or use lossType apo_zero_unpaired"))
    if spec.training.per_device_train_batch_size < 2:
        errors.append(FieldError("training.perDeviceTrainBatchSize", spec.training.per_device_train_batch_size,
                                 "method.objective kto (lossType kto) estimates the KL term from the other examples "
                                 "of a batch: a batch of one has none", "use 2 or more"))
    return errors
