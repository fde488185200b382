"""The preference objectives and reward modelling: TRL's maintained trainers (and their configs) for
method.objective, with the spec's settings as each one names them. Our SFT stays ours (transformers' Trainer with our
data layer)."""

import os
from typing import Any

from finetune_operator.api.spec import FineTuneJobSpec

DEFAULT_LOSS = {"dpo": "sigmoid", "kto": "kto", "cpo": "sigmoid"}


def trl_classes(objective: str) -> tuple[type, type]:
    """(config, trainer) of an objective. ORPO and CPO (cpo; simpo is CPO's simpo loss without its BC term) live in
    trl.experimental in TRL 1.x: the maintained code, behind a namespace that says its API may still move."""
    if objective == "dpo":
        from trl import DPOConfig, DPOTrainer

        return DPOConfig, DPOTrainer
    if objective == "kto":
        from trl import KTOConfig, KTOTrainer

        return KTOConfig, KTOTrainer
    if objective == "reward":
        from trl import RewardConfig, RewardTrainer

        return RewardConfig, RewardTrainer
    if objective == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        return GRPOConfig, GRPOTrainer
    # Chosen knowingly and documented: the warning it prints at import would be noise in every pod's log.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if objective == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return ORPOConfig, ORPOTrainer
    if objective in ("simpo", "cpo"):
        from trl.experimental.cpo import CPOConfig, CPOTrainer

        return CPOConfig, CPOTrainer
    raise ValueError(f"no TRL trainer for method.objective {objective}")


def objective_arguments(spec: FineTuneJobSpec) -> dict[str, Any]:
    """The config's own fields from spec.method.preference and spec.data (TRL tokenizes the examples itself)."""
    pref, objective = spec.method.preference, spec.method.objective
    if objective == "grpo":
        from finetune_trainer.training.grpo import grpo_arguments

        return grpo_arguments(spec)
    if objective == "reward":
        # RewardTrainer drops a pair longer than max_length (the others truncate): counted and said in main.
        return {"max_length": spec.data.max_length, "center_rewards_coefficient": pref.center_rewards_coefficient}
    args: dict[str, Any] = {"beta": pref.beta, "max_length": spec.data.max_length}
    loss = pref.loss_type or DEFAULT_LOSS.get(objective)
    if objective == "dpo":
        args.update(loss_type=[loss], label_smoothing=pref.label_smoothing,
                    precompute_ref_log_probs=pref.precompute_ref_log_probs)
    elif objective == "kto":
        args.update(loss_type=loss, desirable_weight=pref.desirable_weight,
                    undesirable_weight=pref.undesirable_weight,
                    precompute_ref_log_probs=pref.precompute_ref_log_probs)
    elif objective == "simpo":
        # cpo_alpha 0: SimPO proper (CPO's behaviour-cloning term off), as TRL's CPOConfig sets for loss_type simpo.
        args.update(loss_type="simpo", cpo_alpha=0.0, simpo_gamma=pref.simpo_gamma,
                    label_smoothing=pref.label_smoothing)
    elif objective == "cpo":
        # CPO proper: a preference loss plus cpo_alpha x the chosen answers' NLL (TRL's CPOConfig defaults).
        args.update(loss_type=loss, cpo_alpha=pref.cpo_alpha, label_smoothing=pref.label_smoothing)
    return args
