"""Which fields change what a job runs and which name Secrets (api/job_rights.py), and the admission policies made
from them (render/job_rights_policy.py): nothing in the spec is forgotten, and the policies stay within what the API
server lets a policy spend on authorization checks. The policies' behaviour on the real API server:
tests/cluster/test_admission_matrix.py."""

import json
import re

import pytest

from finetune_operator.api.job_rights import (
    CONFIGMAP_REFERENCES,
    HARMLESS,
    SECRET_REFERENCES,
    changed_fields,
    configmap_names,
    mounts_nfs,
    secret_names,
    watched_fields,
)
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.render import job_rights_policy
from tests.builders import make_job
from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def _schema_paths(node: dict, defs: dict, at: str = "spec") -> list[tuple[str, dict]]:
    """Every (path, schema) of the spec's JSON schema, $refs followed, list items as their list."""
    if "$ref" in node:
        node = {**defs[node["$ref"].split("/")[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    for option in node.get("anyOf", []):
        if option.get("type") != "null":
            node = {**node, **(defs[option["$ref"].split("/")[-1]] if "$ref" in option else option)}
    out = [(at, node)]
    for name, child in (node.get("properties") or {}).items():
        out += _schema_paths(child, defs, f"{at}.{name}")
    if "items" in node:
        out += _schema_paths(node["items"], defs, at)
    return out


def test_every_field_that_names_a_secret_is_checked():
    """A field whose name or description says Secret is a Secret reference; each must be one the policy reads."""
    schema = FineTuneJobSpec.model_json_schema(by_alias=True, mode="validation")
    naming = {path for path, node in _schema_paths(schema, schema["$defs"])
              if re.search(r"secret", path.rsplit(".", 1)[-1], re.I)
              or re.search(r"\bA Secret\b|\bSecret in the job's namespace\b|Pull Secret", node.get("description", ""))}
    covered = {p for p in naming if any(p == ref or p.startswith(ref + ".") for ref in SECRET_REFERENCES)}
    assert naming - covered == set(), f"Secret references the admission policy does not check: {naming - covered}"
    assert {ref for ref in SECRET_REFERENCES if not any(p.startswith(ref) for p in naming)} == set()


def test_every_field_that_names_a_configmap_is_checked():
    schema = FineTuneJobSpec.model_json_schema(by_alias=True, mode="validation")
    naming = {path for path, node in _schema_paths(schema, schema["$defs"])
              if re.search(r"config_?map", path.rsplit(".", 1)[-1], re.I)
              or re.search(r"\bConfigMap", node.get("description", ""))}
    assert naming == {f"{ref}.configMap" for ref in CONFIGMAP_REFERENCES}, naming
    job = make_job({"spec.pod": {"volumes": [{"name": "a", "mountPath": "/a", "configMap": "settings"},
                                             {"name": "b", "mountPath": "/b", "nfs": {"server": "s", "path": "/x"}}]}})
    assert configmap_names(job) == {"spec.pod.volumes": ["settings"], "spec.method.grpo.rewards": []}
    assert mounts_nfs(job)
    assert not mounts_nfs(make_job())


def test_every_spec_field_but_suspend_and_run_policy_changes_what_runs():
    fields = {info.alias or name for name, info in FineTuneJobSpec.model_fields.items()}
    watched = {path.split(".")[0] for path in watched_fields()}
    assert watched == fields - set(HARMLESS) and set(HARMLESS) <= fields
    assert "pod.image" in watched_fields() and "pod.annotations" in watched_fields()


def test_changes_and_secret_names_are_read_from_the_job_as_written():
    job = make_job({"spec.pod": {"image": "a:1", "secretEnv": [{"name": "A", "secretName": "one", "key": "k"},
                                                               {"name": "B", "secretName": "one", "key": "l"}],
                                 "volumes": [{"name": "v", "mountPath": "/v", "secret": "two"}],
                                 "imagePullSecrets": ["pull"]},
                    "spec.s3": {"credentialsSecret": "s3"},
                    "spec.output": {"push": {"repo": "o/m", "tokenSecret": {"name": "hub"}}}})
    assert secret_names(job) == {"spec.pod.secretEnv": ["one", "one"], "spec.pod.volumes": ["two"],
                                 "spec.pod.imagePullSecrets": ["pull"], "spec.output.push.tokenSecret": ["hub"],
                                 "spec.s3.credentialsSecret": ["s3"]}
    edited = json.loads(json.dumps(job))
    edited["spec"]["suspend"] = True
    edited["spec"]["runPolicy"] = {"backoffLimit": 1}
    assert changed_fields(job, edited) == []
    edited["spec"]["pod"]["image"] = "b:1"
    del edited["spec"]["s3"]
    assert changed_fields(job, edited) == ["spec.pod.image", "spec.s3"]
    assert changed_fields(None, job) == ["spec"]


def _expressions(docs: list[dict]) -> list[str]:
    spec = docs[0]["spec"]
    return [v["expression"] for v in spec.get("variables", [])] + [v["expression"] for v in spec["validations"]]


def test_the_policies_stay_within_what_the_api_server_lets_them_spend_on_authorization_checks():
    """An authorization check costs 350,000 of the 1,000,000 an expression may spend and of the 10,000,000 a policy
    may spend on one request (measured on the real API server: 27 checks pass, 29 run out)."""
    for docs in (job_rights_policy.identity_policy(), job_rights_policy.secrets_policy(),
                 job_rights_policy.configmaps_policy()):
        expressions = _expressions(docs)
        assert max(e.count(".check(") for e in expressions) <= 2
        assert sum(e.count(".check(") for e in expressions) <= 27
        # A messageExpression cannot ask the authorizer (it fails, and the message is lost).
        messages = [v.get("messageExpression", "") for v in docs[0]["spec"]["validations"]]
        assert not any(".check(" in m or re.search(r"variables\.may(GetAll|CreatePods|\d)", m) for m in messages)


def test_the_chart_holds_the_generated_policies():
    path = ROOT / "charts" / "finetunejob" / "templates" / "admission-policy-identity.yaml"
    assert path.read_text() == job_rights_policy.chart_template(), "run ./hack/generate.sh"
