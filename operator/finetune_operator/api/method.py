"""spec.method: what is trained (all weights, LoRA/QLoRA adapters, or the top layers only)."""

from typing import Literal

from pydantic import Field

from .base import ApiModel
from .grpo import GrpoSpec
from .sources import LOCATION_SCHEMA, Location

MethodType = Literal["full", "lora", "qlora", "freeze"]


class LoraSpec(ApiModel):
    r: int = Field(default=16, ge=1, le=4096, description="LoRA rank.")
    alpha: int = Field(default=32, ge=1, le=65536, description="LoRA alpha (scaling = alpha / r).")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="Dropout on the LoRA path.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        min_length=1,
        max_length=256,
        description='Module names (or suffixes) that get adapters; ["all-linear"] targets every linear layer but '
        "the output head.",
    )
    modules_to_save: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Modules trained fully and saved with the adapter (e.g. embed_tokens, lm_head when adding tokens).",
    )
    use_rslora: bool = Field(default=False, description="Rank-stabilised scaling alpha / sqrt(r).")
    use_dora: bool = Field(default=False, description="Weight-decomposed LoRA (DoRA).")
    init_from: Location | None = Field(
        default=None, min_length=1, max_length=1024, json_schema_extra=LOCATION_SCHEMA,
        description="Continue training an existing adapter (the seeds' peft_path): a directory in a volume or a Hub "
        "id holding adapter_config.json and its weights. The adapter's own r, alpha and target modules are used; "
        "those above are ignored.")


class FreezeSpec(ApiModel):
    trainable_layers: int = Field(
        default=2, ge=1, le=1024, description="Number of final transformer blocks left trainable."
    )
    extra_trainable_modules: list[str] = Field(
        default_factory=list, max_length=64, description="Other parameter-name substrings to train, e.g. lm_head."
    )


Objective = Literal["sft", "dpo", "kto", "orpo", "simpo", "cpo", "reward", "grpo"]
PREFERENCE_OBJECTIVES = ("dpo", "kto", "orpo", "simpo", "cpo", "reward")
REFERENCE_FREE = ("orpo", "simpo", "cpo", "reward")  # no reference model: nothing to precompute, no second copy
# TRL's loss variants that need nothing but the objective's data (DPOConfig.loss_type, KTOConfig.loss_type).
DPO_LOSSES = ("sigmoid", "hinge", "ipo", "robust", "exo_pair", "nca_pair", "bco_pair", "sppo_hard", "apo_zero",
              "apo_down", "sigmoid_norm")
KTO_LOSSES = ("kto", "apo_zero_unpaired")
CPO_LOSSES = ("sigmoid", "hinge", "ipo")  # CPOConfig.loss_type; its simpo loss is objective simpo
# The losses that read label_smoothing (TRL ignores it for the others): DPOTrainer's robust and exo_pair (which needs
# it), CPOTrainer's sigmoid and simpo.
SMOOTHED_LOSSES = {"dpo": ("robust", "exo_pair"), "cpo": ("sigmoid",), "simpo": ("simpo",)}
PreferenceLoss = Literal["sigmoid", "hinge", "ipo", "robust", "exo_pair", "nca_pair", "bco_pair", "sppo_hard",
                         "apo_zero", "apo_down", "sigmoid_norm", "kto", "apo_zero_unpaired"]


