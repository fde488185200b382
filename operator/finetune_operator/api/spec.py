"""FineTuneJobSpec: the whole spec, and the rules that span several sections."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from .base import ApiModel
from .constants import CACHE_MOUNT_PATH
from .data import DataSpec
from .distributed import DistributedSpec
from .elastic import elastic_rules
from .errors import FieldError, SpecRuleErrors
from .evaluation import EvaluationSpec
from .grpo_rules import grpo_rules
from .method import MethodSpec
from .model import ModelSpec
from .output import CheckpointSpec, OutputSpec
from .preference_rules import preference_rules
from .resources import PodSpec, ResourcesSpec
from .run_policy import RunPolicy
from .runtime_ref import RuntimeRef
from .storage import S3Spec, is_s3, valid_s3_uri
from .tracking import TrackingSpec
from .training import TrainingSpec

FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3")


def _immutable(section: str) -> dict[str, Any]:
    """A CEL transition rule: the apiserver itself refuses the update (checkpoints depend on this section)."""
    return {"x-kubernetes-validations": [{
        "rule": "self == oldSelf",
        "message": f"spec.{section} is immutable: checkpoints of a running job depend on it; create a new "
                   "FineTuneJob (training, distributed, resources and pod changes apply from the next attempt; "
                   "runPolicy applies at once)"}]}


class FineTuneJobSpec(ApiModel):
    model: ModelSpec = Field(description="The base model to fine-tune. Immutable.",
                             json_schema_extra=_immutable("model"))
    data: DataSpec = Field(description="Training (and validation) data and how it is tokenized.")
    # The CRD default {} makes the apiserver store the (defaulted) method even when it is omitted, so the
    # immutability rule has an old value to compare with.
    method: MethodSpec = Field(default_factory=MethodSpec, description="Full fine-tune, LoRA, QLoRA or freeze. "
                               "Immutable.", json_schema_extra={**_immutable("method"), "default": {}})
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Optimisation hyper-parameters.")
    distributed: DistributedSpec = Field(
        default_factory=DistributedSpec, description="Nodes, processes and the parallelism strategy."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per-pod resource requests.")
    pod: PodSpec = Field(default_factory=PodSpec, description="Image, scheduling and environment of trainer pods.")
    output: OutputSpec = Field(default_factory=OutputSpec, description="Where checkpoints and the model are written.")
    checkpoints: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing and resume.")
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec, description="What evaluation does beyond "
                                       "the validation loss and its perplexity: early stopping.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Experiment trackers (wandb, mlflow, "
                                   "...) besides TensorBoard.")
    suspend: bool = Field(
        default=False, description="Stop the running attempt: its pods get SIGTERM and save a checkpoint, their GPUs "
        "are freed (under Kueue the workload is deactivated and its quota released); false again resumes from the "
        "newest checkpoint (in a new attempt when the spec was edited meanwhile: the edit applies). "
        "`kubectl patch ftj NAME --type=merge -p '{\"spec\":{\"suspend\":true}}'`, as for batch "
        "Jobs, JobSet and TrainJob.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Restarts, deadlines, TTL and stalls.")
    runtime_ref: RuntimeRef | None = Field(
        default=None, description="The runtime (FineTuneRuntime in this namespace, or ClusterFineTuneRuntime) "
        "whose template gives this job its defaults and whose limits it must keep. Merge order: runtime template < "
        "this spec, field by field (maps merged, lists replaced); fields the runtime locks may not be set here. "
        "Unset: the namespace's default FineTuneRuntime over the cluster's default ClusterFineTuneRuntime (both "
        "optional; the limits of both apply). The runtime is read when the job starts and recorded in "
        "status.runtime: editing or deleting it later never changes this job. Immutable.",
        json_schema_extra=_immutable("runtimeRef"))
    s3: S3Spec = Field(default_factory=S3Spec, description="The S3-compatible object storage that s3:// URIs use "
                       "(data paths, model.name, method.lora.initFrom, output.uri): endpoint, region, credentials "
                       "by Secret reference.")

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step: micro-batch x accumulation x nodes x processes per node."""
        t, d = self.training, self.distributed
        return t.per_device_train_batch_size * t.gradient_accumulation_steps * d.world_size

    @property
    def total_gpus(self) -> int:
        return self.distributed.num_nodes * self.distributed.gpus_per_node

    @model_validator(mode="after")
    def _cross_section_rules(self) -> "FineTuneJobSpec":
        errors = run_rules({name: getattr(self, name) for name in SECTIONS})
        if errors:
            raise SpecRuleErrors(errors)
        return self


