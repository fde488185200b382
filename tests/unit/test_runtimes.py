"""Runtimes (api/runtime.py): the merge order, locks, limits and the choice of runtime, as the operator and
`finetune validate/render/run --runtime` apply them; the examples written for the chart's catalogue."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from finetune_operator.api.crd import CRD_FILES, crd_yaml
from finetune_operator.api.runtime import LOCKABLE, LockableField, RuntimeLimits, merge
from finetune_operator.api.runtime_layers import resolve_offline
from finetune_operator.api.runtime_limits import effective_job
from finetune_operator.api.validation import validate_job
from finetune_operator.cli.main import main, validate_with_runtimes
from finetune_operator.render.runtime_admission import chart_template
from tests.builders import make_job
from tests.conftest import ROOT

pytestmark = pytest.mark.unit
RUNTIMES = ROOT / "examples" / "runtimes"
CATALOGUE = [d for d in yaml.safe_load_all((RUNTIMES / "catalogue.yaml").read_text()) if d]


def runtime(name, kind="ClusterFineTuneRuntime", default=False, template=None, limits=None, namespace=None,
            generation=1):
    meta = {"name": name, "generation": generation, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": kind, "metadata": meta,
            "spec": {"default": default, "template": template or {}, "limits": limits or {}}}


def job(**overrides):
    """A job that leaves to its runtime what a runtime gives (distributed, resources, pod), with `overrides`."""
    doc = make_job({"metadata.namespace": "team-a"})
    for section in ("distributed", "resources", "pod"):
        doc["spec"].pop(section, None)
    for path, value in overrides.items():
        node = doc
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return doc


def test_maps_merge_key_by_key_and_lists_are_replaced_whole():
    defaults = {"pod": {"image": "trainer:1", "nodeSelector": {"pool": "h100", "zone": "a"},
                        "tolerations": [{"key": "gpu", "operator": "Exists"}]},
                "distributed": {"gpusPerNode": 8, "strategy": "deepspeed", "deepspeed": {"zeroStage": 3}}}
    ours = {"pod": {"nodeSelector": {"zone": "b"}, "tolerations": [{"key": "spot", "operator": "Exists"}]},
            "distributed": {"numNodes": 2, "deepspeed": {"offloadOptimizer": "cpu"}}}
    assert merge(defaults, ours) == {
        "pod": {"image": "trainer:1", "nodeSelector": {"pool": "h100", "zone": "b"},
                "tolerations": [{"key": "spot", "operator": "Exists"}]},
        "distributed": {"gpusPerNode": 8, "strategy": "deepspeed", "numNodes": 2,
                        "deepspeed": {"zeroStage": 3, "offloadOptimizer": "cpu"}}}
    assert defaults["pod"]["nodeSelector"] == {"pool": "h100", "zone": "a"}  # inputs untouched


def test_a_job_with_only_model_data_and_method_runs_with_the_runtimes_template():
    gpu8 = runtime("gpu-8x", template={"pod": {"image": "registry/trainer:2"}, "queueName": "team-a",
                                       "distributed": {"gpusPerNode": 8, "strategy": "deepspeed"}})
    resolved = resolve_offline(job(**{"spec.runtimeRef": {"name": "gpu-8x"}, "spec.distributed": {"numNodes": 2}}),
                               [gpu8])
    assert not resolved.errors and resolved.missing is None
    validated = validate_job(resolved.obj)
    d = validated.spec.distributed
    assert (d.num_nodes, d.gpus_per_node, d.strategy, validated.spec.pod.image) == (2, 8, "deepspeed",
                                                                                    "registry/trainer:2")
    assert validated.labels["kueue.x-k8s.io/queue-name"] == "team-a"
    snap = resolved.snapshot
    assert (snap["kind"], snap["name"], snap["generation"]) == ("ClusterFineTuneRuntime", "gpu-8x", 1)
    assert snap["template"]["distributed"] == {"gpusPerNode": 8, "strategy": "deepspeed"} and len(snap["digest"]) == 12


def test_a_job_without_a_runtime_and_none_marked_default_is_as_written():
    doc = make_job({"metadata.namespace": "team-a"})
    resolved = resolve_offline(doc, [runtime("gpu-8x")])
    assert resolved.obj == doc and resolved.snapshot is None and not resolved.errors


def test_the_namespace_default_is_layered_over_the_cluster_default_and_both_limits_hold():
    cluster = runtime("platform", default=True, template={"pod": {"image": "trainer:platform"},
                                                          "distributed": {"gpusPerNode": 4}},
                      limits={"maxGpusPerJob": 16})
    team = runtime("team-a-defaults", kind="FineTuneRuntime", namespace="team-a", default=True,
                   template={"distributed": {"gpusPerNode": 8}}, limits={"maxNodes": 4})
    other_team = runtime("team-b-defaults", kind="FineTuneRuntime", namespace="team-b", default=True,
                         template={"pod": {"image": "trainer:b"}})
    resolved = resolve_offline(job(**{"spec.distributed": {"numNodes": 2}}), [cluster, team, other_team])
    spec = validate_job(resolved.obj).spec
    assert (spec.pod.image, spec.distributed.gpus_per_node) == ("trainer:platform", 8)
    assert [(x["kind"], x["name"]) for x in resolved.snapshot["layers"]] == [
        ("ClusterFineTuneRuntime", "platform"), ("FineTuneRuntime", "team-a-defaults")]
    assert resolved.snapshot["name"] == "team-a-defaults" and not resolved.errors
    too_big = resolve_offline(job(**{"spec.distributed": {"numNodes": 3}}), [cluster, team])
    assert [e.path for e in too_big.errors] == ["spec.distributed"]  # 3 x 8 = 24 > the platform's 16
    assert "ClusterFineTuneRuntime platform allows limits.maxGpusPerJob = 16" in too_big.errors[0].message


def test_a_missing_runtime_or_two_defaults_are_named_not_guessed():
    missing = resolve_offline(job(**{"spec.runtimeRef": {"kind": "FineTuneRuntime", "name": "nope"}}), [])
    assert missing.missing.startswith("spec.runtimeRef names FineTuneRuntime nope, which does not exist in "
                                      "namespace team-a")
    two = resolve_offline(job(), [runtime("a", default=True), runtime("b", default=True)])
    assert "2 ClusterFineTuneRuntimes are marked default (a, b)" in two.missing
    elsewhere = runtime("mine", kind="FineTuneRuntime", namespace="team-b")
    assert resolve_offline(job(**{"spec.runtimeRef": {"kind": "FineTuneRuntime", "name": "mine"}}),
                           [elsewhere]).missing is not None  # another namespace's runtime is not this job's


def test_lockable_descriptions_fit_in_a_cel_string():
    """They are written into the admission policies' single-quoted CEL messages: a quote would break every policy
    (a description with "slice's" refused every FineTuneJob write in the cluster tests)."""
    assert [what for what in LOCKABLE.values() if "'" in what or "\\" in what] == []


@pytest.mark.parametrize("path", sorted(LOCKABLE))
def test_each_locked_field_set_by_the_job_is_refused_naming_the_runtime(path: LockableField):
    values = {"pod.image": "mine:1", "pod.serviceAccountName": "mine", "pod.nodeSelector": {"a": "b"},
              "pod.tolerations": [{"key": "x", "operator": "Exists"}], "pod.affinity": {},
              "pod.priorityClassName": "high", "pod.volumes": [], "pod.env": [], "pod.secretEnv": [],
              "resources": {"cpu": "1"}, "distributed.strategy": "ddp", "distributed.gpusPerNode": 1,
              "s3": {"region": "x"}, "s3.endpointURL": "http://mine:9000", "output.push.endpoint": "https://mine",
              "tracking.wandb.baseUrl": "https://mine", "tracking.mlflow.trackingUri": "https://mine",
              "tracking.wandb.entity": "another-team", "tracking.project": "another-teams-project",
              "pod.schedulerName": "mine", "resources.gpuResourceName": "nvidia.com/gpu", "output.uri": "s3://mine/x",
              "output.push.repo": "mine/model"}
    doc = job()
    if path == "queueName":
        doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "mine"}
    else:
        doc = job(**{f"spec.{path}": values[path]})
    _, errors = effective_job(doc, "ClusterFineTuneRuntime", "locked", {}, RuntimeLimits(locked=[path]))
    (error,) = errors
    assert "is locked by ClusterFineTuneRuntime locked (limits.locked)" in error.message, error
    assert error.path.endswith(path if path != "queueName" else "queue-name")
    _, fine = effective_job(job(), "ClusterFineTuneRuntime", "locked", {}, RuntimeLimits(locked=[path]))
    assert fine == []


LIMIT_CASES = {
    "maxNodes": ({"maxNodes": 2}, {"spec.distributed": {"numNodes": 3}}, "spec.distributed.numNodes",
                 "limits.maxNodes = 2"),
    "maxGpusPerJob": ({"maxGpusPerJob": 8}, {"spec.distributed": {"numNodes": 2, "gpusPerNode": 8}},
                      "spec.distributed", "limits.maxGpusPerJob = 8"),
    "allowedMethods": ({"allowedMethods": ["lora"]}, {"spec.method": {"type": "full"}}, "spec.method.type",
                       "limits.allowedMethods"),
    "allowedStrategies": ({"allowedStrategies": ["deepspeed"]}, {"spec.distributed": {"strategy": "ddp"}},
                          "spec.distributed.strategy", "limits.allowedStrategies"),
    "allowedModelSources": ({"allowedModelSources": ["s3://models/", "/models/"]},
                            {"spec.model.name": "someone/else"}, "spec.model.name", "limits.allowedModelSources"),
    "allowedDataSources": ({"allowedDataSources": ["/data/team-a/"]},
                           {"spec.data.train": [{"path": "/data/team-a/x.jsonl"}, {"path": "/data/team-b/y.jsonl"}]},
                           "spec.data.train[1].path", "limits.allowedDataSources"),
    "allowedClaims": ({"allowedClaims": ["team-data"]},
                      {"spec.pod": {"volumes": [{"name": "d", "mountPath": "/data", "claimName": "team-data"},
                                                {"name": "x", "mountPath": "/x", "claimName": "other-team"}]}},
                      "spec.pod.volumes[1].claimName", "limits.allowedClaims"),
    "maxActiveDeadlineSeconds": ({"maxActiveDeadlineSeconds": 3600}, {}, "spec.runPolicy.activeDeadlineSeconds",
                                 "limits.maxActiveDeadlineSeconds = 3600"),
}


@pytest.mark.parametrize("case", sorted(LIMIT_CASES))
def test_each_limit_refuses_naming_the_runtime_the_limit_and_the_value(case):
    limits, overrides, path, said = LIMIT_CASES[case]
    resolved = resolve_offline(job(**{"spec.runtimeRef": {"name": "capped"}, **overrides}),
                               [runtime("capped", limits=limits)])
    (error,) = resolved.errors
    assert error.path == path and f"ClusterFineTuneRuntime capped allows {said}" in error.message, error
    within = resolve_offline(job(**{"spec.runtimeRef": {"name": "capped"}}), [runtime("capped", limits=limits,
                             template={"runPolicy": {"activeDeadlineSeconds": 600},
                                                                 "distributed": {"strategy": "deepspeed"}})])
    assert within.errors == [] or case in ("allowedModelSources", "allowedDataSources"), within.errors


def test_the_cli_validates_against_a_runtime_file_and_says_every_error(tmp_path, capsys):
    capped = runtime("capped", template={"pod": {"image": "t:1"}},
                     limits={"locked": ["pod.image"], "maxNodes": 1, "allowedMethods": ["lora"]})
    (tmp_path / "runtime.yaml").write_text(yaml.safe_dump(capped))
    doc = make_job({"metadata.name": "over", "spec.runtimeRef": {"name": "capped"}, "spec.pod.image": "mine:2",
                    "spec.distributed": {"numNodes": 2, "gpusPerNode": 1}, "spec.method": {"type": "full"}})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    code = main(["validate", "-o", "json", "--runtime", str(tmp_path / "runtime.yaml"), str(tmp_path / "job.yaml")])
    assert code == 1
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert sorted(e["path"] for e in result["errors"]) == ["spec.distributed.numNodes", "spec.method.type",
                                                            "spec.pod.image"]


@pytest.mark.parametrize("path", sorted(RUNTIMES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_runtime_example_validates_against_the_catalogue(path: Path):
    if path.name == "catalogue.yaml":
        return
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert doc["spec"].get("runtimeRef"), "a runtime example names its runtime"
    resolved = resolve_offline(copy.deepcopy(doc), CATALOGUE)
    assert resolved.snapshot is not None and resolved.snapshot["name"] == doc["spec"]["runtimeRef"]["name"]
    validate_with_runtimes(doc, [str(RUNTIMES / "catalogue.yaml")])


def test_the_runtime_crds_and_the_admission_policies_are_generated():
    for name, make in CRD_FILES.items():
        for where in (ROOT / "crds", ROOT / "charts" / "finetunejob" / "crds"):
            assert (where / name).read_text() == crd_yaml(make()), f"{where / name} is stale: run ./hack/generate.sh"
    template = ROOT / "charts" / "finetunejob" / "templates" / "admission-policy-runtimes.yaml"
    assert template.read_text() == chart_template(), "run ./hack/generate.sh"


def test_the_job_crd_leaves_runtime_sections_undefaulted():
    """A default the apiserver filled in (gpusPerNode: 1) would hide the runtime's (8)."""
    schema = yaml.safe_load((ROOT / "crds" / "finetunejob.yaml").read_text())
    spec = schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    gpus = spec["distributed"]["properties"]["gpusPerNode"]
    assert "default" not in gpus and gpus["description"].endswith("Default: 1.")
    assert spec["method"]["default"] == {}  # sections a runtime does not own keep theirs


