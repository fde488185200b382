"""The Helm chart's values, as a model: values.schema.json is generated from it (like the CRD from the API)."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .api.constants import DEFAULT_TRAINER_IMAGE


class _Values(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Image(_Values):
    repository: str = Field(default="ghcr.io/finetunejob/operator", min_length=1, description="Operator image.")
    tag: str = Field(default="0.1.0", min_length=1, description="Image tag.")
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(default="IfNotPresent", description="Pull policy.")


class Resources(_Values):
    requests: dict[str, str] = Field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"},
                                     description="Operator container requests.")
    limits: dict[str, str] = Field(default_factory=lambda: {"memory": "512Mi"}, description="Operator limits.")


class ChartValues(_Values):
    image: Image = Field(default_factory=Image, description="The operator image.")
    imagePullSecrets: list[str] = Field(default_factory=list, description="Pull Secret names for the operator.")
    trainerImage: str = Field(default=DEFAULT_TRAINER_IMAGE, min_length=1,
                              description="Default trainer image for FineTuneJobs that do not set spec.pod.image.")
    watchNamespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces the operator manages, with a Role in each; empty = all namespaces (ClusterRole).")
    restartBackoffSeconds: float = Field(default=10, ge=0.1, le=3600,
                                         description="First gang-restart backoff; doubles per restart (max 300 s).")
    metrics: dict[str, Any] = Field(default_factory=lambda: {"enabled": True, "port": 8080},
                                    description="Prometheus /metrics endpoint and its Service.")
    resources: Resources = Field(default_factory=Resources, description="Operator container resources.")
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Operator pod node selector.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Operator pod tolerations.")
    priorityClassName: str = Field(default="", description="Operator pod priority class.")


def values_schema() -> dict[str, Any]:
    from .api.crd import structural_schema

    schema = structural_schema(ChartValues.model_json_schema(mode="validation"))
    schema["$schema"] = "https://json-schema.org/draft-07/schema#"
    return schema


def values_yaml() -> str:
    """values.yaml with each key's description as a comment (generated: edit the model, not the file)."""
    import yaml

    lines = ["# Generated from finetune_operator/chart_values.py by ./hack/generate.sh; do not edit by hand.", ""]
    defaults = ChartValues().model_dump(mode="json")
    for name, info in ChartValues.model_fields.items():
        lines.append(f"# {info.description}")
        lines.append(yaml.safe_dump({name: defaults[name]}, sort_keys=False, width=120).rstrip())
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import json
    import sys
    from pathlib import Path

    chart = Path(sys.argv[1])
    (chart / "values.schema.json").write_text(json.dumps(values_schema(), indent=2) + "\n")
    (chart / "values.yaml").write_text(values_yaml())