@dataclass(frozen=True)
class Rule:
    """A cross-section rule and the sections it reads, so it can still run when an unrelated section is invalid."""

    needs: tuple[str, ...]
    check: Callable[[Any], list[FieldError]]


def run_rules(sections: dict[str, Any]) -> list[FieldError]:
    """Runs every rule whose sections are all present (valid) in `sections`."""
    view = _Sections(sections)
    return [e for rule in RULES if all(n in sections for n in rule.needs) for e in rule.check(view)]


def valid_sections(raw: dict[str, Any]) -> dict[str, Any]:
    """Each section of a raw spec that validates on its own (defaults for omitted optional sections)."""
    out: dict[str, Any] = {}
    for name, info in FineTuneJobSpec.model_fields.items():
        alias = info.alias or name
        model: type[BaseModel] = info.annotation  # type: ignore[assignment]
        if not (isinstance(model, type) and issubclass(model, BaseModel)):  # a plain field (suspend), not a section
            continue
        if alias not in raw and info.is_required():
            continue
        try:
            out[name] = (model.model_validate(raw[alias], by_alias=True, by_name=False) if alias in raw
                         else info.get_default(call_default_factory=True))
        except ValidationError:
            continue
        if out[name] is None:
            del out[name]
    return out


class _Sections:
    def __init__(self, sections: dict[str, Any]):
        self.__dict__.update(sections)


def _method_rules(spec: Any) -> list[FieldError]:
    errors = []
    method, quant = spec.method.type, spec.model.quantization
    if method == "qlora" and quant != "4bit":
        errors.append(FieldError("method.type", method, "qlora trains adapters on a 4-bit base model",
                                 "set model.quantization: 4bit (or use method.type: lora)"))
    if spec.method.lora.init_from is not None and method not in ("lora", "qlora"):
        errors.append(FieldError("method.lora.initFrom", spec.method.lora.init_from,
                                 f"continues an adapter, but method {method} trains no adapter",
                                 "use method.type: lora (or qlora), or remove initFrom"))
    if method in ("full", "freeze") and quant != "none":
        errors.append(FieldError("model.quantization", quant, f"method {method} cannot train quantized weights",
                                 "use method.type: qlora/lora, or model.quantization: none"))
    return errors


def _quantized_sharding_rules(spec: Any) -> list[FieldError]:
    ds = spec.distributed.deepspeed
    if spec.model.quantization != "none" and ds is not None and ds.zero_stage == 3:
        return [FieldError("distributed.deepspeed.zeroStage", 3,
                           "ZeRO-3 cannot partition bitsandbytes-quantized weights",
                           "use zeroStage 2 with quantization, or strategy fsdp for QLoRA")]
    return []


def _output_rules(spec: Any) -> list[FieldError]:
    method = spec.method.type
    if spec.output.merge_adapter and method not in ("lora", "qlora"):
        return [FieldError("output.mergeAdapter", True, f"method {method} has no adapter to merge",
                           "remove mergeAdapter or use method lora/qlora")]
    return []


