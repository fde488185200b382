"""An adversarial review of issue 41 on the real API server with the chart's policies: what a tenant, a FineTuneJob-only
user or a trainer token could do through a FineTuneJob, and where a platform admin's runtime limits did not hold.

Each hole was first written here as a strict xfail (the evidence, then the promise the docs make). The fixed ones are
regression tests now, asserting the refusal at `kubectl apply` as the tenant and the operator's own verdict (its check
with no policy installed): every model source (GRPO reward models too) under allowedModelSources and remote code only
where a runtime allows it; no location climbing out of a prefix; a credential a runtime lends sent nowhere the tenant
chooses; no orphaning delete, and an attempt's Job ending by its own deadline; NFS and ConfigMaps only within the
user's rights and the runtime's (restricted Pod Security and nfs: test_children_on_apiserver.py); a job created
suspended judged by the runtimes when it first really starts; the Kueue priority label under a locked priority class.
Holes 4 and 8 (issue 41 section 4, fixed on another branch) are regression tests here too: an unbound token of a job's
own ServiceAccount writes no status field (phase, or status.runtime, the record the limits are judged against), and a
trainer token reads no other job's spec through /status.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.runtime import ENDPOINT_FIELDS, TRACKER_FIELDS
from finetune_operator.api.runtime_layers import resolve_offline
from finetune_operator.api.validation import validate_job
from finetune_operator.controller.deadlines import JOB_DEADLINE_GRACE_SECONDS
from finetune_operator.controller.observed import parse_time
from finetune_operator.render.rbac import render_trainer_identity
from tests.builders import make_job
from tests.cluster.test_tenancy import FTJ, bind, can, chart_objects, delete_all, wait_can
from tests.support.admission_cases import apply_list, until
from tests.support.job_status import wait_status
from tests.support.tenant_api import TenantApi

pytestmark = pytest.mark.cluster
NS = "attack-review"
LABEL = {"finetunejob.dev/attack-review": "yes"}
OURS = {"matchLabels": LABEL}
PLATFORM_TOKEN = "hf_platform_read_token_do_not_leak"


def runtime(name: str, template: dict, limits: dict, default: bool = False, selector: dict | None = OURS) -> dict:
    spec: dict[str, Any] = {"default": default, "template": template, "limits": limits}
    if selector is not None:
        spec["namespaceSelector"] = selector
    return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "ClusterFineTuneRuntime", "metadata": {"name": name},
            "spec": spec}


# The platform lends its Hugging Face read token (gated models) and locks everything the docs say to lock in a
# runtime that lends Secrets: image, env, Secret env, volumes, identity, object storage, queue, priority.
LOCKED = runtime("attack-locked", {
    "pod": {"image": "registry.local/trainer:platform",
            "secretEnv": [{"name": "HF_TOKEN", "secretName": "platform-hf", "key": "token"}]},
    "distributed": {"gpusPerNode": 1}}, {
    "locked": ["pod.image", "pod.env", "pod.secretEnv", "pod.volumes", "pod.serviceAccountName", "s3", "queueName",
               "pod.priorityClassName"],
    "maxNodes": 2, "maxGpusPerJob": 2, "allowedModelSources": ["/models/"], "allowedDataSources": ["/data/"],
    "maxActiveDeadlineSeconds": 3600})
# Claims limited to the team's own, volumes otherwise open.
CLAIMS = runtime("attack-claims", {"distributed": {"gpusPerNode": 1}}, {"allowedClaims": ["team-data"]})
# Lends the platform's S3 credentials only, and locks nothing.
S3_LENT = runtime("attack-s3", {"s3": {"credentialsSecret": "platform-hf"}, "distributed": {"gpusPerNode": 1}}, {})
# For the cases with a running operator: 2 GPUs, a short deadline.
SMALL = runtime("attack-small", {"pod": {"image": "registry.local/trainer:small"}, "distributed": {"gpusPerNode": 1}},
                {"locked": ["pod.image"], "maxGpusPerJob": 2, "maxActiveDeadlineSeconds": 120})


def lean(name: str, ns: str = NS, **spec: Any) -> dict:
    doc = make_job({"metadata.name": name, "metadata.namespace": ns, "spec.runPolicy": {"activeDeadlineSeconds": 600}})
    for section in ("distributed", "resources", "pod"):
        doc["spec"].pop(section, None)
    doc["spec"].update(copy.deepcopy(spec))
    return doc


@pytest.fixture(scope="module")
def arena(control_plane, kubectl):
    """One labelled namespace with every policy of the chart, the chart's user roles, three users (eddie: edit,
    fiona: FineTuneJobs only and her own Secret, vera: view), Secrets, a ConfigMap, a ServiceAccount and the
    runtimes above."""
    kubectl.run("create", "namespace", NS)
    kubectl.run("label", "namespace", NS, *(f"{k}={v}" for k, v in LABEL.items()))
    docs = []
    for template in ("user-roles.yaml", "admission-policy-runtimes.yaml", "admission-policy-identity.yaml",
                     "admission-policy.yaml", "admission-policy-trainer-pods.yaml"):
        docs += chart_objects(control_plane, kubectl, template)
    try:
        apply_list(kubectl, *render_trainer_identity(NS, None))
        for secret, value in (("alice-token", "a"), ("fiona-token", "f"), ("platform-hf", PLATFORM_TOKEN)):
            kubectl.run("create", "secret", "generic", secret, f"--from-literal=token={value}", "-n", NS)
        kubectl.run("create", "configmap", "team-b-settings", "--from-literal=db=postgres://team-b:pw@db", "-n", NS)
        kubectl.run("create", "serviceaccount", "ci-bot", "-n", NS)
        bind(kubectl, NS, "eddie", "edit")
        bind(kubectl, NS, "vera", "view")
        kubectl.run("create", "role", "ftj-only", "--verb=create,get,list,update,patch,delete", f"--resource={FTJ}",
                    "-n", NS)
        kubectl.run("create", "rolebinding", "ftj-only", "--role=ftj-only", "--user=fiona", "-n", NS)
        kubectl.run("create", "role", "fiona-token", "--verb=get", "--resource=secrets", "--resource-name=fiona-token",
                    "-n", NS)
        kubectl.run("create", "rolebinding", "fiona-token", "--role=fiona-token", "--user=fiona", "-n", NS)
        apply_list(kubectl, LOCKED, CLAIMS, SMALL, S3_LENT)
        wait_can(kubectl, "eddie", NS, "create", FTJ)
        wait_can(kubectl, "fiona", NS, "create", FTJ)
        apis = {user: TenantApi(control_plane.kubeconfig, user=user) for user in ("eddie", "fiona", "vera")}
        # The runtimes are in force: a job past LOCKED's GPUs is refused.
        probe = lean("probe", runtimeRef={"name": "attack-locked"}, distributed={"numNodes": 2, "gpusPerNode": 2})
        until(lambda: "limits.maxGpusPerJob = 2" in apis["fiona"].create(probe).message,
               "the runtimes never reached the admission policies")
        yield apis
    finally:
        delete_all(kubectl, docs)
        for doc in (LOCKED, CLAIMS, SMALL):
            kubectl.run("delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False)
        kubectl.run("delete", "namespace", NS, "--wait=false")


def _operator_says(job: dict, *runtimes: dict, labels: dict | None = None) -> list[str]:
    """The operator's verdict on the job (its check when no policy is installed): every error, rendered."""
    resolved = resolve_offline(job, list(runtimes), lambda: {**(labels or LABEL), "kubernetes.io/metadata.name":
                                                             job["metadata"]["namespace"]})
    errors = [e.render() for e in resolved.errors]
    try:
        validate_job(resolved.obj)
    except InvalidSpec as exc:
        errors += [e.render() for e in exc.errors]
    return errors