# --- what a started job is judged against, and which runtimes a namespace may use ----------------------------------
def started(doc, runtimes_now):
    """The job as the operator recorded it when it started under `runtimes_now`."""
    from finetune_operator.api.runtime_layers import recorded

    snapshot = resolve_offline(doc, runtimes_now).snapshot
    return lambda edited: recorded(edited, snapshot)


def test_a_started_job_is_judged_by_the_limits_it_recorded_never_by_the_runtime_now():
    small = runtime("small", template={"distributed": {"gpusPerNode": 2}, "pod": {"image": "t:1"}},
                    limits={"locked": ["pod.image"], "maxGpusPerJob": 4})
    doc = job(**{"spec.runtimeRef": {"name": "small"}})
    judge = started(doc, [small])
    assert resolve_offline(doc, [small]).snapshot["layers"][0]["limits"] == {"allowTrustRemoteCode": False,
                                                                             **small["spec"]["limits"]}
    within = judge(job(**{"spec.runtimeRef": {"name": "small"}, "spec.distributed": {"numNodes": 2}}))
    assert within.errors == [] and validate_job(within.obj).spec.total_gpus == 4
    past = judge(job(**{"spec.runtimeRef": {"name": "small"}, "spec.distributed": {"numNodes": 3, "gpusPerNode": 8},
                        "spec.pod": {"image": "evil:1"}}))
    assert sorted(e.path for e in past.errors) == ["spec.distributed", "spec.pod.image"]
    assert any("ClusterFineTuneRuntime small allows limits.maxGpusPerJob = 4" in e.message for e in past.errors)
    # Without its runtimeRef (the CRD refuses that; the operator would not care): the same record, the same answer.
    gone = judge(job(**{"spec.distributed": {"numNodes": 3, "gpusPerNode": 8}}))
    assert [e.path for e in gone.errors] == ["spec.distributed"]


