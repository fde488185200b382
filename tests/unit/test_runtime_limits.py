"""The limits an attack review found bypassed (api/runtime_limits.py, api/sources.py): every model source under
allowedModelSources, remote code only where a runtime allows it, no location climbing out of a prefix, a lent
credential sent nowhere the tenant chooses, volume kinds, and a locked priority class's Kueue label. The same rules
at `kubectl apply`: tests/cluster/test_admission_matrix.py and test_attack_review.py."""

import copy
import re

import pytest

from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.runtime import (
    ENDPOINT_FIELDS,
    LOCKABLE,
    OWN_SECRET_ENV_NAMES,
    TRACKER_FIELDS,
    TRACKER_LENDING,
)
from finetune_operator.api.runtime_layers import recorded, resolve_offline
from finetune_operator.api.runtime_limits import LENDING, parse_runtime
from finetune_operator.api.sources import LOCATION_PATTERN, MODEL_SOURCE_FIELDS, data_sources, normalised, under
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.validation import validate_job
from finetune_operator.render.runtime_policy import value_variables
from tests.unit.test_grpo_spec import PROMPTS
from tests.unit.test_job_rights import _schema_paths
from tests.unit.test_runtimes import job, runtime

pytestmark = pytest.mark.unit
LIMITED = {"allowedModelSources": ["/models/", "meta-llama/"], "allowedDataSources": ["/data/"]}


def judged(limits=None, template=None, **overrides):
    doc = job(**{"spec.runtimeRef": {"name": "r"}, **overrides})
    resolved = resolve_offline(doc, [runtime("r", template=template, limits=limits or {})])
    assert resolved.missing is None, resolved.missing
    return resolved


@pytest.mark.parametrize("path, value", [
    ("spec.model.name", "someone/model"), ("spec.model.tokenizer", "someone/tokenizer"),
    ("spec.model.tokenizer", "/output/tokenizer"), ("spec.method.lora.initFrom", "/output/adapter"),
    ("spec.checkpoints.resume", "/data/checkpoint-10")])
def test_every_model_source_is_held_to_allowed_model_sources(path, value):
    errors = judged(LIMITED, **{path: value}).errors
    assert [(e.path, e.value) for e in errors] == [(path, value)], errors
    assert "limits.allowedModelSources /models/, meta-llama/" in errors[0].message
    assert judged(LIMITED, **{path: "meta-llama/x" if "resume" not in path else "/models/ckpt"}).errors == []


def grpo(*models, climb=None):
    """A GRPO job under runtime r: an exact-match reward, then a model reward for each of `models`."""
    rewards = [{"type": "exactMatch", "column": "answer"}] + [{"type": "model", "model": m, "name": f"rm{i}"}
                                                              for i, m in enumerate(models)]
    return job(**{"spec.runtimeRef": {"name": "r"}, "spec.model.name": "/models/base",
                  "spec.method": {"type": "lora", "objective": "grpo", "grpo": {"rewards": rewards}},
                  "spec.data": {"format": "prompt", "maxLength": 512, "train": [{"inline": PROMPTS}]},
                  "spec.training": {"perDeviceTrainBatchSize": 8}})


def test_each_grpo_reward_model_is_held_to_allowed_model_sources():
    """The hole: a reward model (weights the trainer loads) was read by no limit; each one is, by its index."""
    doc = grpo("/models/rm", "someone/evil-rm", "/output/rm")
    validate_job(doc)
    resolved = resolve_offline(doc, [runtime("r", limits=LIMITED)])
    assert [(e.path, e.value) for e in resolved.errors] == [("spec.method.grpo.rewards[2].model", "someone/evil-rm"),
                                                             ("spec.method.grpo.rewards[3].model", "/output/rm")]
    assert "limits.allowedModelSources /models/, meta-llama/" in resolved.errors[0].message
    assert resolve_offline(grpo("/models/rm", "meta-llama/rm"), [runtime("r", limits=LIMITED)]).errors == []
    # Judged against the recorded snapshot too (the operator's check of every attempt, after an edit).
    started = resolve_offline(grpo("/models/rm"), [runtime("r", limits=LIMITED)])
    assert started.errors == [] and started.snapshot is not None
    assert [e.path for e in recorded(grpo("/models/rm", "someone/evil-rm"), started.snapshot).errors] == [
        "spec.method.grpo.rewards[2].model"]