def _refused(answer, *said: str) -> bool:
    return not answer.admitted and all(s in answer.message for s in said)


# --- 1. What runs, with the image locked ---------------------------------------------------------------------------
GRPO_EXAMPLE = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu-grpo.yaml").read_text())


def grpo_sections(reward_model: str) -> dict:
    """The GRPO example's sections, its rewards and a reward model at `reward_model` (rewards[3])."""
    sections = {k: copy.deepcopy(GRPO_EXAMPLE["spec"][k]) for k in ("model", "data", "method", "training")}
    sections["method"]["grpo"]["rewards"].append({"type": "model", "model": reward_model, "weight": 0.5})
    return sections


MODEL_SOURCES = {
    "tokenizer": ({"model": {"name": "/models/base", "tokenizer": "/output/evil-tokenizer"}}, "spec.model.tokenizer"),
    "hub tokenizer": ({"model": {"name": "/models/base", "tokenizer": "someone/evil"}}, "spec.model.tokenizer"),
    "adapter": ({"method": {"type": "lora", "lora": {"initFrom": "/output/evil-adapter"}}},
                "spec.method.lora.initFrom"),
    "checkpoint": ({"checkpoints": {"resume": "/data/checkpoint-9"}}, "spec.checkpoints.resume"),
    # Found after GRPO merged: a reward model's weights were loaded from anywhere.
    "reward model": (grpo_sections("someone/evil-reward-model"), "spec.method.grpo.rewards[3].model"),
}