def _hardware_rules(spec: Any) -> list[FieldError]:
    errors = []
    d, m, t = spec.distributed, spec.model, spec.training
    if d.gpus_per_node == 0:
        if m.quantization != "none":
            errors.append(FieldError("model.quantization", m.quantization,
                                     "bitsandbytes quantization needs GPUs", "request distributed.gpusPerNode >= 1"))
        if t.precision == "fp16":
            errors.append(FieldError("training.precision", "fp16", "fp16 mixed precision needs a GPU",
                                     "use bf16 or fp32 on CPU"))
        if m.attn_implementation in FLASH_ATTENTION:
            errors.append(FieldError("model.attnImplementation", m.attn_implementation,
                                     "flash attention kernels need a GPU", "use sdpa or eager on CPU"))
        if t.tf32:
            errors.append(FieldError("training.tf32", True, "TF32 is a GPU feature", "remove tf32 for CPU jobs"))
    return errors


def _data_rules(spec: Any) -> list[FieldError]:
    errors = []
    data, t = spec.data, spec.training
    has_validation = data.validation is not None or data.validation_split_percentage > 0
    if t.eval_strategy != "no" and not has_validation:
        errors.append(FieldError("training.evalStrategy", t.eval_strategy, "evaluation needs validation data",
                                 "add data.validation or data.validationSplitPercentage, or set evalStrategy: no"))
    if data.streaming and t.max_steps is None:
        errors.append(FieldError("training.maxSteps", None, "a streamed dataset has no length, so epochs are unknown",
                                 "set training.maxSteps"))
    if data.max_eval_samples is not None and not has_validation:
        errors.append(FieldError("data.maxEvalSamples", data.max_eval_samples, "there is no validation data to cap",
                                 "remove maxEvalSamples or add validation data"))
    return errors


def _objective_rules(spec: Any) -> list[FieldError]:
    """A preference objective trains on its kind of data, and that data only trains a preference objective; a
    preference setting the objective would ignore is an error, not silently dropped."""
    objective, data = spec.method.objective, spec.data
    if objective == "grpo":  # its data and settings: grpo_rules
        return _preference_settings(spec.method)
    if objective == "sft":
        if data.format in ("preference", "unpaired"):
            fix = "set method.objective: dpo, orpo, simpo, cpo, kto or reward" if data.format == "preference" else \
                "set method.objective: kto"
            return [FieldError("method.objective", objective, f"data.format {data.format} holds preference data, "
                               "which supervised fine-tuning cannot train on", fix)]
        return []
    errors = []
    formats = ("preference", "unpaired") if objective == "kto" else ("preference",)
    if data.format not in formats:
        fix = ("set data.format: preference (prompt, chosen, rejected columns)" if objective != "kto" else
               "set data.format: unpaired (prompt, completion, label) or preference (pairs)")
        why = ("trains on preference pairs" if data.format != "unpaired" else
               "trains on pairs; only kto trains on unpaired examples")
        errors.append(FieldError("data.format", data.format, f"method.objective {objective} {why}", fix))
    for field, value, why in (("data.packing", data.packing, "an example is scored whole, never packed with others"),
                              ("data.streaming", data.streaming, "examples are checked and tokenized before "
                               "training")):
        if value:
            errors.append(FieldError(field, value, f"not with method.objective {objective}: {why}",
                                     f"remove {field.split('.')[1]}"))
    return errors + _preference_settings(spec.method)


def _reward_model_rules(spec: Any) -> list[FieldError]:
    if spec.method.objective != "reward" or not spec.evaluation.prompts:
        return []
    return [FieldError("evaluation.prompts", f"{len(spec.evaluation.prompts)} prompt(s)", "method.objective "
                       "reward trains a model that scores text; it generates no samples", "remove evaluation.prompts")]