@pytest.mark.parametrize("model", ["/models/../output/evil", "/models/x/..", "/models/%2e%2e/x", "/models//x",
                                   "s3://models/../other/x"])
def test_a_reward_model_climbs_out_of_no_prefix(model):
    with pytest.raises(InvalidSpec) as info:
        validate_job(grpo(model))
    assert [e.path for e in info.value.errors] == ["spec.method.grpo.rewards[1].model"], info.value.errors


# Location fields nothing is loaded from: where the job writes (the output's own rules, api/output.py).
NOT_SOURCES = {"spec.output.uri"}


def test_every_location_field_of_the_schema_is_a_model_or_data_source_both_checks_read():
    """A field that names a model, its weights or data (the location pattern, or a description saying Hub id, path
    or s3://) is in MODEL_SOURCE_FIELDS or data_sources, carries the location pattern (no '..'), and the admission
    policy's modelSources reads every MODEL_SOURCE_FIELDS entry: a new field cannot be forgotten by either check."""
    schema = FineTuneJobSpec.model_json_schema(by_alias=True, mode="validation")
    naming = {path for path, node in _schema_paths(schema, schema["$defs"])
              if node.get("type") == "string" and (node.get("pattern") == LOCATION_PATTERN or re.search(
                  r"\bHub id\b|s3://", node.get("description", "")))}
    assert naming >= NOT_SOURCES
    naming -= NOT_SOURCES
    data = {f"spec.data.{section}.{field}" for section in ("train", "validation") for field in ("path", "hub.name")}
    models = {f.replace("[]", "") for f in MODEL_SOURCE_FIELDS}
    assert naming - models - data == set(), f"locations neither check reads: {naming - models - data}"
    located = dict(_schema_paths(schema, schema["$defs"]))
    assert {p for p in naming - {"spec.checkpoints.resume"} if located[p].get("pattern") != LOCATION_PATTERN} == set()
    cel = next(v["expression"] for v in value_variables("params.spec.template") if v["name"] == "modelSources")
    assert [f for f in MODEL_SOURCE_FIELDS if f"'{f.split('[]')[0]}" not in cel] == []
    # data_sources reads each data field it is credited with.
    doc = validate_job(job(**{"spec.data": {"format": "text", "train": [{"path": "/a"}, {"hub": {"name": "o/b"}}],
                                            "validation": [{"path": "/c"}, {"hub": {"name": "o/d"}}]}})).spec
    assert {p.replace("[0]", "").replace("[1]", "") for p, _ in data_sources(doc)} == data


def test_a_job_may_always_resume_from_its_own_output():
    assert judged(LIMITED, **{"spec.checkpoints.resume": "/output/checkpoint-10"}).errors == []
    assert judged({**LIMITED, "allowedModelSources": ["s3://models/"]},
                  **{"spec.model.name": "s3://models/x", "spec.checkpoints.resume": "never"}).errors == []


def test_prefixes_are_compared_on_the_normalised_location():
    """The schema refuses dot segments; a stored location that slipped past it still cannot climb out."""
    assert normalised("/models/../output/x") == "/output/x" and not under("/models/../output/x", ["/models/"])
    assert normalised("s3://models/../other/x") == "s3://other/x" and not under("s3://models/../x", ["s3://models/"])
    assert normalised("//models//x/") == "/models/x/" and under("/models/x", ["/models/"])
    assert not under("/models-other/x", ["/models/"])


def test_remote_code_needs_the_runtimes_yes_and_a_record_from_before_the_limit_keeps_it():
    refused = judged({}, **{"spec.model.trustRemoteCode": True})
    assert [e.path for e in refused.errors] == ["spec.model.trustRemoteCode"]
    assert "limits.allowTrustRemoteCode = false" in refused.errors[0].message
    assert judged({"allowTrustRemoteCode": True}, **{"spec.model.trustRemoteCode": True}).errors == []
    free = resolve_offline(job(**{"spec.model.trustRemoteCode": True}), [])  # no runtime: the job decides
    assert free.snapshot is None and free.errors == []
    # New records say the limit; a record without it is an older operator's, which did not limit remote code.
    snapshot = judged({"maxNodes": 4}).snapshot
    assert snapshot["layers"][0]["limits"] == {"allowTrustRemoteCode": False, "maxNodes": 4}
    edited = job(**{"spec.runtimeRef": {"name": "r"}, "spec.model.trustRemoteCode": True})
    assert [e.path for e in recorded(edited, snapshot).errors] == ["spec.model.trustRemoteCode"]
    old = copy.deepcopy(snapshot)
    del old["layers"][0]["limits"]["allowTrustRemoteCode"]
    assert recorded(edited, old).errors == []


