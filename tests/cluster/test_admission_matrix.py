"""Every protected field x every way a tenant writes a FineTuneJob x every role, on the real API server with the
chart's admission policies: each case is refused with a message naming the field and the rule or right it lacks, or
admitted, and then the object the API server would store is shown harmless (within the limits its job started
with, run by a user who may do what it does).

The cases are generated (tests/support/admission_cases.py): each change of FIELD_CHANGES, applied to each running job
of BASES (a job under a runtime that lends a Secret, a job under the namespace's default, a job running as a
ServiceAccount with a Secret), sent by each path of PATHS, as each role of ROLES. What should happen is worked out
there, not written down: the runtime limits by the operator's own check (api/runtime_layers.py: the live runtimes
for a create, the recorded snapshot for an update), the schema by the operator's validation, the identity, NFS,
Secret and ConfigMap rules from the role's rights and api/job_rights.py, RBAC from the role. Everything is a
server-side dry run, so thousands of cases share one namespace and one set of jobs. The runtimes are tightened
after the jobs started: a create is judged against what they say now, an update against what the job recorded.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from finetune_operator.api.runtime_layers import resolve_offline
from finetune_operator.api.runtime_limits import parse_runtime
from finetune_operator.render.rbac import render_trainer_identity
from tests.cluster.test_tenancy import FTJ, bind, chart_objects, delete_all, wait_can
from tests.support.admission_cases import (
    CLAIM_VOLUME,
    FIELD_CHANGES,
    MUST_REFUSE,
    NAMESPACE_LABEL,
    NFS_VOLUME,
    PATHS,
    REASONS,
    ROLES,
    STARTED,
    TIGHTENED,
    Role,
    apply_list,
    bases,
    expected,
    lean,
    result,
    runtime,
    said,
    send,
    until,
)
from tests.support.tenant_api import TenantApi

pytestmark = pytest.mark.cluster
# --- the world ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(control_plane, kubectl):
    """One namespace: the chart's user roles and admission policies, three running jobs, five roles."""
    ns = "admission-matrix"
    kubectl.run("create", "namespace", ns)
    kubectl.run("label", "namespace", ns, *(f"{k}={v}" for k, v in NAMESPACE_LABEL.items()))
    docs = []
    for template in ("user-roles.yaml", "admission-policy-runtimes.yaml", "admission-policy-identity.yaml"):
        docs += chart_objects(control_plane, kubectl, template)
    try:
        apply_list(kubectl, *render_trainer_identity(ns, None))
        kubectl.run("create", "serviceaccount", "deployer", "-n", ns)
        kubectl.run("create", "rolebinding", "deployer-edit", "--clusterrole=edit", f"--serviceaccount={ns}:deployer",
                    "-n", ns)
        for secret in ("alice-token", "fiona-token", "platform-hf"):
            kubectl.run("create", "secret", "generic", secret, "--from-literal=token=t", "-n", ns)
        kubectl.run("create", "configmap", "team-settings", "--from-literal=a=b", "-n", ns)
        bind(kubectl, ns, "eddie", "edit")
        bind(kubectl, ns, "vera", "view")
        kubectl.run("create", "role", "ftj-only", "--verb=create,get,list,update,patch,delete", f"--resource={FTJ}",
                    "-n", ns)
        kubectl.run("create", "rolebinding", "ftj-only", "--role=ftj-only", "--user=fiona", "-n", ns)
        kubectl.run("create", "role", "fiona-token", "--verb=get", "--resource=secrets", "--resource-name=fiona-token",
                    "-n", ns)
        kubectl.run("create", "rolebinding", "fiona-token", "--role=fiona-token", "--user=fiona", "-n", ns)
        # A trainer's pod-bound token (as a trainer pod has) and a token of the same ServiceAccount bound to nothing.
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "under-a-runtime-a1-0-abcde", "namespace": ns},
               "spec": {"serviceAccountName": "finetunejob-trainer", "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox"}]}}
        apply_list(kubectl, pod)
        uid = kubectl.json("get", "pod", pod["metadata"]["name"], "-n", ns)["metadata"]["uid"]
        bound = kubectl.run("create", "token", "finetunejob-trainer", "-n", ns, "--bound-object-kind=Pod",
                            f"--bound-object-name={pod['metadata']['name']}", f"--bound-object-uid={uid}"
                            ).stdout.strip()
        unbound = kubectl.run("create", "token", "finetunejob-trainer", "-n", ns).stdout.strip()
        wait_can(kubectl, "eddie", ns, "create", FTJ)
        wait_can(kubectl, "vera", ns, "list", FTJ)
        apis = {"edit": TenantApi(control_plane.kubeconfig, user="eddie"),
                "finetunejob-only": TenantApi(control_plane.kubeconfig, user="fiona"),
                "view": TenantApi(control_plane.kubeconfig, user="vera"),
                "trainer-token": TenantApi(control_plane.kubeconfig, token=bound),
                "unbound-sa-token": TenantApi(control_plane.kubeconfig, token=unbound)}

        # The jobs start under the runtimes as they are; the operator's record of them is its own function's.
        apply_list(kubectl, *STARTED)
        stored = {}
        for name, job in bases(ns).items():
            apply_list(kubectl, job)
            resolved = resolve_offline(job, STARTED)
            assert not resolved.errors and resolved.snapshot is not None, (name, resolved)
            kubectl.run("patch", "ftj", name, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(
                {"status": {"phase": "Running", "attempt": 1, "runtime": resolved.snapshot}}))
            stored[name] = kubectl.json("get", "ftj", name, "-n", ns)
        apply_list(kubectl, *TIGHTENED)
        # In force: the tightened limit refuses a create (the policies have seen the params).
        probe = lean("probe", ns, runtimeRef={"name": "matrix-gpu-small"}, distributed={"numNodes": 2})
        until(lambda: "limits.maxGpusPerJob = 2" in apis["edit"].create(probe).message,
               "the tightened runtime never reached the admission policies")
        yield ns, apis, stored
    finally:
        delete_all(kubectl, docs)
        for doc in STARTED:
            kubectl.run("delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False)
        kubectl.run("delete", "namespace", ns, "--wait=false")


def cases() -> list[tuple[str, str, str, str]]:
    return [(field, change, base, path) for field, changes in FIELD_CHANGES.items() for change in changes
            for base in ("under-a-runtime", "under-the-default", "as-a-service-account") for path in PATHS]


def test_every_field_every_path_every_role_is_refused_naming_why_or_is_harmless(world):
    ns, apis, stored = world
    outcomes: dict[str, int] = {}
    failures: list[str] = []
    pinned: dict[tuple[str, str, str], set[str]] = {}
    lock = threading.Lock()

    def count(key: str) -> None:
        with lock:
            outcomes[key] = outcomes.get(key, 0) + 1

    def run(case: tuple[str, str, str, str], role: Role, index: int) -> None:
        field, change, base_name, path = case
        base = stored[base_name]
        snapshot = base["status"]["runtime"]
        wanted = FIELD_CHANGES[field][change](copy.deepcopy({k: base[k] for k in ("apiVersion", "kind", "metadata",
                                                                                   "spec")}))
        creating = path == "create"
        obj = result(base, wanted, path)
        if creating:
            obj = {**obj, "metadata": {**obj["metadata"], "name": f"new-{index}"}}
        why = expected(role, path, None if creating else base, obj, snapshot, TIGHTENED)
        answer = send(apis[role.name], path, base, wanted, f"new-{index}")
        if creating and base_name == "under-a-runtime" and change in MUST_REFUSE.get(field, ()) and role.writes:
            with lock:
                pinned[(role.name, field, change)] = set() if answer.admitted else why
        label = f"{role.name} / {path} / {base_name} / {field}: {change}"
        if not why:
            if not answer.admitted:
                failures.append(f"{label}: refused, expected admitted: {answer.status} {answer.message[:300]}")
                return
            # Shown harmless on the object the API server would store.
            stored_obj = answer.body
            again = expected(role, path, None if creating else base, stored_obj, snapshot, TIGHTENED)
            if again:
                failures.append(f"{label}: admitted, and the stored object breaks {again}")
            count("admitted (harmless)")
            return
        if answer.admitted:
            failures.append(f"{label}: admitted, expected refused for {sorted(why)}")
        elif not any(said(reason, answer, obj, None if creating else base, snapshot, TIGHTENED) for reason in why):
            failures.append(f"{label}: refused, but not saying {sorted(why)}: {answer.status} {answer.message[:400]}")
        else:
            count("refused: " + "/".join(sorted(why)))

    work = [(case, role, i) for i, (case, role) in enumerate((c, r) for c in cases() for r in ROLES)]
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda w: run(*w), work))
    elapsed = time.monotonic() - started
    print(f"\n{len(work)} cases in {elapsed:.1f} s: " + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
    assert not failures, f"{len(failures)} of {len(work)} cases:\n" + "\n".join(failures[:40])
    # Every reason was met somewhere (a matrix whose cases all pass for one reason proves little).
    seen = {r for key in outcomes for r in key.removeprefix("refused: ").split("/")}
    assert seen >= REASONS, outcomes
    assert outcomes.get("admitted (harmless)", 0) > 0
    # What may load no weights from elsewhere is refused by a limit or the schema, not merely as the operator's own
    # check (which the expectations come from) says.
    writers = [r.name for r in ROLES if r.writes]
    assert len(pinned) == len(writers) * sum(len(c) for c in MUST_REFUSE.values())
    assert {k: v for k, v in pinned.items() if not v & {"limits", "schema"}} == {}


# --- the runtimes themselves ----------------------------------------------------------------------------------------
TEMPLATES = {"nothing": {}, "2 nodes": {"distributed": {"numNodes": 2}}, "2 GPUs a node": {"distributed": {
    "gpusPerNode": 2}}, "fsdp": {"distributed": {"strategy": "fsdp"}}, "a long deadline": {"runPolicy": {
        "activeDeadlineSeconds": 999999}}, "a claim": {"pod": {"volumes": [CLAIM_VOLUME]}},
    "an image": {"pod": {"image": "registry.local/team:1"}}, "a queue": {"queueName": "team-q"},
    "an NFS export": {"pod": {"volumes": [NFS_VOLUME]}}}
LIMITS = {"none": {}, "4 GPUs": {"maxGpusPerJob": 4}, "1 node": {"maxNodes": 1}, "deepspeed only": {
    "allowedStrategies": ["deepspeed"]}, "a day": {"maxActiveDeadlineSeconds": 86400}, "team claims": {
        "allowedClaims": ["team-data"]}, "image locked": {"locked": ["pod.image", "queueName"]},
    "claims only": {"allowedVolumeKinds": ["persistentVolumeClaim"]}}


def test_a_runtime_whose_template_breaks_its_own_limits_is_refused_as_the_operator_says(world, kubectl):
    """Every template x every limit, both kinds, at `kubectl apply` (dry run as a cluster admin): refused exactly
    when the operator would call the runtime invalid (api/runtime.py), every broken limit in one message."""

    ns, apis, _ = world
    admin = TenantApi(apis["edit"].kubeconfig)
    checked = 0
    for (t_name, template), (l_name, limits) in ((t, lim) for t in TEMPLATES.items() for lim in LIMITS.items()):
        for kind in ("ClusterFineTuneRuntime", "FineTuneRuntime"):
            doc = {"apiVersion": "finetunejob.dev/v1alpha1", "kind": kind,
                   "metadata": {"name": "probe", **({"namespace": ns} if kind == "FineTuneRuntime" else {})},
                   "spec": {"template": template, "limits": limits}}
            plural = "finetuneruntimes" if kind == "FineTuneRuntime" else "clusterfinetuneruntimes"
            where = f"/apis/finetunejob.dev/v1alpha1/{f'namespaces/{ns}/' if kind == 'FineTuneRuntime' else ''}{plural}"
            answer = admin.request("POST", where, doc, query=TenantApi.DRY)
            _, errors = parse_runtime(doc)
            case = f"{kind} with {t_name} under {l_name}"
            assert answer.admitted == (not errors), (case, answer.message, errors)
            for error in errors:  # every broken limit, in one message
                limit = re.search(r"limits\.\w+", error.message)[0]
                assert f"breaks its own {limit}" in answer.message, (case, answer.message)
            checked += 1
    assert checked == 2 * len(TEMPLATES) * len(LIMITS)


LAYERED_CLUSTER = runtime("matrix-layered-platform", {"distributed": {"gpusPerNode": 2}},
                          {"maxGpusPerJob": 4, "maxActiveDeadlineSeconds": 86400, "locked": ["pod.image"]},
                          default=True, selector={"matchLabels": {"finetunejob.dev/layering": "yes"}})


@pytest.fixture(scope="module")
def layering_namespace(kubectl, world):
    ns = "admission-layering"
    kubectl.run("create", "namespace", ns)
    kubectl.run("label", "namespace", ns, "finetunejob.dev/layering=yes")
    apply_list(kubectl, LAYERED_CLUSTER)
    yield ns
    kubectl.run("delete", "clusterfinetuneruntime", LAYERED_CLUSTER["metadata"]["name"], "--ignore-not-found")
    kubectl.run("delete", "namespace", ns, "--wait=false")


def test_a_namespace_default_layered_over_the_cluster_default_is_refused_at_apply_when_invalid(
        kubectl, world, layering_namespace):
    """Every template x every limit of a namespace's default FineTuneRuntime, over a cluster default: refused exactly
    where api/runtime_layers.py layering_errors says (the layered template breaks either runtime's limits, sets a
    locked field, or splits the GPU shape so that the API server could not check a job's GPUs exactly)."""
    from finetune_operator.api.runtime_layers import layering_errors

    ns = layering_namespace
    admin = TenantApi(world[1]["edit"].kubeconfig)
    where = f"/apis/finetunejob.dev/v1alpha1/namespaces/{ns}/finetuneruntimes"

    def team(template: dict, limits: dict) -> dict:
        return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "FineTuneRuntime",
                "metadata": {"name": "team-default", "namespace": ns},
                "spec": {"default": True, "template": template, "limits": limits}}

    probe = team({"pod": {"image": "x:1"}}, {})
    until(lambda: not admin.request("POST", where, probe, query=TenantApi.DRY).admitted,
           "the cluster default never reached the layering policy")
    refused = 0
    for (t_name, template), (l_name, limits) in ((t, lim) for t in TEMPLATES.items() for lim in LIMITS.items()):
        doc = team(template, limits)
        answer = admin.request("POST", where, doc, query=TenantApi.DRY)
        errors = layering_errors(LAYERED_CLUSTER, doc)

        own = parse_runtime(doc)[1]  # its own template against its own limits: the other policy's
        case = f"a namespace default with {t_name} under {l_name}"
        assert answer.admitted == (not errors and not own), (case, answer.message, errors, own)
        refused += not answer.admitted
        if errors and not own:
            assert any(e.path in answer.message or re.search(r"limits\.\w+", e.message)[0] in answer.message
                       for e in errors), (case, answer.message, errors)
    assert 0 < refused < len(TEMPLATES) * len(LIMITS)