def _preference_settings(method: Any) -> list[FieldError]:
    from .method import CPO_LOSSES, DPO_LOSSES, KTO_LOSSES, REFERENCE_FREE

    pref, objective = method.preference, method.objective
    where = "method.preference"
    errors = []
    losses = {"dpo": DPO_LOSSES, "kto": KTO_LOSSES, "cpo": CPO_LOSSES}.get(objective, ())
    if pref.loss_type is not None and pref.loss_type not in losses:
        fix = (f"use one of {', '.join(losses)}" if losses else "remove lossType")
        errors.append(FieldError(f"{where}.lossType", pref.loss_type,
                                 f"not a loss of method.objective {objective}", fix))
    unused = [("beta", pref.beta, 0.1, ("dpo", "kto", "orpo", "simpo", "cpo")),
              ("labelSmoothing", pref.label_smoothing, 0.0, ("dpo", "simpo", "cpo")),
              ("precomputeRefLogProbs", pref.precompute_ref_log_probs, False, ("dpo", "kto")),
              ("desirableWeight", pref.desirable_weight, 1.0, ("kto",)),
              ("undesirableWeight", pref.undesirable_weight, 1.0, ("kto",)),
              ("simpoGamma", pref.simpo_gamma, 0.5, ("simpo",)),
              ("cpoAlpha", pref.cpo_alpha, 1.0, ("cpo",)),
              ("centerRewardsCoefficient", pref.center_rewards_coefficient, None, ("reward",))]
    for name, value, default, applies in unused:
        if value != default and objective not in applies:
            why = ("it has no reference model" if objective in REFERENCE_FREE and name == "precomputeRefLogProbs"
                   else f"only {_listed(applies)} use{'s' if len(applies) == 1 else ''} it")
            errors.append(FieldError(f"{where}.{name}", value, f"not with method.objective {objective}: {why}",
                                     f"remove {name}"))
    return errors