@pytest.mark.parametrize("case", sorted(MODEL_SOURCES))
def test_every_model_source_is_held_to_allowed_model_sources(arena, case):
    """The hole: allowedModelSources read spec.model.name only, so a tokenizer elsewhere (with trustRemoteCode, its
    Python file ran in the platform's image with the platform's HF token) or an adapter passed."""
    spec, field = MODEL_SOURCES[case]
    job = lean("source", runtimeRef={"name": "attack-locked"}, **copy.deepcopy(spec))
    job["spec"].setdefault("model", {"name": "/models/base"})
    answer = arena["fiona"].create(job)
    assert _refused(answer, "limits.allowedModelSources", "ClusterFineTuneRuntime attack-locked"), answer.message
    assert [e for e in _operator_says(job, LOCKED) if e.startswith(f"{field}:")
            and "limits.allowedModelSources" in e], _operator_says(job, LOCKED)
    # The job's own output is where its checkpoints are: resuming from there needs no allowance.
    own = lean("own", runtimeRef={"name": "attack-locked"}, model={"name": "/models/base"},
               checkpoints={"resume": "/output/checkpoint-9"})
    assert arena["fiona"].create(own).admitted and _operator_says(own, LOCKED) == []
    allowed = lean("allowed", runtimeRef={"name": "attack-locked"}, **grpo_sections("/models/reward-model"))
    assert arena["fiona"].create(allowed).admitted and _operator_says(allowed, LOCKED) == []


def test_remote_code_needs_the_runtimes_yes(arena):
    job = lean("remote-code", runtimeRef={"name": "attack-locked"},
               model={"name": "/models/base", "trustRemoteCode": True})
    assert _refused(arena["fiona"].create(job), "spec.model.trustRemoteCode", "limits.allowTrustRemoteCode = false")
    assert any("limits.allowTrustRemoteCode" in e for e in _operator_says(job, LOCKED))
    # A job with no runtime decides for itself, as before.
    free = lean("free", "attack-free", model={"name": "/models/base", "trustRemoteCode": True})
    assert _operator_says(free, LOCKED, labels={}) == []


CLIMBS = {
    "model ..": ("model", {"name": "/models/../output/evil"}, "spec.model.name"),
    "data ..": ("data", {"format": "text", "train": [
        {"path": "/data/../var/run/secrets/kubernetes.io/serviceaccount/token", "fileType": "text"}]},
        "spec.data.train[0].path"),
    "data //": ("data", {"format": "text", "train": [{"path": "/data//x.txt"}]}, "spec.data.train[0].path"),
    "data %2e%2e": ("data", {"format": "text", "train": [{"path": "/data/%2e%2e/x.txt"}]}, "spec.data.train[0].path"),
    "s3 ..": ("data", {"format": "text", "train": [{"path": "s3://team-data/../other-team/x.txt"}]},
              "spec.data.train[0].path"),
    "trailing /..": ("model", {"name": "/models/x/.."}, "spec.model.name"),
    "reward model ..": (None, grpo_sections("/models/../output/evil-rm"), "spec.method.grpo.rewards[3].model"),
    "reward model %2e%2e": (None, grpo_sections("/models/%2e%2e/x"), "spec.method.grpo.rewards[3].model"),
}


@pytest.mark.parametrize("case", sorted(CLIMBS))
def test_no_location_climbs_out_of_an_allowed_prefix(arena, case):
    """The hole: /models/../output/evil started with /models/. The schema refuses such a location for every user at
    `kubectl apply` (naming the field), and the operator's check does too."""
    section, value, field = CLIMBS[case]
    job = lean("climb", runtimeRef={"name": "attack-locked"}, **({section: value} if section else value))
    answer = arena["fiona"].create(job)
    assert answer.status == 422 and field in answer.message, (answer.status, answer.message)
    assert any(e.startswith(f"{field}:") for e in _operator_says(job, LOCKED)), _operator_says(job, LOCKED)