def test_under_an_admitted_namespace_default_the_api_server_judges_a_job_as_the_operator_does(
        kubectl, world, layering_namespace):
    """The issue: a job under a namespace default layered over the cluster default was admitted and failed ~10 s
    later as InvalidSpec. Every namespace default the layering policy admits x every shape and deadline of a job:
    the API server refuses exactly the jobs the operator would fail."""
    from finetune_operator.api.runtime_layers import layering_errors

    ns = layering_namespace
    edit = world[1]["edit"]
    bind(kubectl, ns, "eddie", "edit")
    wait_can(kubectl, "eddie", ns, "create", FTJ)
    shapes = [{}, {"numNodes": 2}, {"gpusPerNode": 1}, {"gpusPerNode": 4}, {"numNodes": 2, "gpusPerNode": 1},
              {"numNodes": 3, "gpusPerNode": 2}]
    deadlines = [None, 3600, 999999]
    teams = [({}, {}), ({"runPolicy": {"activeDeadlineSeconds": 7200}}, {}), ({}, {"maxNodes": 1}),
             ({"runPolicy": {"activeDeadlineSeconds": 3600}}, {"maxActiveDeadlineSeconds": 7200}),
             ({"distributed": {"strategy": "fsdp"}}, {"allowedStrategies": ["fsdp"]})]
    # Each namespace default locks a field of its own: a job setting it is refused once the policies see that
    # default, and admitted once they no longer see the one before.
    markers = [("nodeSelector", {"a": "b"}), ("tolerations", [{"key": "x", "operator": "Exists"}]),
               ("priorityClassName", "high"), ("env", [{"name": "A", "value": "b"}]),
               ("affinity", {"nodeAffinity": {}})]

    def marked(i: int) -> dict:
        field, value = markers[i]
        return lean(f"marker-{i}", ns, pod={field: value})

    compared = 0
    for i, (template, limits) in enumerate(teams):
        team = {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "FineTuneRuntime",
                "metadata": {"name": f"team-default-{i}", "namespace": ns},
                "spec": {"default": True, "template": template,
                         "limits": {**limits, "locked": [f"pod.{markers[i][0]}"]}}}
        assert not layering_errors(LAYERED_CLUSTER, team), team  # admitted: the ones this test is about
        apply_list(kubectl, team)
        try:
            until(lambda i=i: not edit.create(marked(i)).admitted and (i == 0 or edit.create(marked(i - 1)).admitted),
                   "the namespace default never reached the policies")
            for shape, deadline in ((s, d) for s in shapes for d in deadlines):
                job = lean(f"j-{compared}", ns, distributed=shape) if shape else lean(f"j-{compared}", ns)
                if deadline is None:
                    job["spec"].pop("runPolicy")
                else:
                    job["spec"]["runPolicy"] = {"activeDeadlineSeconds": deadline}
                operator_says = resolve_offline(job, [LAYERED_CLUSTER, team],
                                                lambda: {"finetunejob.dev/layering": "yes"})
                answer = edit.create(job)
                case = (template, limits, shape, deadline)
                if operator_says.errors:
                    assert not answer.admitted, (case, operator_says.errors)
                elif not answer.admitted:
                    # The one refusal the operator would not make: the cluster default requires a deadline and only
                    # the namespace default sets one; the job must say it (docs/concepts/runtimes.md).
                    assert deadline is None and "activeDeadlineSeconds is unset" in answer.message, (
                        case, answer.message)
                compared += 1
        finally:
            kubectl.run("delete", "finetuneruntime", team["metadata"]["name"], "-n", ns, "--ignore-not-found")
    assert compared == len(teams) * len(shapes) * len(deadlines)


