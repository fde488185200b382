"""A Kubernetes label selector (metav1.LabelSelector) and what it matches: which namespaces may use a
ClusterFineTuneRuntime (spec.namespaceSelector, as Kueue's ClusterQueue). The same rule runs in the operator and, as
CEL, in the API server's admission (render/runtime_policy.py)."""

from typing import Literal

from pydantic import Field, model_validator

from .base import ApiModel
from .k8s_names import Labels, LabelValue, QualifiedName


class LabelSelectorRequirement(ApiModel):
    key: QualifiedName = Field(max_length=316, description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn (values needed), Exists, DoesNotExist (no values).")
    values: list[LabelValue] = Field(default_factory=list, max_length=64, description="The label values (In, NotIn).")

    @model_validator(mode="after")
    def _values_as_kubernetes_requires(self) -> "LabelSelectorRequirement":
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values; remove them")
        return self


class LabelSelector(ApiModel):
    """Every matchLabels pair and every matchExpressions requirement must hold; an empty selector matches all."""

    match_labels: Labels = Field(default_factory=dict, description="Labels the namespace must have, as key: value.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=16, description="Requirements on the namespace's labels.")


def matches(selector: LabelSelector, labels: dict[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector's meaning: NotIn and DoesNotExist hold for a label that is absent."""
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for req in selector.match_expressions:
        present = req.key in labels
        holds = {"In": present and labels[req.key] in req.values,
                 "NotIn": not (present and labels[req.key] in req.values),
                 "Exists": present, "DoesNotExist": not present}[req.operator]
        if not holds:
            return False
    return True


def describe(selector: LabelSelector) -> str:
    """The selector as `kubectl get -l` writes one: team=a,tier in (gold,silver),!legacy."""
    parts = [f"{k}={v}" for k, v in selector.match_labels.items()]
    for req in selector.match_expressions:
        values = ",".join(req.values)
        parts.append({"In": f"{req.key} in ({values})", "NotIn": f"{req.key} notin ({values})",
                      "Exists": req.key, "DoesNotExist": f"!{req.key}"}[req.operator])
    return ",".join(parts) or "(everything)"