def test_a_record_without_limits_from_an_older_operator_limits_nothing():
    from finetune_operator.api.runtime_layers import recorded

    snapshot = resolve_offline(job(**{"spec.runtimeRef": {"name": "small"}}),
                               [runtime("small", limits={"maxNodes": 1})]).snapshot
    for layer in snapshot["layers"]:
        del layer["limits"]
    assert recorded(job(**{"spec.distributed": {"numNodes": 3}}), snapshot).errors == []


@pytest.mark.parametrize("case", ["maxNodes", "maxGpusPerJob", "allowedStrategies", "maxActiveDeadlineSeconds",
                                  "allowedClaims"])
def test_a_runtime_whose_template_breaks_its_own_limits_is_invalid(case):
    from finetune_operator.api.runtime_limits import parse_runtime

    claim = {"name": "x", "mountPath": "/x", "claimName": "theirs"}
    limits, breaking, within = {
        "maxNodes": ({"maxNodes": 2}, {"distributed": {"numNodes": 3}}, {"distributed": {"numNodes": 2}}),
        "maxGpusPerJob": ({"maxGpusPerJob": 8}, {"distributed": {"gpusPerNode": 16}},
                          {"distributed": {"numNodes": 2, "gpusPerNode": 4}}),
        "allowedStrategies": ({"allowedStrategies": ["fsdp"]}, {"distributed": {"strategy": "ddp"}}, {}),
        "maxActiveDeadlineSeconds": ({"maxActiveDeadlineSeconds": 60}, {"runPolicy": {"activeDeadlineSeconds": 61}},
                                     {"runPolicy": {"activeDeadlineSeconds": 60}}),
        "allowedClaims": ({"allowedClaims": ["ours"]}, {"pod": {"volumes": [claim]}},
                          {"output": {"claimName": "ours"}}),
    }[case]
    spec, errors = parse_runtime(runtime("r", template=breaking, limits=limits))
    assert spec is None and len(errors) == 1 and f"breaks its own limits.{case}" in errors[0].message, errors
    assert errors[0].path.startswith("spec.template.")
    assert parse_runtime(runtime("r", template=within, limits=limits))[1] == []
    missing = resolve_offline(job(**{"spec.runtimeRef": {"name": "r"}}), [runtime("r", template=breaking,
                                                                                  limits=limits)]).missing
    assert missing.startswith("ClusterFineTuneRuntime r is invalid: spec.template."), missing


