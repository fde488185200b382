"""validate_job: a FineTuneJob object (dict) -> ValidatedJob, or InvalidSpec listing every error at once.

Turns pydantic's errors into FieldErrors with the YAML path, the value, the rule and a fix; adds the checks that
need more than the spec (metadata.name limits, TrainingArguments names from the installed transformers).
"""

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from .constants import API_VERSION, KIND, MAX_JOB_NAME_LENGTH
from .errors import FieldError, InvalidSpec, SpecRuleErrors
from .k8s_names import Labels
from .spec import FineTuneJobSpec, run_rules, valid_sections
from .training import MANAGED_TRAINING_ARGUMENTS, RETIRED_TRAINING_ARGUMENTS
from .transformers_names import TRAINING_ARGUMENT_NAMES, TRANSFORMERS_VERSION

# The job name becomes a Service name (DNS-1035 label) and the prefix of pod hostnames.
JOB_NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class ValidatedJob:
    """A FineTuneJob that passed every check, with advice that does not block it."""

    name: str
    namespace: str
    spec: FineTuneJobSpec
    labels: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def validate_job(obj: dict[str, Any], default_namespace: str = "default") -> ValidatedJob:
    """Validates a whole FineTuneJob manifest; raises InvalidSpec with every error found."""
    errors: list[FieldError] = []
    if not isinstance(obj, dict):
        raise InvalidSpec([FieldError("", type(obj).__name__, "a FineTuneJob must be a mapping", "check the YAML")])
    errors += _check_type_meta(obj)
    errors += [FieldError(str(key), obj[key], "unknown field", f"valid fields here: {', '.join(TOP_LEVEL_KEYS)}")
               for key in obj if key not in TOP_LEVEL_KEYS]
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, dict):
        errors.append(FieldError("metadata", metadata, "must be a mapping", "write it as key: value pairs"))
        metadata = {}
    name = metadata.get("name", "")
    errors += _check_name(name)
    errors += _check_labels(metadata.get("labels"))
    raw_spec = obj.get("spec")
    spec, spec_errors = parse_spec(raw_spec)
    errors += spec_errors
    errors += _check_extra_args(raw_spec)
    reported = {e.path for e in errors}
    errors += [e for e in _unstorable_numbers(raw_spec, "spec") if e.path not in reported]
    if errors or spec is None:
        raise InvalidSpec(errors)
    return ValidatedJob(
        name=name,
        namespace=metadata.get("namespace") or default_namespace,
        spec=spec,
        labels=dict(metadata.get("labels") or {}),
        warnings=advice(spec),
    )


def parse_spec(raw: Any) -> tuple[FineTuneJobSpec | None, list[FieldError]]:
    """Parses `spec`; returns the model or the list of FieldErrors (paths start with `spec`)."""
    if raw is None:
        return None, [FieldError("spec", None, "spec is required", "add spec.model and spec.data")]
    try:
        # Manifest names only (camelCase, as the CRD's schema): a snake_case name the apiserver would refuse is not
        # accepted here either; code may still build the models by name.
        return FineTuneJobSpec.model_validate(raw, by_alias=True, by_name=False), []
    except ValidationError as exc:
        errors = pydantic_errors(exc, "spec", FineTuneJobSpec)
    if isinstance(raw, dict):
        # The cross-section rules did not run (pydantic stops at the first invalid section); run the ones whose
        # sections are valid, so the user sees every error in one pass.
        known = {(e.path, e.message) for e in errors}
        for e in run_rules(valid_sections(raw)):
            e = FieldError(f"spec.{e.path}", e.value, e.message, e.fix)
            if (e.path, e.message) not in known:
                errors.append(e)
    return None, errors


def pydantic_errors(exc: ValidationError, prefix: str, root: type[BaseModel]) -> list[FieldError]:
    """Flattens a ValidationError into FieldErrors, expanding the cross-field rule errors it carries."""
    out: list[FieldError] = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        path = _join(prefix, loc)
        rule_error = (err.get("ctx") or {}).get("error")
        if isinstance(rule_error, SpecRuleErrors):
            out += [FieldError(_join(path, (e.path,)) if e.path else path, e.value, e.message, e.fix)
                    for e in rule_error.errors]
            continue
        out.append(_from_pydantic(dict(err), path, root, loc))
    return out


