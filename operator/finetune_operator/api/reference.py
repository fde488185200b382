"""docs/spec-reference.md, generated from the models' field descriptions (the same text as `kubectl explain`)."""

import json
import types
import typing
from typing import Any

from pydantic import BaseModel

from .spec import FineTuneJobSpec


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a validated string (k8s_names) reads as its base type
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation) if a is not type(None))
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(annotation))}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation)).replace("Any", "any")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{info.alias or name}"
        default = "required" if info.is_required() else (
            "" if info.default_factory is not None or info.default is None else json.dumps(info.default))
        description = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{path}` | {_type_name(info.annotation)} | {default} | {description} |")
        child = _model_of(info.annotation)
        if child is not None:
            rows += _rows(child, path + ("[]" if typing.get_origin(info.annotation) is list or
                                         list in [typing.get_origin(a) for a in typing.get_args(info.annotation)]
                                         else ""))
    return rows


def spec_reference() -> str:
    lines = ["# FineTuneJob spec", "",
             "Generated from the API models by `./hack/generate.sh`; the same descriptions appear in "
             "`kubectl explain finetunejob.spec`. Cross-field rules are checked by `finetune validate` and the "
             "operator.",
             "", "| field | type | default | description |", "|---|---|---|---|"]
    return "\n".join(lines + _rows(FineTuneJobSpec, "spec")) + "\n"


def runtime_reference() -> str:
    from .runtime import ClusterFineTuneRuntimeSpec

    lines = ["# FineTuneRuntime and ClusterFineTuneRuntime spec", "",
             "Generated from the API models by `./hack/generate.sh`; the same descriptions appear in "
             "`kubectl explain clusterfinetuneruntime.spec`. The template's sections are the FineTuneJob's "
             "([spec](spec.md)) with every field optional. How they are used: [Runtimes](../concepts/runtimes.md). "
             "`spec.namespaceSelector` is the ClusterFineTuneRuntime's only.",
             "", "| field | type | default | description |", "|---|---|---|---|"]
    return "\n".join(lines + _rows(ClusterFineTuneRuntimeSpec, "spec")) + "\n"


def values_reference() -> str:
    from .chart_values import ChartValues

    lines = ["# Chart values", "",
             "Generated from the chart's values model (`finetune_operator/api/chart_values.py`, which also writes "
             "`values.yaml` and `values.schema.json`: Helm refuses a value the schema does not allow) by "
             "`./hack/generate.sh`.", "", "| value | type | default | description |", "|---|---|---|---|"]
    rows = _rows(ChartValues, "")
    return "\n".join(lines + [row.replace("| `.", "| `", 1) for row in rows]) + "\n"


def exit_codes_reference() -> str:
    from . import exit_codes

    lines = ["# Exit codes", "",
             "The trainer's exit code is the operator's decision: permanent codes fail the job at once, every "
             "other code gang-restarts it from the newest checkpoint (counted against `runPolicy.backoffLimit`). "
             "Generated from `finetune_operator/api/exit_codes.py`, which the trainer and the operator share.", "",
             "| code | reason | retried | meaning |", "|---|---|---|---|"]
    for code in sorted(exit_codes.DESCRIPTIONS):
        retried = "-" if code == exit_codes.SUCCESS else ("no" if exit_codes.is_permanent(code) else "yes")
        lines.append(f"| {code} | {exit_codes.reason(code)} | {retried} | {exit_codes.DESCRIPTIONS[code]} |")
    lines.append("| anything else | Error | yes | a crash, a collective timeout, a lost node |")
    lines += ["", "The launcher writes a JSON summary (final loss, steps, tokens, world size, what wrapped the model, "
              "data counts, where the model is) to the container's termination message, so `kubectl get pod -o "
              "yaml` tells what happened."]
    return "\n".join(lines) + "\n"


# docs/reference/<name> -> its generator (the CLI's page comes from the CLI itself: cli/reference.py)
PAGES = {"spec.md": spec_reference, "runtime.md": runtime_reference, "chart-values.md": values_reference,
         "exit-codes.md": exit_codes_reference}