# --- 2. A Secret the runtime lends goes only where the runtime says -------------------------------------------------
ENDPOINTS = {
    "pod.env": {"pod": {"env": [{"name": "HF_ENDPOINT", "value": "http://fiona.example"}]}},
    "s3.endpointURL": {"s3": {"endpointURL": "http://fiona.example:9000"}},
    "output.push.endpoint": {"output": {"push": {"repo": "fiona/anything", "endpoint": "http://fiona.example"}}},
    "tracking.wandb.baseUrl": {"tracking": {"reportTo": ["wandb"], "wandb": {"baseUrl": "http://fiona.example",
                                                                             "offline": True}}},
    "tracking.mlflow.trackingUri": {"tracking": {"reportTo": ["mlflow"], "mlflow": {
        "trackingUri": "http://fiona.example"}}},
    # The platform's own W&B server, but another team's runs (the key may belong to several teams).
    "tracking.wandb.entity": {"tracking": {"reportTo": ["wandb"], "wandb": {"entity": "team-b", "offline": True}}},
    "tracking.project": {"tracking": {"reportTo": ["wandb"], "project": "team-b-production",
                                      "wandb": {"offline": True}}},
}


@pytest.mark.parametrize("path", ENDPOINT_FIELDS + TRACKER_FIELDS)
def test_a_credential_the_runtime_lends_goes_to_no_endpoint_the_tenant_chooses(arena, kubectl, path):
    """The hole: the platform lent HF_TOKEN (pod.secretEnv, locked); fiona, who may not get that Secret, set
    output.push.endpoint to her own server and the trainer sent her the token. Every field that says where a
    credential goes is locked while the runtime lends one (LOCKED locks pod.env itself, so that one says so)."""
    assert not can(kubectl, "fiona", NS, "get", "secret", "platform-hf")
    job = lean("exfil", runtimeRef={"name": "attack-locked"}, **copy.deepcopy(ENDPOINTS[path]))
    answer = arena["fiona"].create(job)
    assert _refused(answer, f"spec.{path}", "is locked"), answer.message
    assert any(e.startswith(f"spec.{path}: ") and "is locked" in e for e in _operator_says(job, LOCKED))
    # CLAIMS lends nothing: the same field is the tenant's to set.
    mine = lean("mine", runtimeRef={"name": "attack-claims"}, **copy.deepcopy(ENDPOINTS[path]))
    if path == "output.push.endpoint":
        mine["spec"]["output"]["push"]["tokenSecret"] = {"name": "fiona-token"}
    assert arena["fiona"].create(mine).admitted and _operator_says(mine, CLAIMS) == []


@pytest.mark.parametrize("name,refused", [("AWS_ENDPOINT_URL", True), ("HF_ENDPOINT", True), ("HTTPS_PROXY", True),
                                           ("HF_TOKEN", False), ("WANDB_API_KEY", False)])
def test_a_secret_variable_of_the_tenants_own_is_no_setting_while_the_runtime_lends_credentials(arena, name, refused):
    """The hole: the runtime lent only its S3 credentials (pod.env locked by that); fiona's own pod.secretEnv, from
    a Secret she may read, set AWS_ENDPOINT_URL, and the lent keys went to her server. Her own Secret variables are
    credentials she brings, never settings, while the runtime lends anything."""
    job = lean("own-env", runtimeRef={"name": "attack-s3"},
               pod={"secretEnv": [{"name": name, "secretName": "fiona-token", "key": "token"}]})
    answer = arena["fiona"].create(job)
    says = _operator_says(job, S3_LENT)
    if refused:
        assert _refused(answer, "spec.pod.secretEnv names " + name, "lends the job credentials"), answer.message
        assert [e for e in says if e.startswith("spec.pod.secretEnv[0].name: ")], says
    else:
        assert answer.admitted and says == [], (answer.message, says)


# --- 3. Volumes a FineTuneJob-only user cannot reach directly --------------------------------------------------------
NFS = {"name": "theirs", "mountPath": "/theirs", "nfs": {"server": "storage.team-b.internal", "path": "/exports/b"}}
SETTINGS = {"name": "settings", "mountPath": "/settings", "configMap": "team-b-settings"}