def _grpo_with(rewards):
    return {"spec.method": {"type": "lora", "objective": "grpo", "grpo": {"numGenerations": 4, "rewards": rewards,
                                                                          "maxCompletionLength": 16}},
            "spec.data": {"format": "prompt", "maxLength": 64, "train": [{"inline": PROMPTS}]},
            "spec.training.perDeviceTrainBatchSize": 8}


@pytest.mark.parametrize("allowed", [None, False, True])
def test_reward_code_from_a_configmap_is_remote_code(allowed):
    """A GRPO reward function from a ConfigMap is Python the job brings, imported by the trainer beside everything
    the runtime lends (a review ran one that sent a lent HF_TOKEN away under a runtime locking the image, env,
    volumes and Secrets): it needs the runtime's allowTrustRemoteCode as remote code does. A function from the image
    and the built-in rewards do not."""
    limits = {} if allowed is None else {"allowTrustRemoteCode": allowed}
    code = {"type": "function", "function": "mine:mine", "configMap": "my-rewards"}
    image = {"type": "function", "function": "platform_rewards:score"}
    builtin = {"type": "exactMatch", "column": "answer"}
    refused = judged(limits, **_grpo_with([builtin, image, code, dict(code, function="more:more", configMap="more")]))
    expected = [] if allowed else ["spec.method.grpo.rewards[2].configMap", "spec.method.grpo.rewards[3].configMap"]
    assert [e.path for e in refused.errors] == expected, refused.errors
    assert all("limits.allowTrustRemoteCode = false" in e.message for e in refused.errors)
    assert judged(limits, **_grpo_with([builtin, image])).errors == []
    assert validate_job(job(**_grpo_with([code]))).spec.method.grpo.rewards[0].config_map == "my-rewards"
    assert resolve_offline(job(**_grpo_with([code])), []).errors == []  # no runtime: the job decides


@pytest.mark.parametrize("target, value, ok", [
    ("spec.output.uri", "s3://team-a-runs/fiona/run-1", True), ("spec.output.uri", "s3://models/prod/llama-8b", False),
    ("spec.output.uri", "s3://team-a-runs-evil/x", False), ("spec.output.uri", "s3://team-a-runs/../models/x", False),
    ("spec.output.push.repo", "team-a/model", True), ("spec.output.push.repo", "platform-org/production-model", False),
    ("spec.output.push.repo", "team-a-evil/model", False)])
def test_lent_write_credentials_write_only_under_allowed_outputs(target, value, ok):
    """A review sent a runtime's lent S3 and Hub write credentials over the platform's production prefix and repo:
    allowedOutputs holds where jobs write and push, the runtime template's value included."""
    limits = {"allowedOutputs": ["s3://team-a-runs/", "team-a/"]}
    output = {"uri": value} if target == "spec.output.uri" else {"push": {"repo": value,
                                                                           "tokenSecret": {"name": "hub"}}}
    errors = judged(limits, **{"spec.output": output}).errors
    assert [(e.path, e.value) for e in errors] == ([] if ok else [(target, value)]), errors
    assert ok or "limits.allowedOutputs s3://team-a-runs/, team-a/" in errors[0].message
    template = {"output": {"uri": "s3://elsewhere/runs/", "push": {"repo": "elsewhere/model",
                                                                   "tokenSecret": {"name": "hub"}}}}
    from_template = judged(limits, template=template).errors  # what the runtime writes for a job is held too
    assert {e.path for e in from_template} == {"spec.output.uri", "spec.output.push.repo"}
    assert judged({}, **{"spec.output": output}).errors == []  # no limit: anywhere


SETS = {"pod.env": [{"name": "HF_ENDPOINT", "value": "http://mine"}], "s3.endpointURL": "http://mine:9000",
        "output.push.endpoint": "http://mine", "tracking.wandb.baseUrl": "http://mine",
        "tracking.mlflow.trackingUri": "http://mine"}
