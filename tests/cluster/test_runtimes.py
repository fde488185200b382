"""Runtimes on the real API server, used as tenants use them (`kubectl --as`, the built-in edit role): a job with
a runtimeRef and just its model, data and method runs with the runtime's image, topology and queue; each limit is
refused at `kubectl apply` by the chart's admission policies (the operator is not involved) with one message naming
the runtime, the limit and the value, as `finetune validate --runtime` says offline; editing or deleting a runtime
never changes a job that started; the namespace default is layered over the cluster default."""

import contextlib
import json
import time

import pytest

from finetune_operator.api import constants as c
from finetune_operator.api.runtime_layers import resolve_offline
from tests.builders import make_job
from tests.cluster.test_faults import FAIL_ATTEMPTS, FAIL_EXIT_CODE
from tests.cluster.test_operator import attempt_pods
from tests.cluster.test_tenancy import FTJ, as_tenant, bind, chart_objects, delete_all, wait_can
from tests.support.job_status import wait_status

pytestmark = pytest.mark.cluster
TENANT = "runtime-tenant"


@pytest.fixture(scope="module")
def policies(control_plane, kubectl):
    """The chart's user roles and its runtime admission policies, as `helm install` renders them."""
    docs = chart_objects(control_plane, kubectl, "user-roles.yaml")
    docs += chart_objects(control_plane, kubectl, "admission-policy-runtimes.yaml")
    yield docs
    delete_all(kubectl, docs)


@pytest.fixture
def tenant(kubectl, policies, namespace):
    bind(kubectl, namespace, TENANT, "edit")
    wait_can(kubectl, TENANT, namespace, "create", FTJ)
    return namespace


@contextlib.contextmanager
def runtimes(kubectl, *docs):
    """Runtimes for one test; gone after it (a cluster default left behind would change every later job)."""
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))
    try:
        yield
    finally:
        for doc in docs:
            where = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
            kubectl.run("delete", doc["kind"], doc["metadata"]["name"], *where, "--ignore-not-found", check=False)


def runtime(name, kind="ClusterFineTuneRuntime", default=False, template=None, limits=None, namespace=None):
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": kind, "metadata": meta,
            "spec": {"default": default, "template": template or {}, "limits": limits or {}}}


def lean_job(name, namespace, **spec):
    """What a data scientist writes: model, data, method (and training); the rest from the runtime."""
    doc = make_job({"metadata.name": name, "metadata.namespace": namespace})
    for section in ("distributed", "resources", "pod"):
        doc["spec"].pop(section, None)
    doc["spec"].update(spec)
    return doc


CPU = {"pod": {"image": "registry.local/trainer:r1"}, "distributed": {"gpusPerNode": 0, "numNodes": 2},
       "resources": {"cpu": "1", "memory": "1Gi"}}


def attempt_image(kubectl, ns, name):
    job = kubectl.json("get", "job", f"{name}-a1", "-n", ns)
    return job["spec"]["template"]["spec"]["containers"][0]["image"], job["spec"]["parallelism"]


