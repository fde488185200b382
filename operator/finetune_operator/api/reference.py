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
    lines = ["# FineTuneJob spec reference", "",
             "Generated from the API models by `./hack/generate.sh`; the same descriptions appear in "
             "`kubectl explain finetunejob.spec`. Cross-field rules are checked by `finetune validate` and the "
             "operator.",
             "", "| field | type | default | description |", "|---|---|---|---|"]
    return "\n".join(lines + _rows(FineTuneJobSpec, "spec")) + "\n"