TRACKER_SETS = {"tracking.wandb.entity": "another-team", "tracking.project": "another-teams-project"}
LENDS = {"pod.secretEnv": [{"name": "PLATFORM_TOKEN", "secretName": "platform", "key": "t"}],
         "pod.volumes": [{"name": "creds", "mountPath": "/creds", "secret": "platform"}],
         "pod.serviceAccountName": "platform-identity", "s3.credentialsSecret": "platform-s3",
         "output.push.tokenSecret": {"name": "platform-hub"}}
ANSWER = {"pod.secretEnv": [{"name": "MINE", "secretName": "mine", "key": "t"}],
          "pod.volumes": [{"name": "mine", "mountPath": "/mine", "secret": "mine"}],
          "pod.serviceAccountName": "mine", "s3.credentialsSecret": "mine", "output.push.tokenSecret": {"name": "mine"}}


def _tree(path, value):
    tree = node = {}
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return tree


@pytest.mark.parametrize("lent", sorted(LENDS))
@pytest.mark.parametrize("endpoint", ENDPOINT_FIELDS)
def test_a_credential_the_runtime_lends_goes_to_no_endpoint_the_job_sets(lent, endpoint):
    assert set(SETS) == set(ENDPOINT_FIELDS) and set(LENDS) == set(LENDING) and set(ENDPOINT_FIELDS) <= set(LOCKABLE)
    template = _tree(lent, LENDS[lent])
    if lent == "output.push.tokenSecret":
        template["output"]["push"]["repo"] = "platform/model"  # a push the runtime sets up needs its repository
    extra = {"spec.output.push.repo": "org/m"} if lent == "output.push.tokenSecret" or "push" in endpoint else {}
    if "push" in endpoint and lent != "output.push.tokenSecret":
        extra["spec.output.push.tokenSecret"] = {"name": "mine"}
    if "wandb" in endpoint:
        extra.update({"spec.tracking.reportTo": ["wandb"], "spec.tracking.wandb.offline": True})
    if "mlflow" in endpoint:
        extra["spec.tracking.reportTo"] = ["mlflow"]
    setting = {f"spec.{endpoint}": SETS[endpoint], **extra}
    refused = judged({}, template, **setting)
    validate_job(refused.obj)  # a valid job: only the lock refuses it
    assert [e.path for e in refused.errors] == [f"spec.{endpoint}"], refused.errors
    assert f"lends the job credentials (spec.template.{lent}" in refused.errors[0].message
    # The job that brings its own (replacing what the runtime lends) borrows nothing.
    own = judged({}, template, **setting, **{f"spec.{lent}": ANSWER[lent]})
    assert [e for e in own.errors if e.path == f"spec.{endpoint}"] == []
    # A lock the runtime lists says so itself, once.
    locked = judged({"locked": [endpoint]}, template, **setting)
    assert [e.path for e in locked.errors] == [f"spec.{endpoint}"] and "limits.locked" in locked.errors[0].message


@pytest.mark.parametrize("lent", sorted(LENDS))
@pytest.mark.parametrize("field", TRACKER_FIELDS)
def test_what_a_lent_tracker_key_writes_into_is_the_runtimes(lent, field):
    """The platform's W&B key (pod.secretEnv), or what MLflow may log in with (a Secret volume, the ServiceAccount),
    writes into the runtime's project and team, never another team's. S3 or Hub credentials alone lock neither:
    the job's own tracker key is its own to point (api/runtime_limits.py)."""
    assert set(TRACKER_SETS) == set(TRACKER_FIELDS) and set(TRACKER_FIELDS) <= set(LOCKABLE)
    template = _tree(lent, LENDS[lent])
    if lent == "output.push.tokenSecret":
        template["output"]["push"]["repo"] = "platform/model"
    setting = {f"spec.{field}": TRACKER_SETS[field], "spec.tracking.reportTo": ["wandb"],
               "spec.tracking.wandb.offline": True, **({"spec.output.push.repo": "org/m"}
                                                       if lent == "output.push.tokenSecret" else {})}
    judged_ = judged({}, template, **setting)
    validate_job(judged_.obj)
    refused = [e for e in judged_.errors if e.path == f"spec.{field}"]
    assert bool(refused) is (lent in TRACKER_LENDING), judged_.errors
    if refused:
        assert f"what a tracker logs in with (spec.template.{lent}" in refused[0].message
        assert "the job's namespace" in refused[0].fix
        # The job that brings its own (replacing what the runtime lends) borrows nothing.
        own = judged({}, template, **setting, **{f"spec.{lent}": ANSWER[lent]})
        assert [e for e in own.errors if e.path == f"spec.{field}"] == []
        assert f"give the job its own ({lent})" in refused[0].fix
        # A started job is held to it as recorded (an edit adding it later, a resume).
        doc = job(**{"spec.runtimeRef": {"name": "r"}, **setting})
        assert [e.path for e in recorded(doc, judged_.snapshot).errors] == [f"spec.{field}"]