def _listed(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _early_stopping_rules(spec: Any) -> list[FieldError]:
    """load_best_model_at_end needs a checkpoint at every evaluation (transformers refuses it otherwise)."""
    if spec.evaluation.early_stopping is None:
        return []
    t, ck = spec.training, spec.checkpoints
    where = "evaluation.earlyStopping"
    if t.eval_strategy == "no":
        return [FieldError("training.evalStrategy", "no", f"{where} watches the validation loss",
                           "set training.evalStrategy: steps (with evalSteps) or epoch, and validation data")]
    if ck.save_strategy != t.eval_strategy:
        return [FieldError("checkpoints.saveStrategy", ck.save_strategy, f"{where} keeps the best checkpoint, so "
                           f"one is needed at every evaluation (evalStrategy {t.eval_strategy})",
                           f"set checkpoints.saveStrategy: {t.eval_strategy}")]
    eval_steps = t.eval_steps or t.logging_steps
    if t.eval_strategy == "steps" and ck.save_steps % eval_steps:
        return [FieldError("checkpoints.saveSteps", ck.save_steps, f"{where} needs a checkpoint at evaluations "
                           f"(every {eval_steps} steps)", f"use a multiple of training.evalSteps, e.g. {eval_steps}")]
    return []


def _cache_rules(spec: Any) -> list[FieldError]:
    """The root filesystem is read-only: a cache outside the output volume must be on a writable volume."""
    cache = spec.data.cache_dir
    if cache is None:
        return []
    writable = [spec.output.mount_path, CACHE_MOUNT_PATH,
                *(v.mount_path for v in spec.pod.volumes if not v.read_only)]
    if any(cache == m or cache.startswith(m.rstrip("/") + "/") for m in writable):
        return []
    read_only = [v.mount_path for v in spec.pod.volumes if v.read_only]
    why = ("is on a read-only volume" if any(cache == m or cache.startswith(m.rstrip("/") + "/") for m in read_only)
           else "is on no volume, and the pods' root filesystem is read-only")
    return [FieldError("data.cacheDir", cache, why, "mount a writable volume there with pod.volumes (e.g. a shared "
                       "cache claim at /hf-cache and cacheDir: /hf-cache), or remove cacheDir to cache in each pod")]


def _credential_rules(spec: Any) -> list[FieldError]:
    """Credentials the push and the trackers need come from Secrets; a missing one would fail after training."""
    errors = []
    secret_env = {s.name for s in spec.pod.secret_env}
    push = spec.output.push
    if push is not None and push.token_secret is None and "HF_TOKEN" not in secret_env:
        errors.append(FieldError("output.push.tokenSecret", None, "pushing needs a Hub token with write access",
                                 "set output.push.tokenSecret.name (a Secret with key token), or HF_TOKEN in "
                                 "pod.secretEnv"))
    if push is not None and push.token_secret is not None and "HF_TOKEN" in secret_env:
        errors.append(FieldError("output.push.tokenSecret", push.token_secret.name, "HF_TOKEN is also given in "
                                 "pod.secretEnv; the trainer would get one of the two",
                                 "give the token once: remove one of them"))
    tracking, plain_env = spec.tracking, {e.name for e in spec.pod.env}
    wandb_offline = tracking.wandb is not None and tracking.wandb.offline
    if "wandb" in tracking.report_to and not wandb_offline and "WANDB_API_KEY" not in secret_env:
        errors.append(FieldError("tracking.reportTo", tracking.report_to, "wandb needs an API key to log in, and "
                                 "would fail the run at its first step without one",
                                 "add WANDB_API_KEY to pod.secretEnv, or set tracking.wandb.offline: true"))
    if "mlflow" in tracking.report_to and tracking.mlflow is None and "MLFLOW_TRACKING_URI" not in plain_env:
        errors.append(FieldError("tracking.mlflow.trackingUri", None, "mlflow needs its tracking server (MLflow's "
                                 "own default, a directory in the container, is lost with the pod)",
                                 "set tracking.mlflow.trackingUri, e.g. http://mlflow.mlflow:5000 or "
                                 "file:///output/mlruns"))
    for name in ("mlflow", "wandb"):
        if getattr(tracking, name) is not None and name not in tracking.report_to:
            errors.append(FieldError(f"tracking.{name}", "set", f"{name} is not in tracking.reportTo, so these "
                                     "settings would do nothing", f"add {name} to tracking.reportTo, or remove them"))
    return errors


def _s3_rules(spec: Any) -> list[FieldError]:
    """s3:// URIs name a bucket S3 accepts (another scheme is refused by api/sources.py); AWS credentials come from
    one Secret (pod.env refuses them already)."""
    errors = []
    uris = [("model.name", spec.model.name), ("model.tokenizer", spec.model.tokenizer),
            ("method.lora.initFrom", spec.method.lora.init_from)]
    uris += [(f"data.{kind}[{i}].path", source.path) for kind, sources in (("train", spec.data.train),
             ("validation", spec.data.validation or [])) for i, source in enumerate(sources)]
    for path, value in uris:
        if is_s3(value) and not valid_s3_uri(value):
            errors.append(FieldError(path, value, "not an s3:// URI of a bucket S3 accepts (3-63 lowercase "
                                     "letters, digits, dots and hyphens)", "write s3://bucket/prefix/..."))
    for i, env in enumerate(spec.pod.secret_env):
        if env.name in AWS_SECRET_NAMES and spec.s3.credentials_secret is not None:
            errors.append(FieldError(f"pod.secretEnv[{i}].name", env.name, "s3.credentialsSecret also sets it; "
                                     "the trainer would get one of the two", "give the credentials once: remove "
                                     "one of them"))
    return errors


AWS_SECRET_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
SECTIONS = ("model", "data", "method", "training", "distributed", "resources", "pod", "output", "checkpoints",
            "evaluation", "tracking", "run_policy", "s3")
RULES = (
    Rule(("method", "model"), _method_rules),
    Rule(("model", "distributed"), _quantized_sharding_rules),
    Rule(("method", "output"), _output_rules),
    Rule(("distributed", "model", "training"), _hardware_rules),
    Rule(("data", "training"), _data_rules),
    Rule(("method", "data", "training"), _objective_rules),
    Rule(("method", "data", "training"), grpo_rules),
    Rule(("method", "evaluation"), _reward_model_rules),
    Rule(("method", "data", "training"), preference_rules),
    Rule(("evaluation", "training", "checkpoints"), _early_stopping_rules),
    Rule(("output", "pod", "tracking"), _credential_rules),
    Rule(("data", "pod", "output"), _cache_rules),
    Rule(("model", "method", "data", "pod", "s3"), _s3_rules),
    Rule(("distributed", "training", "checkpoints", "output", "run_policy"), elastic_rules),
)