SELECTORS = [{}, {"matchLabels": {"team": "a"}}, {"matchLabels": {"team": "a", "tier": "gold"}},
             {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
             {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]},
             {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
             {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
             {"matchLabels": {"team": "b"}, "matchExpressions": [{"key": "tier", "operator": "NotIn",
                                                                  "values": ["gold"]}]}]
NAMESPACE_LABELS = [{}, {"team": "a"}, {"team": "a", "tier": "gold"}, {"team": "b", "tier": "silver"}]


def test_a_cluster_runtimes_namespace_selector_means_at_apply_what_it_means_to_the_operator(kubectl, world):
    """Every selector x every namespace's labels: a job naming the runtime is refused at apply exactly where the
    operator's selector (api/selectors.py, metav1.LabelSelector's meaning) does not match."""
    from finetune_operator.api.runtime_layers import allowed_in

    edit = world[1]["edit"]
    namespaces = [f"admission-selector-{i}" for i in range(len(NAMESPACE_LABELS))]
    runtimes = [runtime(f"matrix-selector-{i}", {}, {}, selector=s) for i, s in enumerate(SELECTORS)]
    try:
        for ns, labels in zip(namespaces, NAMESPACE_LABELS, strict=True):
            kubectl.run("create", "namespace", ns)
            if labels:
                kubectl.run("label", "namespace", ns, *(f"{k}={v}" for k, v in labels.items()))
            bind(kubectl, ns, "eddie", "edit")
        apply_list(kubectl, *runtimes)
        for ns in namespaces:
            wait_can(kubectl, "eddie", ns, "create", FTJ)
        last = lean("probe", namespaces[0], runtimeRef={"name": runtimes[-1]["metadata"]["name"]})
        until(lambda: not edit.create(last).admitted, "the runtimes never reached the admission policies")
        for (ns, labels), rt in ((n, r) for n in zip(namespaces, NAMESPACE_LABELS, strict=True) for r in runtimes):
            full = {**labels, "kubernetes.io/metadata.name": ns}
            allowed = allowed_in(rt, ns, lambda: full) is None  # noqa: B023 (called at once)
            answer = edit.create(lean("probe", ns, runtimeRef={"name": rt["metadata"]["name"]}))
            assert answer.admitted == allowed, (rt["spec"].get("namespaceSelector"), labels, answer.message)
            if not allowed:
                assert f"ClusterFineTuneRuntime {rt['metadata']['name']} may not be used in namespace {ns}" in \
                    answer.message
    finally:
        for rt in runtimes:
            kubectl.run("delete", "clusterfinetuneruntime", rt["metadata"]["name"], "--ignore-not-found")
        for ns in namespaces:
            kubectl.run("delete", "namespace", ns, "--wait=false")