class PreferenceSpec(ApiModel):
    beta: float = Field(default=0.1, gt=0, le=100, description="dpo and kto: how far the policy may move from the "
                        "reference model (the KL penalty's inverse temperature; lower lets it move further). orpo: "
                        "lambda, the weight of the odds-ratio term beside the SFT loss. simpo: the reward scale (the "
                        "SimPO paper uses 2 to 10).")
    loss_type: PreferenceLoss | None = Field(
        default=None, description="The loss variant, as TRL names it. dpo: sigmoid (default, the DPO paper's), ipo, "
        "hinge, robust (noisy labels, with labelSmoothing), exo_pair, nca_pair, bco_pair, sppo_hard, apo_zero, "
        "apo_down, sigmoid_norm. kto: kto (default) or apo_zero_unpaired. cpo: sigmoid (default), hinge, ipo. orpo "
        "and simpo have one loss each.")
    label_smoothing: float = Field(default=0.0, ge=0, le=0.49, description="Assumed fraction of flipped "
                                   "preference labels: dpo with lossType robust or exo_pair (which needs it: the EXO "
                                   "paper uses 0.001), cpo with sigmoid, simpo. The other losses ignore it, so it is "
                                   "refused there.")
    precompute_ref_log_probs: bool = Field(default=False, description="dpo and kto: compute the reference model's "
                                           "log-probabilities once before training, so a full fine-tune does not "
                                           "hold a second model during it (LoRA needs no copy: the reference is the "
                                           "base with the adapter disabled).")
    desirable_weight: float = Field(default=1.0, gt=0, le=100, description="kto: weight of the desirable "
                                    "examples' loss; raise it (or lower undesirableWeight) when they are fewer, so "
                                    "that weight x count is about equal for both (the KTO paper allows up to 4:3).")
    undesirable_weight: float = Field(default=1.0, gt=0, le=100, description="kto: weight of the undesirable "
                                      "examples' loss.")
    simpo_gamma: float = Field(default=0.5, ge=0, le=10, description="simpo: the target reward margin (the paper's "
                               "gamma over beta).")
    cpo_alpha: float = Field(default=1.0, ge=0, le=100, description="cpo: weight of the behaviour-cloning term (the "
                             "chosen answers' negative log-likelihood) beside the preference loss; 1 as in the CPO "
                             "paper and TRL's CPOConfig.")
    center_rewards_coefficient: float | None = Field(
        default=None, gt=0, le=1, description="reward: weight of a penalty on the mean squared reward, which keeps "
        "the scores centred on zero (0.01 in the paper that proposed it, Eisenstein et al. 2023); unset: none.")


class MethodSpec(ApiModel):
    type: MethodType = Field(
        default="lora",
        description="full: every weight; lora: adapters on a frozen base; qlora: lora on a 4-bit base (GPU only); "
        "freeze: only the last layers.",
    )
    objective: Objective = Field(
        default="sft", description="sft: supervised fine-tuning or continued pretraining (the data's format says "
        "which). Preference tuning, through TRL's trainers: dpo (Direct Preference Optimization, DPOTrainer) on "
        "preference pairs; kto (KTOTrainer) on unpaired examples labelled desirable or not (data.format unpaired) "
        "or on pairs (each pair gives one of each); orpo (odds-ratio preference optimization: SFT and preference "
        "in one loss, no reference model), simpo (length-normalised reward margin, no reference model; TRL's "
        "CPOTrainer) and cpo (Contrastive Preference Optimization: a preference loss plus cpoAlpha x the chosen "
        "answers' NLL, no reference model; CPOTrainer) on pairs. reward: a reward model (RewardTrainer: the base "
        "model with a one-output sequence-classification head, trained so that chosen scores above rejected) on "
        "pairs; its final model scores text instead of generating it. grpo: online RL (GRPOTrainer): completions "
        "sampled from the model for each prompt (data.format prompt, alpaca, sharegpt or messages), scored by "
        "method.grpo.rewards.")
    preference: PreferenceSpec = Field(default_factory=PreferenceSpec, description="Settings of the preference "
                                       "objectives (dpo, kto, orpo, simpo, cpo, reward); each field names those it "
                                       "applies to.")
    grpo: GrpoSpec | None = Field(default=None, description="Settings of method.objective grpo: generation, "
                                  "rewards, loss.")
    lora: LoraSpec = Field(default_factory=LoraSpec, description="Adapter settings for lora and qlora.")
    freeze: FreezeSpec = Field(default_factory=FreezeSpec, description="Settings for the freeze method.")
    neftune_noise_alpha: float | None = Field(
        default=None, gt=0, le=100, description="NEFTune embedding noise (5 is a common value); unset disables it."
    )