def test_a_tenants_lean_job_runs_with_the_runtime_which_later_edits_and_deletion_never_change(
        kubectl, operator, tenant):
    ns = tenant
    with runtimes(kubectl, runtime("cpu-pool", template=CPU, limits={"maxNodes": 2})):
        as_tenant(kubectl, TENANT, "apply", "-f", "-",
                  input=json.dumps(lean_job("first", ns, runtimeRef={"name": "cpu-pool"})))
        st = wait_status(kubectl, ns, "first", lambda s: s.get("phase") == "Running", operator, timeout=90)
        assert (st["runtime"]["name"], st["runtime"]["generation"]) == ("cpu-pool", 1)
        assert attempt_image(kubectl, ns, "first") == ("registry.local/trainer:r1", 2)
        wide = kubectl.run("get", "ftj", "first", "-n", ns, "-o", "wide").stdout
        assert "RUNTIME" in wide.splitlines()[0] and "cpu-pool" in wide.splitlines()[1], wide

        # Edited under the running job: nothing of the job changes; the next job gets the edit.
        edited = runtime("cpu-pool", template={**CPU, "pod": {"image": "registry.local/trainer:r2"}},
                         limits={"maxNodes": 2})
        kubectl.run("apply", "-f", "-", input=json.dumps(edited))
        as_tenant(kubectl, TENANT, "apply", "-f", "-",
                  input=json.dumps(lean_job("second", ns, runtimeRef={"name": "cpu-pool"})))
        st2 = wait_status(kubectl, ns, "second", lambda s: s.get("phase") == "Running", operator, timeout=90)
        assert st2["runtime"]["generation"] == 2 and st2["runtime"]["digest"] != st["runtime"]["digest"]
        assert attempt_image(kubectl, ns, "second")[0] == "registry.local/trainer:r2"
        # A gang restart of the first job (a pod fails, as a kwok Stage makes it): the new attempt still runs the
        # template recorded when the job started.
        (pod0,) = [p for p in attempt_pods(kubectl, ns, "first", 1)
                   if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0"]
        kubectl.run("annotate", "pod", pod0["metadata"]["name"], "-n", ns, f"{FAIL_ATTEMPTS}=1",
                    f"{FAIL_EXIT_CODE}=137")
        restarted = wait_status(kubectl, ns, "first", lambda s: s.get("attempt") == 2 and s.get("phase") == "Running",
                                operator, timeout=120)
        assert restarted["runtime"] == st["runtime"]
        job = kubectl.json("get", "job", "first-a2", "-n", ns)
        assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/trainer:r1"

    # Deleted: the running jobs run on; a new one waits, saying what is missing.
    assert (kubectl.json("get", "ftj", "first", "-n", ns)["status"]["phase"]) == "Running"
    as_tenant(kubectl, TENANT, "apply", "-f", "-",
              input=json.dumps(lean_job("third", ns, runtimeRef={"name": "cpu-pool"})))
    st3 = wait_status(kubectl, ns, "third", lambda s: s.get("reason") == "RuntimeNotFound", operator)
    assert st3["phase"] == "Pending" and "ClusterFineTuneRuntime cpu-pool, which does not exist" in st3["message"]
    assert kubectl.run("get", "job", "third-a1", "-n", ns, check=False).returncode != 0


CAPPED = runtime("capped", template={"pod": {"image": "registry.local/trainer:capped"},
                                     "distributed": {"gpusPerNode": 8, "strategy": "deepspeed"}},
                 limits={"locked": ["pod.image"], "maxNodes": 2, "maxGpusPerJob": 8, "allowedMethods": ["lora"],
                         "allowedStrategies": ["deepspeed"], "allowedModelSources": ["/models/"],
                         "allowedDataSources": ["/data/"], "allowedClaims": ["team-data"],
                         "maxActiveDeadlineSeconds": 86400})
WITHIN = {"runtimeRef": {"name": "capped"}, "runPolicy": {"activeDeadlineSeconds": 3600}}
BREAKING = {
    "pod.image": ({"pod": {"image": "mine:1"}}, "spec.pod.image: the trainer image is locked by "
                  "ClusterFineTuneRuntime capped (limits.locked)"),
    "maxNodes": ({"distributed": {"numNodes": 3, "gpusPerNode": 1}},
                 "spec.distributed.numNodes is 3: ClusterFineTuneRuntime capped allows limits.maxNodes = 2"),
    "maxGpusPerJob": ({"distributed": {"numNodes": 2}}, "spec.distributed asks for 2 nodes x 8 GPUs = 16: "
                      "ClusterFineTuneRuntime capped allows limits.maxGpusPerJob = 8"),
    "allowedMethods": ({"method": {"type": "full"}}, "spec.method.type is full: ClusterFineTuneRuntime capped "
                       "allows limits.allowedMethods lora"),
    "allowedStrategies": ({"distributed": {"strategy": "fsdp"}}, "spec.distributed.strategy is fsdp: "
                          "ClusterFineTuneRuntime capped allows limits.allowedStrategies deepspeed"),
    "allowedModelSources": ({"model": {"name": "someone/else-7b"}}, "spec.model.name is someone/else-7b: "
                            "ClusterFineTuneRuntime capped allows limits.allowedModelSources /models/"),
    "allowedDataSources": ({"data": {"format": "alpaca", "train": [{"path": "/data/ok.jsonl"},
                                                                    {"path": "/tmp/theirs.jsonl"}]}},
                           "spec.data uses /tmp/theirs.jsonl: ClusterFineTuneRuntime capped allows "
                           "limits.allowedDataSources /data/"),
    "allowedClaims": ({"pod": {"volumes": [{"name": "d", "mountPath": "/data", "claimName": "team-data"},
                                           {"name": "x", "mountPath": "/x", "claimName": "theirs"}]}},
                      "spec mounts the claim(s) theirs: ClusterFineTuneRuntime capped allows limits.allowedClaims "
                      "team-data"),
    "maxActiveDeadlineSeconds": ({"runPolicy": {"activeDeadlineSeconds": 999999}},
                                 "spec.runPolicy.activeDeadlineSeconds is 999999: ClusterFineTuneRuntime capped "
                                 "allows limits.maxActiveDeadlineSeconds = 86400"),
}


def test_each_limit_is_refused_at_apply_by_the_api_server_as_finetune_validate_says(kubectl, tenant):
    """No operator runs here: the refusal is the API server's own admission."""
    ns = tenant
    with runtimes(kubectl, CAPPED):
        ok = lean_job("within", ns, **WITHIN)
        ok["spec"]["model"]["name"] = "/models/tiny"
        ok["spec"]["data"]["train"] = [{"path": "/data/train.jsonl"}]
        as_tenant(kubectl, TENANT, "apply", "--dry-run=server", "-f", "-", input=json.dumps(ok))

        def breaking(change: dict) -> dict:
            doc = json.loads(json.dumps(ok))
            for section, value in change.items():
                doc["spec"][section] = {**doc["spec"].get(section, {}), **value} if section != "data" else {
                    **doc["spec"]["data"], **value}
            return doc

        # The runtime reaches the policies' params through the API server's informer, seconds later on a busy
        # machine (until then no param: admitted).
        deadline = time.monotonic() + 60
        while as_tenant(kubectl, TENANT, "apply", "--dry-run=server", "-f", "-", check=False,
                        input=json.dumps(breaking(BREAKING["maxNodes"][0]))).returncode == 0:
            assert time.monotonic() < deadline, "the runtime never reached the admission policies"
            time.sleep(0.5)
        for limit, (change, said) in BREAKING.items():
            doc = breaking(change)
            refused = as_tenant(kubectl, TENANT, "apply", "--dry-run=server", "-f", "-", input=json.dumps(doc),
                                check=False)
            assert refused.returncode != 0 and said in refused.stderr, (limit, refused.stderr)
            assert "-cluster-runtime-limits" in refused.stderr  # the policy, named for the admin
            offline = resolve_offline(doc, [CAPPED])
            assert any(limit in e.message or limit.split(".")[-1] in e.path for e in offline.errors), (
                limit, offline.errors)


def test_the_namespace_default_is_layered_over_the_cluster_default(kubectl, operator, tenant):
    ns = tenant
    platform = runtime("platform-default", default=True, template={
        "pod": {"image": "registry.local/trainer:platform"}, "distributed": {"gpusPerNode": 0},
        "resources": {"cpu": "1", "memory": "1Gi"}}, limits={"maxNodes": 4})
    team = runtime("team-default", kind="FineTuneRuntime", namespace=ns, default=True,
                   template={"distributed": {"numNodes": 2}})
    with runtimes(kubectl, platform, team):
        as_tenant(kubectl, TENANT, "apply", "-f", "-", input=json.dumps(lean_job("layered", ns)))
        st = wait_status(kubectl, ns, "layered", lambda s: s.get("phase") == "Running", operator, timeout=90)
        assert [(x["kind"], x["name"]) for x in st["runtime"]["layers"]] == [
            ("ClusterFineTuneRuntime", "platform-default"), ("FineTuneRuntime", "team-default")]
        assert attempt_image(kubectl, ns, "layered") == ("registry.local/trainer:platform", 2)
        # The cluster default's limit holds for the team's jobs too, at apply.
        too_many = lean_job("too-many", ns, distributed={"numNodes": 5})
        refused = as_tenant(kubectl, TENANT, "apply", "-f", "-", input=json.dumps(too_many), check=False)
        assert refused.returncode != 0 and "ClusterFineTuneRuntime platform-default allows limits.maxNodes = 4" \
            in refused.stderr, refused.stderr


def test_kubectl_explain_documents_runtimes_and_the_merge_order(kubectl):
    limits = kubectl.run("explain", "clusterfinetuneruntime.spec.limits").stdout
    assert "maxGpusPerJob" in limits and "locked" in limits
    ref = kubectl.run("explain", "finetunejob.spec.runtimeRef").stdout
    assert "runtime template < this spec" in " ".join(ref.split()), ref
    assert "finetuneruntimes" in kubectl.run("api-resources", "--api-group=finetunejob.dev").stdout


EVIL = "docker.io/evil/miner:latest"
SMALL = runtime("gpu-small", template={"pod": {"image": "registry.local/trainer:small"},
                                       "distributed": {"gpusPerNode": 2}},
                limits={"locked": ["pod.image"], "maxGpusPerJob": 4})


def test_no_update_gets_a_running_job_around_its_limits_and_a_tightened_runtime_locks_no_one_out(
        kubectl, operator, tenant):
    """The issue's patch (runtimeRef removed, 3 nodes x 8 GPUs, another image, in one JSON patch) is refused, with
    or without the runtimeRef part; after the admin tightens the runtime, the tenant still suspends, edits within the
    limits the job started with, and resumes: attempt 2 runs that edit with the recorded template."""
    ns = tenant
    with runtimes(kubectl, SMALL):
        as_tenant(kubectl, TENANT, "apply", "-f", "-",
                  input=json.dumps(lean_job("small", ns, runtimeRef={"name": "gpu-small"})))
        st = wait_status(kubectl, ns, "small", lambda s: s.get("phase") == "Running", operator, timeout=90)
        bypass = [{"op": "remove", "path": "/spec/runtimeRef"},
                  {"op": "add", "path": "/spec/distributed", "value": {"numNodes": 3, "gpusPerNode": 8}},
                  {"op": "add", "path": "/spec/pod", "value": {"image": EVIL}}]
        for patch, said in ((bypass, ["spec.runtimeRef is immutable"]),
                            (bypass[1:], ["3 nodes x 8 GPUs = 24: ClusterFineTuneRuntime gpu-small as recorded when "
                                          "the job started allows limits.maxGpusPerJob = 4",
                                          "spec.pod.image: the trainer image is locked"])):
            refused = as_tenant(kubectl, TENANT, "patch", "ftj", "small", "-n", ns, "--type=json", "-p",
                                json.dumps(patch), check=False)
            assert refused.returncode != 0 and all(s in refused.stderr for s in said), refused.stderr

        # Tightened: a new job may have 2 GPUs, this one (recorded: 4) goes on to ask for 2 nodes x 2.
        tightened = runtime("gpu-small", template=SMALL["spec"]["template"],
                            limits={"locked": ["pod.image"], "maxGpusPerJob": 2})
        kubectl.run("apply", "-f", "-", input=json.dumps(tightened))
        probe = lean_job("probe", ns, runtimeRef={"name": "gpu-small"}, distributed={"numNodes": 2})
        deadline = time.monotonic() + 30  # the admission policies see the edit shortly after
        while "limits.maxGpusPerJob = 2" not in as_tenant(kubectl, TENANT, "apply", "--dry-run=server", "-f", "-",
                                                          input=json.dumps(probe), check=False).stderr:
            assert time.monotonic() < deadline, "the tightened runtime never reached admission"
            time.sleep(0.5)
        for patch in ({"spec": {"suspend": True}}, {"spec": {"distributed": {"numNodes": 2},
                                                             "runPolicy": {"backoffLimit": 2}}}):
            as_tenant(kubectl, TENANT, "patch", "ftj", "small", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        wait_status(kubectl, ns, "small", lambda s: s.get("phase") == "Suspended", operator, timeout=60)
        as_tenant(kubectl, TENANT, "patch", "ftj", "small", "-n", ns, "--type=merge", "-p",
                  '{"spec": {"suspend": false}}')
        resumed = wait_status(kubectl, ns, "small", lambda s: s.get("attempt") == 2 and s.get("phase") == "Running",
                              operator, timeout=90)
        assert resumed["runtime"] == st["runtime"]  # generation 1, maxGpusPerJob 4, as recorded
        job = kubectl.json("get", "job", "small-a2", "-n", ns)
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert (job["spec"]["parallelism"], container["image"], container["resources"]["limits"]["nvidia.com/gpu"]) \
            == (2, "registry.local/trainer:small", "2")


def test_a_job_started_before_any_default_runs_on_but_is_judged_by_it_once_edited(kubectl, operator, tenant):
    """fiona's 1-GPU job starts in a namespace no runtime covers; then the admin adds a default allowing 1 GPU. Her
    job runs on (a default added later caps nothing that runs), she may still suspend it and change its runPolicy;
    an edit of what it runs is judged by that default on every write path (her 2 x 4 GPUs refused as a new job's
    would be), and an edit within it starts the job anew under the default, recorded at its next attempt."""
    ns = tenant
    as_tenant(kubectl, TENANT, "apply", "-f", "-", input=json.dumps(make_job({
        "metadata.name": "fiona", "metadata.namespace": ns, "spec.distributed": {"numNodes": 1, "gpusPerNode": 1},
        "spec.training.precision": "bf16"})))
    # gina's 2-GPU job too: over the default to come, which only an edit of what it runs may bring to bear.
    as_tenant(kubectl, TENANT, "apply", "-f", "-", input=json.dumps(make_job({
        "metadata.name": "gina", "metadata.namespace": ns, "spec.distributed": {"numNodes": 1, "gpusPerNode": 2}})))
    st = wait_status(kubectl, ns, "fiona", lambda s: s.get("phase") == "Running", operator, timeout=90)
    assert "runtime" not in st and st.get("startedSpecDigest")  # what it runs, recorded as it started
    wait_status(kubectl, ns, "gina", lambda s: s.get("phase") == "Running" and s.get("startedSpecDigest"), operator,
                timeout=90)
    one_gpu = runtime("team-default", kind="FineTuneRuntime", namespace=ns, default=True,
                      limits={"maxGpusPerJob": 1})
    with runtimes(kubectl, one_gpu):
        probe = make_job({"metadata.name": "probe", "metadata.namespace": ns,
                          "spec.distributed": {"numNodes": 2, "gpusPerNode": 4}})
        deadline = time.monotonic() + 30  # the admission policies see the new default shortly after
        while "limits.maxGpusPerJob = 1" not in as_tenant(kubectl, TENANT, "apply", "--dry-run=server", "-f", "-",
                                                          input=json.dumps(probe), check=False).stderr:
            assert time.monotonic() < deadline, "the default never reached admission"
            time.sleep(0.5)
        # A Kueue label (queue, priority, time limit) reaches gina's next attempt: changing one is an edit of what
        # she runs, judged by the default, by `kubectl label` and by a patch of the labels alike.
        for label in c.KUEUE_JOB_LABELS:
            for how in (("label", "ftj", "gina", "-n", ns, f"{label}=86400"),
                        ("patch", "ftj", "gina", "-n", ns, "--type=merge", "-p",
                         json.dumps({"metadata": {"labels": {label: "86400"}}}))):
                refused = as_tenant(kubectl, TENANT, *how, check=False)
                assert refused.returncode != 0 and "limits.maxGpusPerJob = 1" in refused.stderr, (label, how,
                                                                                                  refused.stderr)
        as_tenant(kubectl, TENANT, "label", "ftj", "gina", "-n", ns, "team=vision")  # not what it runs: allowed
        for patch in ({"spec": {"suspend": True}}, {"spec": {"runPolicy": {"backoffLimit": 4}}}):
            as_tenant(kubectl, TENANT, "patch", "ftj", "fiona", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        wait_status(kubectl, ns, "fiona", lambda s: s.get("phase") == "Suspended", operator, timeout=60)
        bigger = {"numNodes": 2, "gpusPerNode": 4}
        stored = kubectl.json("get", "ftj", "fiona", "-n", ns)
        whole = {"apiVersion": stored["apiVersion"], "kind": stored["kind"],
                 "metadata": {"name": "fiona", "namespace": ns},
                 "spec": {**stored["spec"], "distributed": {**stored["spec"]["distributed"], **bigger},
                          "suspend": False}}
        paths = {
            "merge patch": ("patch", "ftj", "fiona", "-n", ns, "--type=merge", "-p",
                            json.dumps({"spec": {"distributed": bigger, "suspend": False}})),
            "JSON patch": ("patch", "ftj", "fiona", "-n", ns, "--type=json", "-p", json.dumps(
                [{"op": "replace", "path": "/spec/distributed/gpusPerNode", "value": 4}])),
            "server-side apply": ("apply", "--server-side", "--force-conflicts", "-f", "-"),
            "replace": ("replace", "-f", "-"),
        }
        for how, args in paths.items():
            # An unconditional replace (no resourceVersion): the operator's status writes move it on meanwhile.
            unconditional = {**stored, "metadata": {k: v for k, v in stored["metadata"].items()
                                                    if k != "resourceVersion"}, "spec": whole["spec"]}
            body = json.dumps(whole if how == "server-side apply" else unconditional) if args[-1] == "-" else None
            refused = as_tenant(kubectl, TENANT, *args, input=body, check=False)
            assert refused.returncode != 0 and "FineTuneRuntime team-default allows limits.maxGpusPerJob = 1" \
                in refused.stderr, (how, refused.stderr)
        as_tenant(kubectl, TENANT, "patch", "ftj", "fiona", "-n", ns, "--type=merge", "-p",
                  json.dumps({"spec": {"training": {"learningRate": 0.00037}, "suspend": False}}))
        resumed = wait_status(kubectl, ns, "fiona", lambda s: s.get("attempt") == 2 and s.get("runtime"), operator,
                              timeout=90)
        assert [(x["kind"], x["name"]) for x in resumed["runtime"]["layers"]] == [("FineTuneRuntime", "team-default")]