@pytest.mark.parametrize("lent", sorted(LENDS))
@pytest.mark.parametrize("name", ["HF_ENDPOINT", "AWS_ENDPOINT_URL", "PYTHONPATH", "hf_endpoint", "HF_TOKEN",
                                  "AWS_ACCESS_KEY_ID", "WANDB_API_KEY"])
def test_a_jobs_own_secret_variables_are_credentials_only_while_the_runtime_lends_any(lent, name):
    """pod.env is locked while anything is lent; a variable of the job's own from its own Secret is an environment
    variable too (HF_ENDPOINT would send the lent Hub token to the tenant's server)."""
    template = _tree(lent, LENDS[lent])
    extra = {}
    if lent == "output.push.tokenSecret":
        template["output"]["push"]["repo"] = "platform/model"
        extra["spec.output.push.repo"] = "org/m"
    own = {"spec.pod.secretEnv": [{"name": name, "secretName": "mine", "key": "k"}], **extra}
    found = judged({}, template, **own)
    refused = [e for e in found.errors if e.path == "spec.pod.secretEnv[0].name"]
    # Its own pod.secretEnv replaces the template's: then nothing is lent.
    assert bool(refused) is (lent != "pod.secretEnv" and name.upper() not in OWN_SECRET_ENV_NAMES), found.errors
    if refused:
        assert "lends the job credentials" in refused[0].message and "HF_TOKEN" in refused[0].fix
        doc = job(**{"spec.runtimeRef": {"name": "r"}, **own})
        assert [e.path for e in recorded(doc, found.snapshot).errors] == ["spec.pod.secretEnv[0].name"]


NFS = {"name": "export", "mountPath": "/export", "nfs": {"server": "nfs.local", "path": "/x"}}
CONFIG = {"name": "settings", "mountPath": "/settings", "configMap": "settings"}


def test_volume_kinds_and_nfs_under_allowed_claims():
    nfs = {"spec.pod.volumes": [NFS]}
    assert judged({}, **nfs).errors == []  # no limit on storage: every kind
    under_claims = judged({"allowedClaims": ["team-data"]}, **nfs).errors
    assert [e.path for e in under_claims] == ["spec.pod.volumes[0]"] and "no nfs volume" in under_claims[0].message
    assert judged({"allowedClaims": ["team-data"], "allowedVolumeKinds": ["nfs"]}, **nfs).errors == []
    kinds = judged({"allowedVolumeKinds": ["persistentVolumeClaim"]}, **{"spec.pod.volumes": [CONFIG, NFS]}).errors
    assert [(e.path, e.value) for e in kinds] == [("spec.pod.volumes[0]", "configMap"), ("spec.pod.volumes[1]", "nfs")]
    assert "limits.allowedVolumeKinds persistentVolumeClaim" in kinds[0].message
    # A runtime that lends an NFS export under its own allowedClaims breaks its own limits.
    spec, errors = parse_runtime(runtime("r", template={"pod": {"volumes": [NFS]}},
                                         limits={"allowedClaims": ["team-data"]}))
    assert spec is None and [e.path for e in errors] == ["spec.template.pod.volumes[0]"], errors


def test_a_locked_priority_class_locks_the_kueue_priority_label():
    doc = job(**{"spec.runtimeRef": {"name": "r"}})
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": "high", "kueue.x-k8s.io/queue-name": "q"}
    errors = resolve_offline(doc, [runtime("r", limits={"locked": ["pod.priorityClassName"]})]).errors
    assert [e.path for e in errors] == ["metadata.labels.kueue.x-k8s.io/priority-class"]
    both = resolve_offline(doc, [runtime("r", limits={"locked": ["pod.priorityClassName", "queueName"]})]).errors
    assert [e.path for e in both] == ["metadata.labels.kueue.x-k8s.io/priority-class",
                                      "metadata.labels.kueue.x-k8s.io/queue-name"]