def test_a_cluster_runtime_is_used_only_where_its_namespace_selector_matches():
    from finetune_operator.api.runtime_layers import RUNTIME_NOT_ALLOWED

    research = runtime("research", default=True, limits={"maxNodes": 1})
    research["spec"]["namespaceSelector"] = {"matchLabels": {"team": "research"}}
    reads = []

    def labels_of(labels):
        return lambda: reads.append(1) or labels

    named = job(**{"spec.runtimeRef": {"name": "research"}})
    refused = resolve_offline(named, [research], labels_of({"team": "web"}))
    assert refused.reason == RUNTIME_NOT_ALLOWED and "may not be used in namespace team-a" in refused.missing
    assert "(team=research)" in refused.missing
    assert resolve_offline(named, [research], labels_of({"team": "research"})).snapshot["name"] == "research"
    # As the default: only where it matches; elsewhere a job has no runtime (and no limit) at all.
    assert resolve_offline(job(), [research], labels_of({"team": "web"})).snapshot is None
    assert resolve_offline(job(), [research], labels_of({"team": "research"})).snapshot["name"] == "research"
    # A runtime without a selector never makes anyone read the namespace.
    reads.clear()
    resolve_offline(named, [runtime("research")], labels_of({}))
    assert reads == []


def test_selector_requirements_mean_what_kubernetes_says():
    from pydantic import ValidationError

    from finetune_operator.api.selectors import LabelSelector, describe, matches

    sel = LabelSelector.model_validate({"matchExpressions": [
        {"key": "tier", "operator": "NotIn", "values": ["gold"]}, {"key": "legacy", "operator": "DoesNotExist"}]},
        by_alias=True)
    assert matches(sel, {}) and matches(sel, {"tier": "silver"}) and not matches(sel, {"tier": "gold"})
    assert not matches(sel, {"legacy": ""}) and describe(sel) == "tier notin (gold),!legacy"
    for bad in ({"key": "a", "operator": "In"}, {"key": "a", "operator": "Exists", "values": ["x"]}):
        with pytest.raises(ValidationError):
            LabelSelector.model_validate({"matchExpressions": [bad]}, by_alias=True)