def _from_pydantic(err: dict[str, Any], path: str, root: type[BaseModel], loc: tuple[Any, ...]) -> FieldError:
    kind, ctx = err["type"], err.get("ctx") or {}
    value = None if kind == "missing" else err.get("input")
    message = str(err["msg"]).removeprefix("Value error, ")
    fix = ""
    if kind == "missing":
        message, fix = "required field is missing", f"add {loc[-1]}"
    elif kind == "extra_forbidden":
        valid = _field_names_at(root, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        message = "unknown field"
        camel = to_camel(str(loc[-1]))
        fix = (f"write it as {camel} (the manifest's names are camelCase)" if camel in valid and camel != loc[-1]
               else _training_argument_fix(root, loc) or MOVED_FIELDS.get(tuple(str(p) for p in loc)) or (
                   (f"did you mean {close[0]}? " if close else "") + f"valid fields here: {', '.join(valid)}"))
    elif kind == "literal_error":
        fix = f"use one of {ctx.get('expected')}"
    elif kind in _RANGE_OPERATORS:
        op, key = _RANGE_OPERATORS[kind]
        fix = f"use a value {op} {ctx.get(key)}"
    elif kind == "string_pattern_mismatch":
        message = "has an invalid format"
        fix = f"match the pattern {ctx.get('pattern')}"
    elif kind in ("int_parsing", "int_type", "int_from_float"):
        fix = "write a whole number without quotes"
    elif kind in ("float_parsing", "float_type"):
        fix = "write a number without quotes"
    elif kind in ("bool_parsing", "bool_type"):
        fix = "write true or false"
    elif kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        fix = "change the length to fit the limit"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        message, fix = "must be a mapping", "write it as key: value pairs"
        if isinstance(value, str) and "type" in _field_names_at(root, loc):  # `method: lora`
            fix = f"write it as {{type: {value}}}"
    elif kind == "list_type":
        message, fix = "must be a list", "write it as a YAML list (- item)"
        if isinstance(value, str | int | float):  # targetModules: all-linear
            fix = f"write it as a YAML list: [{value}]"
    elif kind == "value_error":
        # A validator may say its own fix after "; fix: ".
        message, _, fix = message.partition("; fix: ")
        fix = fix or "change it to the form described"
    elif kind == "finite_number":
        fix = FINITE_FIX
    elif kind in ("string_type", "string_unicode"):
        fix = "write a string (quote it if YAML reads it as something else)"
    else:
        fix = "see docs/spec-reference.md or `kubectl explain finetunejob." + path + "`"
    return FieldError(path, value, message, fix)


_RANGE_OPERATORS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


TOP_LEVEL_KEYS = ("apiVersion", "kind", "metadata", "spec", "status")
INT64_MAX = 2**63 - 1
MAX_NESTING = 64
FINITE_FIX = "write a finite number (NaN and infinity have no JSON spelling)"
_LABELS = TypeAdapter(Labels)


def _unstorable_numbers(value: Any, path: str) -> list[FieldError]:
    """Numbers Kubernetes cannot store, free-form fields included (extraArgs, inline rows): NaN and Infinity (no
    JSON spelling) and integers beyond int64 (the apiserver would read them as floats and refuse them); and nesting
    deeper than MAX_NESTING. Iterative: a hostile spec nested thousands deep is an error, not a RecursionError."""
    errors: list[FieldError] = []
    todo: list[tuple[Any, str, int]] = [(value, path, 0)]
    while todo:
        value, path, depth = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            errors.append(FieldError(path, value, "must be a finite number", FINITE_FIX))
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
            errors.append(FieldError(path, value, "is beyond the 64-bit integer range Kubernetes stores",
                                     f"use a value between -{INT64_MAX} and {INT64_MAX}"))
        elif isinstance(value, dict | list) and depth >= MAX_NESTING:
            errors.append(FieldError(path, "...", f"is nested more than {MAX_NESTING} levels deep",
                                     "flatten the value"))
        elif isinstance(value, dict):
            todo += [(v, f"{path}.{k}", depth + 1) for k, v in reversed(list(value.items()))]
        elif isinstance(value, list):
            todo += [(v, f"{path}[{i}]", depth + 1) for i, v in reversed(list(enumerate(value)))]
    return errors


def _check_labels(labels: Any) -> list[FieldError]:
    """The job's labels are copied to its children, so they must be valid there too."""
    if labels is None:
        return []
    try:
        _LABELS.validate_python(labels)
        return []
    except ValidationError as exc:
        return pydantic_errors(exc, "metadata.labels", BaseModel)


def _check_type_meta(obj: dict[str, Any]) -> list[FieldError]:
    errors = []
    if obj.get("apiVersion") not in (None, API_VERSION):
        errors.append(FieldError("apiVersion", obj.get("apiVersion"), "unsupported apiVersion", f"use {API_VERSION}"))
    if obj.get("kind") not in (None, KIND):
        errors.append(FieldError("kind", obj.get("kind"), f"this is not a {KIND}", f"use kind: {KIND}"))
    return errors


def _check_name(name: Any) -> list[FieldError]:
    if not name:
        return [FieldError("metadata.name", None, "a name is required", "add metadata.name, e.g. llama-sft")]
    if not isinstance(name, str) or not JOB_NAME_PATTERN.match(name):
        return [FieldError("metadata.name", name,
                           "must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter",
                           "rename it, e.g. llama-sft-1")]
    if len(name) > MAX_JOB_NAME_LENGTH:
        return [FieldError("metadata.name", name,
                           f"is {len(name)} characters; pod hostnames <name>-a<attempt>-<index> must fit in 63",
                           f"use at most {MAX_JOB_NAME_LENGTH} characters")]
    return []


def _check_extra_args(raw_spec: Any) -> list[FieldError]:
    """Checks extraArgs names on the raw spec, so they are reported even when other fields are invalid."""
    training = raw_spec.get("training") if isinstance(raw_spec, dict) else None
    extra = training.get("extraArgs") if isinstance(training, dict) else None
    if not isinstance(extra, dict):
        return []
    settable = sorted(TRAINING_ARGUMENT_NAMES - MANAGED_TRAINING_ARGUMENTS.keys())
    errors = []
    for key, value in extra.items():
        if key in TRAINING_ARGUMENT_NAMES:
            continue
        path = f"spec.training.extraArgs.{key}"
        if key in RETIRED_TRAINING_ARGUMENTS:
            errors.append(FieldError(path, value, f"not a TrainingArguments field in transformers "
                                     f"{TRANSFORMERS_VERSION}", RETIRED_TRAINING_ARGUMENTS[key]))
            continue
        close = difflib.get_close_matches(key, settable, n=3, cutoff=0.6)
        fix = f"did you mean {' or '.join(close)}?" if close else (
            "see the TrainingArguments reference of transformers for the valid names")
        errors.append(FieldError(path, value, "not a TrainingArguments field", fix))
    return errors


def advice(spec: FineTuneJobSpec, pods: bool = True) -> list[str]:
    """Non-blocking warnings: choices that are legal but that users usually regret. `pods=False` for a local run
    (finetune run), whose output directory is this machine's, not a pod's emptyDir."""
    notes = []
    if pods and spec.output.claim_name is None and spec.output.uri is None:
        notes.append("spec.output.claimName and spec.output.uri are unset: checkpoints live in an emptyDir and are "
                     "lost with the pods, so a gang restart starts over and the final model must be copied out "
                     "before the pods go; set output.uri (s3://bucket/prefix) or a claim")
    if spec.model.trust_remote_code:
        notes.append("spec.model.trustRemoteCode is true: code from the model repository runs in the trainer pods")
    if spec.checkpoints.save_strategy == "no" and spec.run_policy.backoff_limit > 0:
        notes.append("spec.checkpoints.saveStrategy is no: every gang restart starts from step 0")
    if spec.distributed.num_nodes > 1 and spec.distributed.gpus_per_node == 0:
        notes.append("a multi-node CPU job communicates over gloo; expect it to be slow beyond a smoke test")
    return notes


# Fields that moved: where they are now.
MOVED_FIELDS: dict[tuple[str, ...], str] = {
    ("runPolicy", "suspend"): "it moved to spec.suspend (as on batch Jobs, JobSet and TrainJob): write "
                              "spec.suspend: true",
}


def _training_argument_fix(root: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """Where a TrainingArguments name written as a spec.training field goes (numTrainEpochs, bf16,
    lr_scheduler_type: users bring them from the Trainer's own configs)."""
    if root is not FineTuneJobSpec or len(loc) != 2 or loc[0] != "training":
        return None
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(loc[1])).lower()
    if name in MANAGED_TRAINING_ARGUMENTS:
        return f"that is TrainingArguments' {name}; here it is {MANAGED_TRAINING_ARGUMENTS[name]}"
    if name in RETIRED_TRAINING_ARGUMENTS:
        return f"{name} was a TrainingArguments field: {RETIRED_TRAINING_ARGUMENTS[name]}"
    if name in TRAINING_ARGUMENT_NAMES:
        return f"TrainingArguments' {name} has no field of its own: set spec.training.extraArgs.{name}"
    return None


def _join(prefix: str, loc: tuple[Any, ...]) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]":  # pydantic's marker for "the key itself" of a mapping entry: the path already names it
            continue
        elif part:
            path = f"{path}.{part}" if path else str(part)
    return path


def _field_names_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Aliases of the model found by walking `loc` from `root`; empty when the walk leaves the models."""
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        if part not in fields:
            return []
        model = _model_of(fields[part].annotation)
        if model is None:
            return []
    return sorted((f.alias or n) for n, f in model.model_fields.items())


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