def test_a_finetunejob_only_user_mounts_no_nfs_export_nor_a_configmap_she_may_not_get(arena, kubectl):
    """The hole: allowedClaims limited PersistentVolumeClaims only, and the Secret rule had no ConfigMap twin. An
    NFS export needs the right to create pods, and under allowedClaims it is not storage at all (the operator says
    so too); a ConfigMap needs `get` on it, which only admission can ask (as for Secrets)."""
    assert not can(kubectl, "fiona", NS, "create", "pods") and not can(kubectl, "fiona", NS, "get", "configmaps")
    free = lean("mount", pod={"volumes": [NFS]})  # no runtime: her rights alone
    assert _refused(arena["fiona"].create(free), "spec.pod.volumes: mounting an NFS export needs the right to "
                    "create pods in attack-review, which fiona has not")
    assert arena["eddie"].create(free).admitted  # eddie may create pods
    nfs = lean("mount", runtimeRef={"name": "attack-claims"}, pod={"volumes": [NFS]})
    assert not arena["fiona"].create(nfs).admitted
    assert _refused(arena["eddie"].create(nfs), "limits.allowedClaims", "no nfs volume")
    assert any("spec.pod.volumes[0]" in e and "no nfs volume" in e for e in _operator_says(nfs, CLAIMS))
    settings = lean("mount", runtimeRef={"name": "attack-claims"}, pod={"volumes": [SETTINGS]})
    assert _refused(arena["fiona"].create(settings), "spec.pod.volumes: ConfigMap team-b-settings",
                    "fiona may not get it")
    assert arena["eddie"].create(settings).admitted


def test_a_finetunejob_only_user_runs_no_reward_code_from_a_configmap_she_may_not_get(arena):
    """The same rule for the GRPO reward functions (method.grpo.rewards[].configMap, Python files the trainer
    imports): found after the rebase on GRPO, by the unit test that finds every ConfigMap reference in the schema."""
    doc = GRPO_EXAMPLE
    job = lean("reward", model=doc["spec"]["model"], data=doc["spec"]["data"], method=copy.deepcopy(
        doc["spec"]["method"]), training=doc["spec"]["training"])
    job["spec"]["method"]["grpo"]["rewards"].append(
        {"type": "function", "function": "team_b:score", "configMap": "team-b-settings", "weight": 0.1})
    assert _refused(arena["fiona"].create(job), "spec.method.grpo.rewards: ConfigMap team-b-settings",
                    "fiona may not get it")
    assert arena["eddie"].create(job).admitted


# --- 4. Priority past a locked priority class -------------------------------------------------------------------------
def test_a_locked_priority_class_locks_the_kueue_priority_label(arena):
    """The hole: every kueue.x-k8s.io/ label reached the Job, kueue.x-k8s.io/priority-class among them, whatever
    pod.priorityClassName's lock said."""
    job = lean("prio", runtimeRef={"name": "attack-locked"})
    job["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": "cluster-critical"}
    answer = arena["fiona"].create(job)
    assert _refused(answer, "metadata.labels.kueue.x-k8s.io/priority-class", "limits.locked"), answer.message
    assert any(e.startswith("metadata.labels.kueue.x-k8s.io/priority-class") for e in _operator_says(job, LOCKED))