def test_a_namespace_default_that_admission_could_not_check_exactly_is_refused():
    from finetune_operator.api.runtime_layers import layering_errors

    platform = runtime("platform", default=True, template={"distributed": {"gpusPerNode": 2}},
                       limits={"maxGpusPerJob": 8, "locked": ["pod.image"]})

    def team(template, limits=None):
        return runtime("team", kind="FineTuneRuntime", namespace="team-a", default=True, template=template,
                       limits=limits)

    assert layering_errors(platform, team({"runPolicy": {"activeDeadlineSeconds": 60}})) == []
    paths = {name: [e.path for e in layering_errors(platform, t)] for name, t in {
        "a locked image": team({"pod": {"image": "mine:1"}}),
        "a GPU shape split between the two": team({"distributed": {"numNodes": 2}}),
        "its own GPU limit without the cluster's shape": team({}, {"maxGpusPerJob": 4}),
        "a layered strategy it does not allow": team({}, {"allowedStrategies": ["fsdp"]}),
    }.items()}
    assert paths == {"a locked image": ["spec.template.pod.image"],
                     "a GPU shape split between the two": ["spec.template.distributed"],
                     "its own GPU limit without the cluster's shape": ["spec.template.distributed"],
                     "a layered strategy it does not allow": []}, paths
