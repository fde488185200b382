"""The chart's templates/admission-policy-runtimes.yaml: the policies on jobs (runtime_policy.py) and on the runtimes
themselves (runtime_object_policy.py, which builds on the former's pieces), assembled here so that neither module
imports the other back."""

from typing import Any

import yaml

from .runtime_object_policy import policies as runtime_object_policies
from .runtime_policy import POLICY_NAME, RELEASE, live_policy, snapshot_policy


def policies() -> list[dict[str, Any]]:
    """Every policy on jobs and its binding, as the chart installs them."""
    docs = [doc for kind in POLICY_NAME for doc in live_policy(kind)]
    return docs + snapshot_policy() + runtime_object_policies()


def chart_template() -> str:
    """templates/admission-policy-runtimes.yaml of the chart (on unless runtimes.limitsAtAdmission is false)."""
    body = "---\n".join(yaml.safe_dump(doc, sort_keys=False, width=120) for doc in policies())
    return ("# Generated from finetune_operator/render/runtime_admission.py by ./hack/generate.sh; do not edit by "
            "hand.\n"
            "{{- if .Values.runtimes.limitsAtAdmission }}\n" + body.replace(RELEASE, "{{ .Release.Name }}")
            + "{{- end }}\n")