# --- 5. Trainer tokens ------------------------------------------------------------------------------------------------
def test_a_trainer_token_reads_no_other_jobs_spec_through_its_status(arena, kubectl):
    """security.md: 'A trainer's token may read its own job's status ... and nothing else of the namespace'. The
    hole: the trainer Role's get on finetunejobs/status had no resourceNames (one ServiceAccount for every job of the
    namespace), and admission policies never see reads."""
    victim = lean("victim", runtimeRef={"name": "attack-locked"},
                  data={"format": "alpaca", "train": [{"inline": [{"instruction": "private", "output": "rows"}]}]})
    apply_list(kubectl, victim)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "attacker-a1-0-abcde", "namespace": NS},
           "spec": {"serviceAccountName": "finetunejob-trainer", "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}]}}
    apply_list(kubectl, pod)
    uid = kubectl.json("get", "pod", pod["metadata"]["name"], "-n", NS)["metadata"]["uid"]
    token = kubectl.run("create", "token", "finetunejob-trainer", "-n", NS, "--bound-object-kind=Pod",
                        f"--bound-object-name={pod['metadata']['name']}", f"--bound-object-uid={uid}").stdout.strip()
    trainer = TenantApi(arena["fiona"].kubeconfig, token=token)
    answer = trainer.request("GET", trainer._path(NS, "victim", "status"))
    assert answer.status == 403, (f"{answer.status}: the trainer of job attacker read job victim's spec: "
                                  f"{json.dumps((answer.body or {}).get('spec', {}).get('data'))[:200]}")


# --- 6. With the operator running ----------------------------------------------------------------------------------
def test_an_orphaning_delete_is_refused_and_an_orphaned_attempt_ends_by_its_own_deadline(arena, kubectl, operator):
    """The hole: fiona deleted her job with propagationPolicy Orphan (a right `delete` alone gives) and its attempt
    ran on, as the trainer identity, with its GPUs, past the runtime's deadline and owned by nothing. The chart's
    policy refuses such a delete (and the orphan finalizer); a cluster admin may still orphan, and then the attempt's
    Job ends by its own activeDeadlineSeconds, what was left of the job's."""
    deadline = 20
    job = lean("orphan", runtimeRef={"name": "attack-small"}, runPolicy={"activeDeadlineSeconds": deadline})
    kubectl.run("apply", "-f", "-", "--as=fiona", input=json.dumps(job))
    wait_status(kubectl, NS, "orphan", lambda s: s.get("phase") == "Running", operator, timeout=120)
    started = time.monotonic()
    fiona = arena["fiona"]
    for body in ({"propagationPolicy": "Orphan"}, {"orphanDependents": True}):
        refused = fiona.request("DELETE", fiona._path(NS, "orphan"), body)
        assert refused.status == 403 and "propagationPolicy Orphan" in refused.message, refused
    finalizer = fiona.request("PATCH", fiona._path(NS, "orphan"), {"metadata": {"finalizers": ["orphan"]}},
                              content_type="application/merge-patch+json")
    assert finalizer.status == 403 and "orphan finalizer" in finalizer.message, finalizer
    held = kubectl.json("get", "job", "orphan-a1", "-n", NS)
    assert 0 < held["spec"]["activeDeadlineSeconds"] <= deadline + JOB_DEADLINE_GRACE_SECONDS, held["spec"]
    kubectl.run("delete", "ftj", "orphan", "-n", NS, "--cascade=orphan")  # a cluster admin may
    until(lambda: kubectl.json_or_none("get", "ftj", "orphan", "-n", NS) is None, "the FineTuneJob was never deleted",
           timeout=60)
    end = started + deadline + 40
    while time.monotonic() < end:
        held = kubectl.json_or_none("get", "job", "orphan-a1", "-n", NS)
        if held is None or (held.get("status") or {}).get("active", 0) == 0:
            break
        time.sleep(2)
    assert held is None or (held.get("status") or {}).get("active", 0) == 0, (
        f"{deadline + 40}s after the job started (deadline {deadline}s) its orphaned Job still runs: {held}")
    assert held is None or any(cd["reason"] == "DeadlineExceeded" for cd in held["status"].get("conditions") or [])
    kubectl.run("delete", "job", "orphan-a1", "-n", NS, "--ignore-not-found")


def test_a_resumed_attempt_orphaned_ends_by_what_was_left_of_the_jobs_deadline(arena, kubectl, operator):
    """The neighbour of the orphan case: a suspend and resume (spec.suspend, as Kueue's preemption does too) starts
    the attempt Job's own clock again (the Job controller sets its startTime anew at the resume), and the Job kept
    the deadline it was created with: orphaned after a resume, a job with 15 s of a 30 s deadline left ran 35 s
    more. The operator keeps the Job's deadline at what is left and the grace; orphaned, the Job ends there, not
    sooner. (This control plane, 1.36, clears a suspended Job's startTime; older ones keep it until the resume:
    tests/unit/test_attempt_start.py.)"""
    deadline, name = 30, "resumed"
    job = lean(name, runtimeRef={"name": "attack-small"}, runPolicy={"activeDeadlineSeconds": deadline})
    kubectl.run("apply", "-f", "-", "--as=fiona", input=json.dumps(job))
    wait_status(kubectl, NS, name, lambda s: s.get("phase") == "Running", operator, timeout=120)
    created_with = kubectl.json("get", "job", f"{name}-a1", "-n", NS)["spec"]["activeDeadlineSeconds"]

    def suspend(value: bool) -> None:
        kubectl.run("patch", "ftj", name, "-n", NS, "--type=merge", "-p", json.dumps({"spec": {"suspend": value}}),
                    "--as=fiona")

    def attempt_job() -> dict | None:
        return kubectl.json_or_none("get", "job", f"{name}-a1", "-n", NS)

    def suspended(held: dict) -> bool:  # as the Job controller sees it, not only as asked
        return any(cd["type"] == "Suspended" and cd["status"] == "True"
                   for cd in (held.get("status") or {}).get("conditions") or [])

    running = kubectl.json("get", "ftj", name, "-n", NS)["status"]
    until(lambda: time.time() - parse_time(running["activeSince"]).timestamp() >= deadline / 2,
          "the job never ran half its deadline", timeout=deadline)
    suspend(True)
    ran = wait_status(kubectl, NS, name, lambda s: s.get("phase") == "Suspended" and "activeSeconds" in s,
                      operator, timeout=60)["activeSeconds"]
    until(lambda: suspended(attempt_job() or {}), "the attempt's Job was never suspended", timeout=60)
    suspend(False)
    left = deadline - ran
    assert 0 < left <= deadline / 2 + 1, ran

    def resumed_with_what_is_left() -> dict | None:  # the operator fails the job itself once it is up: before
        held = attempt_job()
        if held is None or held["spec"].get("suspend") or suspended(held) or not held["status"].get("startTime"):
            return None
        return held if left <= held["spec"]["activeDeadlineSeconds"] <= left + JOB_DEADLINE_GRACE_SECONDS else None

    resumed_job = until(resumed_with_what_is_left, f"the resumed Job's deadline is not what was left ({left}s) and "
                        f"the grace (created with {created_with}s): {attempt_job()}", timeout=left)
    resumed = parse_time(resumed_job["status"]["startTime"])
    kubectl.run("delete", "ftj", name, "-n", NS, "--cascade=orphan")  # a cluster admin may (the orphan case)
    until(lambda: kubectl.json_or_none("get", "ftj", name, "-n", NS) is None, "the FineTuneJob was never deleted",
          timeout=60)

    def ended() -> dict | None:
        conditions = ((attempt_job() or {}).get("status") or {}).get("conditions") or []
        return next((cd for cd in conditions if cd["reason"] == "DeadlineExceeded" and cd["status"] == "True"), None)

    condition = until(ended, f"the orphaned Job never ended by its deadline ({left}s left)",
                      timeout=created_with + 60)
    took = (parse_time(condition["lastTransitionTime"]) - resumed).total_seconds()
    # Whole-second clocks, and the controller-manager's own delay on a busy machine; the whole deadline again would
    # be created_with (35 s).
    assert left <= took <= left + JOB_DEADLINE_GRACE_SECONDS + 5 < created_with, (took, left, created_with)
    kubectl.run("delete", "job", f"{name}-a1", "-n", NS, "--ignore-not-found")


def test_an_unbound_token_of_a_jobs_own_service_account_rewrites_no_status(arena, kubectl, operator):
    """The hole: the trainer-status policy bound the trainer identity always, and other identities only when their
    token was bound to a pod. A job that runs as a ServiceAccount its user named (ci-bot) gets a Role to patch its own
    status; a token of ci-bot bound to nothing (`kubectl create token ci-bot`, a legacy token Secret, a CI system's
    token) wrote phase, and rewrote status.runtime, the record every later update and attempt is judged against
    (with the record's limits emptied, the job went from its runtime's 2 GPUs to 8, at apply and in the operator)."""
    eddie = arena["eddie"]
    job = lean("bot", runtimeRef={"name": "attack-small"}, pod={"serviceAccountName": "ci-bot"},
               runPolicy={"activeDeadlineSeconds": 120})
    kubectl.run("apply", "-f", "-", "--as=eddie", input=json.dumps(job))
    st = wait_status(kubectl, NS, "bot", lambda s: s.get("phase") == "Running", operator, timeout=120)
    assert st["runtime"]["layers"][0]["limits"]["maxGpusPerJob"] == 2
    # Who may mint such a token: eddie (edit) if the built-in role lets him, else whoever holds ci-bot's tokens.
    minted_by = "eddie" if can(kubectl, "eddie", NS, "create", "serviceaccounts", "--subresource=token") else "admin"
    token = kubectl.run("create", "token", "ci-bot", "-n", NS,
                        *(["--as=eddie"] if minted_by == "eddie" else [])).stdout.strip()
    bot = TenantApi(eddie.kubeconfig, token=token)
    status_path = bot._path(NS, "bot", "status")
    phase = bot.request("PATCH", status_path, {"status": {"phase": "Succeeded"}},
                        content_type="application/merge-patch+json", query={"dryRun": "All"})
    emptied = [{**layer, "limits": {}} for layer in st["runtime"]["layers"]]
    forged = bot.request("PATCH", status_path, {"status": {"runtime": {"layers": emptied}}},
                         content_type="application/merge-patch+json", query={"dryRun": "All"})
    assert not phase.admitted and not forged.admitted, (
        f"ci-bot's unbound token (minted by {minted_by}): phase Succeeded {phase.status}, status.runtime limits "
        f"emptied {forged.status}")
    recorded = kubectl.json("get", "ftj", "bot", "-n", NS)["status"]["runtime"]["layers"][0]["limits"]
    assert recorded["maxGpusPerJob"] == 2, recorded


BLANK = "attack-blank"
CAP = runtime("attack-default", {"distributed": {"gpusPerNode": 1}}, {"maxGpusPerJob": 1}, default=True,
              selector={"matchLabels": {"finetunejob.dev/attack-blank": "yes"}})


def test_a_job_created_suspended_is_judged_by_the_runtimes_when_it_first_really_starts(arena, kubectl, operator):
    """The hole: a job created suspended counted as started without a runtime (its attempt 1, a suspended Job, was
    made), so a default added later never bound it. fiona creates a job with suspend: true in a namespace no default
    runtime covers yet; the admin brings the namespace under a default of 1 GPU; her resize to 2 x 4 GPUs with the
    resume is refused, and the resume as it is runs, recording that default as it starts."""
    kubectl.run("create", "namespace", BLANK)
    try:
        kubectl.run("create", "role", "ftj-only", "--verb=create,get,list,update,patch,delete", f"--resource={FTJ}",
                    "-n", BLANK)
        kubectl.run("create", "rolebinding", "ftj-only", "--role=ftj-only", "--user=fiona", "-n", BLANK)
        wait_can(kubectl, "fiona", BLANK, "create", FTJ)
        apply_list(kubectl, CAP)
        job = lean("cheque", BLANK, suspend=True, distributed={"gpusPerNode": 1})
        kubectl.run("apply", "-f", "-", "--as=fiona", input=json.dumps(job))
        st = wait_status(kubectl, BLANK, "cheque", lambda s: s.get("phase") == "Suspended" and s.get("attempt"),
                         operator, timeout=90)
        assert "runtime" not in st and "startTime" not in st, st  # not started: nothing recorded
        kubectl.run("label", "namespace", BLANK, "finetunejob.dev/attack-blank=yes")
        fiona = arena["fiona"]
        probe = lean("probe", BLANK, distributed={"numNodes": 2})
        until(lambda: "limits.maxGpusPerJob = 1" in fiona.create(probe).message, "the default never reached admission")
        resized = fiona.request("PATCH", fiona._path(BLANK, "cheque"), {"spec": {
            "distributed": {"numNodes": 2, "gpusPerNode": 4}, "suspend": False}},
            content_type="application/merge-patch+json")
        assert _refused(resized, "limits.maxGpusPerJob = 1", "ClusterFineTuneRuntime attack-default"), resized
        kubectl.run("patch", "ftj", "cheque", "-n", BLANK, "--as=fiona", "--type=merge", "-p",
                    '{"spec": {"suspend": false}}')
        st = wait_status(kubectl, BLANK, "cheque", lambda s: s.get("phase") == "Running", operator, timeout=120)
        assert st["runtime"]["name"] == "attack-default" and st.get("startTime"), st
        assert st["runtime"]["layers"][0]["limits"]["maxGpusPerJob"] == 1
    finally:
        kubectl.run("delete", "clusterfinetuneruntime", CAP["metadata"]["name"], "--ignore-not-found", check=False)
        kubectl.run("delete", "namespace", BLANK, "--wait=false")
