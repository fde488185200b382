"""The Helm chart: lint, template, install into the real apiserver, and least privilege checked by the apiserver
itself (SubjectAccessReview through `kubectl auth can-i`), with the operator running under the chart's identity."""

import json
import ssl
import subprocess
import time
from types import SimpleNamespace

import pytest
import yaml

from finetune_operator.api import constants as c
from tests.builders import make_job
from tests.conftest import ROOT
from tests.support.operator_process import OperatorProcess
from tests.support.pod_status import terminated
from tests.support.status_requests import status_request

CHART = ROOT / "charts" / "finetunejob"
RELEASE, SYSTEM_NS = "ftj", "finetunejob-system"
OPERATOR_SA = f"system:serviceaccount:{SYSTEM_NS}:{RELEASE}-operator"


@pytest.fixture(scope="module")
def helm(control_plane, kubectl):
    binary = control_plane.bin_dir / "helm"

    def run(*args, check=True):
        proc = subprocess.run([str(binary), *args], env=kubectl.env, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}")
        return proc
    return run


@pytest.fixture(scope="module")
def installed(helm, kubectl):
    proc = helm("install", RELEASE, str(CHART), "--namespace", SYSTEM_NS, "--create-namespace", "--wait=false")
    yield proc.stdout
    helm("uninstall", RELEASE, "--namespace", SYSTEM_NS, check=False)


def test_lint_and_template(helm):
    assert "0 chart(s) failed" in helm("lint", str(CHART)).stdout
    docs = [d for d in yaml.safe_load_all(helm("template", RELEASE, str(CHART), "--kube-version", "1.36.0").stdout)
            if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole"] * 7 + ["ClusterRoleBinding"] * 4 + [
        "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount"] + [
        "ValidatingAdmissionPolicy"] * 14 + ["ValidatingAdmissionPolicyBinding"] * 14
    # Three of them are users' rights, gathered into the built-in admin/edit/view roles (no binding of their own).
    users = [d for d in docs if d["kind"] == "ClusterRole" and any(
        k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in d["metadata"]["labels"])]
    assert sorted(r["metadata"]["name"] for r in users) == ["ftj-operator-user-admin", "ftj-operator-user-edit",
                                                            "ftj-operator-user-view"]
    per_ns = helm("template", RELEASE, str(CHART), "--kube-version", "1.36.0",
                  "--set", "watchNamespaces={team-a,team-b}").stdout
    roles = [d for d in yaml.safe_load_all(per_ns) if d and d["kind"] == "Role"
             and not d["metadata"]["name"].endswith("-leader-election")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    # The only cluster-wide rights left with watchNamespaces, all reads: namespaces and CRDs (kopf follows them),
    # the cluster's runtimes (cluster-scoped) and namespaces' labels (which runtimes they may use), and listing
    # nodes (nodeShapeCheck, which can go too).
    cluster_roles = [d for d in yaml.safe_load_all(per_ns) if d and d["kind"] == "ClusterRole"
                     and not d["metadata"]["name"].endswith(("-user-edit", "-user-view", "-user-admin",
                                                             "-runtime-reader"))]
    read = ["get", "list", "watch"]
    assert [r["rules"] for r in cluster_roles] == [
        [{"apiGroups": [""], "resources": ["namespaces"], "verbs": read},
         {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": read}],
        [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
        [{"apiGroups": ["finetunejob.dev"], "resources": ["clusterfinetuneruntimes"], "verbs": ["get", "list"]},
         {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]]
    strict = helm("template", RELEASE, str(CHART), "--kube-version", "1.36.0", "--set", "watchNamespaces={team-a}",
                  "--set", "nodeShapeCheck=false", "--set", "userRoles.aggregate=false",
                  "--set", "runtimes.readableByAllUsers=false").stdout
    assert sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(strict)
                  if d and d["kind"].startswith("Cluster")) == [
        ("ClusterRole", "ftj-operator-discovery"), ("ClusterRole", "ftj-operator-runtimes"),
        ("ClusterRoleBinding", "ftj-operator-discovery"), ("ClusterRoleBinding", "ftj-operator-runtimes")]


def test_the_runtime_catalogue_is_what_the_examples_run_on(helm):
    """examples/runtimes/catalogue.yaml is the chart's catalogue with every entry on (the model presets beside it
    are validated against it by the unit tests)."""
    docs = template(helm, "runtimes.catalogue.cpuSmall.enabled=true", "runtimes.catalogue.gpu1x.enabled=true",
                    "runtimes.catalogue.gpu8x.enabled=true")
    rendered = [d for d in docs if d["kind"] == "ClusterFineTuneRuntime"]
    committed = [d for d in yaml.safe_load_all((ROOT / "examples" / "runtimes" / "catalogue.yaml").read_text()) if d]
    for doc in rendered:
        doc["metadata"]["labels"] = {k: v for k, v in doc["metadata"]["labels"].items()
                                     if k in committed[0]["metadata"]["labels"]}
    assert [d["metadata"]["name"] for d in rendered] == ["cpu-small", "gpu-1x", "gpu-8x"]
    assert rendered == committed
    assert not [d for d in template(helm) if d["kind"] == "ClusterFineTuneRuntime"]  # off unless asked
    off = template(helm, "runtimes.limitsAtAdmission=false")
    assert not [d for d in off if d["kind"] == "ValidatingAdmissionPolicy" and "runtime" in d["metadata"]["name"]]


def test_two_replicas_one_leader_by_default(helm):
    """Two replicas with leader election, spread over nodes, a PodDisruptionBudget, a rolling update that starts the
    new pod first; the Lease right limited to the release namespace and (for get/update) to its one name."""
    docs = template(helm)
    deployment = kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert "--leader-elect" in container["args"] and f"--lease-name={RELEASE}-operator" in container["args"]
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e} == {
        "POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert kind(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    role = kind(docs, "Role")
    assert role["metadata"]["namespace"] == SYSTEM_NS
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [f"{RELEASE}-operator"],
         "verbs": ["get", "update"]}]
    single = template(helm, "replicas=1", "leaderElection.enabled=false")
    assert kind(single, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert not [d for d in single if d["kind"] in ("PodDisruptionBudget", "Role")]
    assert "affinity" not in kind(single, "Deployment")["spec"]["template"]["spec"]
    refused = helm("template", RELEASE, str(CHART), "--kube-version", "1.36.0", "--set",
                   "leaderElection.enabled=false", check=False)
    assert refused.returncode != 0 and "replicas > 1 needs leaderElection.enabled" in refused.stderr


def test_security_options_a_review_asks_for(helm):
    """On by default: NetworkPolicies (the operator's ingress only on its metrics port; each gang's pods only from
    their own gang, rendered by the operator); images by digest; a readiness probe always."""
    digest = "sha256:" + "a" * 64
    docs = template(helm, f"image.digest={digest}", "trainerImage=registry.local/trainer@" + digest)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == [
        {"ports": [{"port": 8080, "protocol": "TCP"}]}]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/finetunejob/operator@{digest}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FINETUNE_NETWORK_POLICY"] == "true" and env["FINETUNE_TRAINER_IMAGE"].endswith("@" + digest)
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    assert any("networkpolicies" in r["resources"] for r in rules)
    # Kueue's Workloads (its CRDs may be absent, so this is read off the rules rather than asked of the apiserver):
    # read, and patched to deactivate one; nothing of Kueue's own configuration.
    kueue = [r for r in rules if "kueue.x-k8s.io" in r["apiGroups"]]
    assert kueue == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
                      "verbs": ["get", "list", "watch", "patch"]}]
    off = template(helm, "networkPolicy.enabled=false")
    assert not [d for d in off if d["kind"] == "NetworkPolicy"]
    assert not [r for d in off if d["kind"] == "ClusterRole" for r in d["rules"] if "networkpolicies" in
                r["resources"]]


def test_values_schema_rejects_bad_values(helm):
    proc = helm("template", RELEASE, str(CHART), "--kube-version", "1.36.0", "--set", "restartBackoffSeconds=-1",
                check=False)
    assert proc.returncode != 0 and "restartBackoffSeconds" in proc.stderr


def test_rules_have_no_wildcards_secrets_or_exec(helm):
    docs = yaml.safe_load_all(helm("template", RELEASE, str(CHART), "--kube-version", "1.36.0").stdout)
    rules = [rule for d in docs if d and d["kind"] == "ClusterRole" for rule in d["rules"]]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert "secrets" not in rule["resources"] and "pods/exec" not in rule["resources"]


def test_install_creates_every_object(installed, kubectl):
    for kind, name in (("deployment", f"{RELEASE}-operator"), ("serviceaccount", f"{RELEASE}-operator"),
                       ("service", f"{RELEASE}-operator-metrics")):
        kubectl.run("get", kind, name, "-n", SYSTEM_NS)
    kubectl.run("get", "clusterrole", f"{RELEASE}-operator")
    kubectl.run("get", "clusterrolebinding", f"{RELEASE}-operator")
    deployment = kubectl.json("get", "deployment", f"{RELEASE}-operator", "-n", SYSTEM_NS)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def can(kubectl, who, *args, namespace="default"):
    proc = kubectl.run("auth", "can-i", *args, f"--as={who}", "-n", namespace, check=False)
    return proc.stdout.strip() == "yes"


@pytest.mark.parametrize(("args", "allowed"), [
    (("get", "secrets"), False),
    (("list", "secrets"), False),
    (("create", "pods", "--subresource=exec"), False),
    (("create", "pods"), False),
    (("delete", "nodes"), False),
    (("list", "nodes"), True),
    (("watch", "nodes"), False),
    (("patch", "finetunejobs.finetunejob.dev", "--subresource=status"), True),
    (("create", "jobs.batch"), True),
    (("list", "pods"), True),
    (("watch", "pods"), False),
    (("list", "resourcequotas"), True),
    (("create", "resourcequotas"), False),
], ids=["get-secrets", "list-secrets", "exec", "create-pods", "delete-nodes", "list-nodes", "watch-nodes",
        "patch-status", "create-jobs", "list-pods", "watch-pods", "list-quotas", "create-quotas"])
def test_operator_permissions_through_the_apiserver(installed, kubectl, args, allowed):
    assert can(kubectl, OPERATOR_SA, *args) is allowed


def test_operator_runs_under_the_charts_least_privilege_identity(installed, kubectl, control_plane, namespace):
    token = kubectl.run("create", "token", f"{RELEASE}-operator", "-n", SYSTEM_NS, "--duration=1h").stdout.strip()
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    restricted = control_plane.work / "operator-sa.kubeconfig"
    restricted.write_text(yaml.safe_dump(config))
    op = OperatorProcess(restricted, control_plane.work / "operator-sa.log").start()
    try:
        # What a user does after `helm install`: apply an example and watch `kubectl get finetunejobs`.
        kubectl.run("apply", "-n", namespace, "-f", str(ROOT / "examples" / "tiny-cpu-sft.yaml"))
        phases = watch_phases(kubectl, namespace, "tiny-cpu-sft", until="Running")
        assert phases[-1] == "Running", op.log_tail()
        (pod,) = kubectl.json("get", "pods", "-n", namespace, "-l", f"{c.LABEL_JOB}=tiny-cpu-sft")["items"]
        kubectl.run("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(terminated(0)))
        phases += watch_phases(kubectl, namespace, "tiny-cpu-sft", until="Succeeded")
        assert phases[-1] == "Succeeded", op.log_tail()
        assert "Running" in phases
        row = kubectl.run("get", "finetunejobs", "-n", namespace, "--no-headers").stdout.split()
        assert row[:3] == ["tiny-cpu-sft", "Succeeded", "1/1"]  # nodes that ran (or finished) / requested
        # (Another test's namespace being deleted refuses new Events to every identity: not a missing right.)
        refused = op.refusals()
        assert not refused, refused
    finally:
        op.stop()


def watch_phases(kubectl, namespace, name, until, timeout=60.0):
    """The phases `kubectl get ftj` shows, in order, until `until` (or the timeout)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phase = kubectl.json("get", "ftj", name, "-n", namespace).get("status", {}).get("phase")
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)
        if phase == until:
            break
        time.sleep(0.3)
    return seen


def test_trainer_identity_patches_only_its_own_status(installed, kubectl, control_plane, namespace):
    """RBAC lets the namespace's trainer identity patch status; the chart's admission policy narrows it to the job
    whose pod holds the token."""
    for name in ("mine", "other"):
        doc = make_job({"metadata.name": name, "metadata.namespace": namespace})
        kubectl.run("apply", "-f", "-", input=json.dumps(doc))
    from finetune_operator.render import render_trainer_identity

    kubectl.run("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in
                                                         render_trainer_identity(namespace, None)))
    trainer = f"system:serviceaccount:{namespace}:finetunejob-trainer"
    assert can(kubectl, trainer, "patch", "finetunejobs.finetunejob.dev/mine", "--subresource=status",
               namespace=namespace)
    assert not can(kubectl, trainer, "patch", "finetunejobs.finetunejob.dev/mine", namespace=namespace)  # the spec
    assert not can(kubectl, trainer, "get", "secrets", namespace=namespace)
    assert not can(kubectl, trainer, "list", "pods", namespace=namespace)

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mine-a1-0-x7k2p", "namespace": namespace},
           "spec": {"serviceAccountName": "finetunejob-trainer", "containers": [{"name": "trainer", "image": "t"}]}}
    kubectl.run("apply", "-f", "-", input=json.dumps(pod))
    uid = kubectl.json("get", "pod", "mine-a1-0-x7k2p", "-n", namespace)["metadata"]["uid"]

    def patch_as(token, job, status='{"progress": {"step": 1}}'):
        """A merge patch of the status as the trainer sends it (kubectl patch would get the object first, which a
        trainer may not: a get of the status returns the whole object)."""
        code, body = status_request(control_plane, token, "PATCH", namespace, job, json.loads(status))
        return SimpleNamespace(returncode=0 if code == 200 else code, stderr=body)

    bound = kubectl.run("create", "token", "finetunejob-trainer", "-n", namespace, "--bound-object-kind=Pod",
                        "--bound-object-name=mine-a1-0-x7k2p", f"--bound-object-uid={uid}").stdout.strip()
    refused = patch_as(bound, "mine")
    assert refused.returncode != 0 and "may write only the status fields it owns" in refused.stderr  # no status yet
    from tests.support.controlplane import ADMIN_TOKEN

    for job in ("mine", "other"):  # what the operator writes before it creates any pod
        kubectl.run("patch", "ftj", job, "-n", namespace, "--subresource=status", "--type=merge",
                    f"--token={ADMIN_TOKEN}", "-p", '{"status": {"phase": "Running", "attempt": 1}}')
    assert patch_as(bound, "mine").returncode == 0
    # Only the fields a trainer owns: its own job's phase, reason or attempt are the operator's.
    for forged in ('{"phase": "Succeeded"}', '{"reason": "Completed", "progress": {"step": 2}}', '{"attempt": 7}',
                   '{"conditions": []}'):
        refused = patch_as(bound, "mine", forged)
        assert refused.returncode != 0 and "may write only the status fields it owns" in refused.stderr, forged
    owned = patch_as(bound, "mine", '{"checkpoint": {"step": 1, "path": "/output/checkpoint-1"}, "notice": '
                                    '{"time": "2026-01-01T00:00:00Z", "reason": "LossSpike", "message": "m"}}')
    assert owned.returncode == 0, owned.stderr
    refused = patch_as(bound, "other")
    assert refused.returncode != 0 and "its own FineTuneJob only: other is not the job of pod mine-a1-0-x7k2p" \
        in refused.stderr
    unbound = kubectl.run("create", "token", "finetunejob-trainer", "-n", namespace).stdout.strip()
    refused = patch_as(unbound, "mine")
    assert refused.returncode != 0 and "token not bound to a pod" in refused.stderr
    # A job whose name is a prefix of the pod's job is not that job.
    kubectl.run("apply", "-f", "-", input=json.dumps(make_job({"metadata.name": "mine-a1",
                                                                "metadata.namespace": namespace})))
    assert patch_as(bound, "mine-a1").returncode != 0

    # The trainer's own reports name the job (UID) and attempt it was started for: deleted and created again under
    # its name, the job refuses the old pod's last report (it used to show step 2140 and a loss it never trained).
    from finetune_trainer.outputs.status_report import StatusReporter

    old_uid = kubectl.json("get", "ftj", "mine", "-n", namespace)["metadata"]["uid"]
    context = ssl._create_unverified_context()  # the test apiserver's self-signed certificate
    reporter = StatusReporter(control_plane.server, bound, namespace, "mine", context, min_interval=0, uid=old_uid,
                              attempt=1)
    assert reporter.report({"progress": {"step": 10, "maxSteps": 100}})
    kubectl.run("patch", "ftj", "mine", "-n", namespace, "--subresource=status", "--type=merge",
                f"--token={ADMIN_TOKEN}", "-p", '{"status": {"attempt": 2}}')  # the operator moved on to attempt 2
    assert reporter.report({"progress": {"step": 11, "maxSteps": 100}}) is False and reporter.refused_as_stale
    reporter = StatusReporter(control_plane.server, bound, namespace, "mine", context, min_interval=0, uid=old_uid,
                              attempt=2)
    kubectl.run("delete", "ftj", "mine", "-n", namespace, "--wait=true")
    kubectl.run("apply", "-f", "-", input=json.dumps(make_job({"metadata.name": "mine",
                                                                "metadata.namespace": namespace})))
    kubectl.run("patch", "ftj", "mine", "-n", namespace, "--subresource=status", "--type=merge",
                f"--token={ADMIN_TOKEN}", "-p", '{"status": {"phase": "Running", "attempt": 2}}')
    assert reporter.report({"progress": {"step": 2140, "maxSteps": 3000, "loss": 0.42}}) is False
    assert "progress" not in (kubectl.json("get", "ftj", "mine", "-n", namespace).get("status") or {})


def test_operator_pod_is_admitted_under_restricted_pod_security(helm, kubectl, namespace):
    """The chart's operator pod, as its Deployment would create it, in a namespace that enforces `restricted`."""
    kubectl.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    docs = yaml.safe_load_all(helm("template", RELEASE, str(CHART), "--namespace", namespace,
                                   "--kube-version", "1.36.0").stdout)
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    kubectl.run("create", "serviceaccount", deployment["spec"]["template"]["spec"]["serviceAccountName"],
                "-n", namespace)
    template = deployment["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator-probe", "namespace": namespace,
                                                           **template["metadata"]}, "spec": template["spec"]}
    admitted = kubectl.run("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert admitted.returncode == 0 and "violate" not in admitted.stderr, admitted.stderr
    # Control: without the container's hardening the same pod is refused, so the admission above is real.
    pod["spec"]["containers"][0].pop("securityContext")
    refused = kubectl.run("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr



def template(helm, *sets: str) -> list[dict]:
    args = [a for s in sets for a in ("--set", s)]
    out = helm("template", RELEASE, str(CHART), "--namespace", SYSTEM_NS, "--kube-version", "1.36.0", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kind(docs: list[dict], name: str) -> dict:
    return next(d for d in docs if d["kind"] == name)


def test_image_tag_defaults_to_the_charts_app_version(helm):
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    container = kind(template(helm), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/finetunejob/operator:{app_version}"
    pinned = kind(template(helm, "image.tag=1.2.3"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert pinned["image"] == "ghcr.io/finetunejob/operator:1.2.3"


def test_name_overrides_rename_every_operator_object(helm):
    names = {d["metadata"]["name"] for d in template(helm, "nameOverride=ctl") if d["kind"] != "Service"}
    assert {"ftj-ctl"} <= names and not any(n.endswith("-operator") for n in names)
    full = template(helm, "fullnameOverride=finetune-controller")
    assert kind(full, "Deployment")["metadata"]["name"] == "finetune-controller"
    assert kind(full, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "finetune-controller"
    binding = kind(full, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == binding["roleRef"]["name"] == "finetune-controller"


def test_pod_placement_identity_and_env_values_reach_the_deployment(helm):
    docs = template(helm, "podAnnotations.team=ml", "podLabels.cost-center=ml-42",
                    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
                    ".matchExpressions[0].key=pool",
                    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
                    ".matchExpressions[0].operator=Exists",
                    "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
                    "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/x",
                    "extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://proxy:3128", "workers=4")
    pod = kind(docs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"team": "ml"}
    assert pod["metadata"]["labels"]["cost-center"] == "ml-42"
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pod["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == "http://proxy:3128" and env[c.ENV_OPERATOR_WORKERS] == "4"
    assert kind(docs, "ServiceAccount")["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}


def test_service_monitor_and_dashboard_are_off_by_default_and_render_when_asked(helm):
    kinds = [d["kind"] for d in template(helm)]
    assert "ServiceMonitor" not in kinds and "ConfigMap" not in kinds
    docs = template(helm, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom",
                    "grafanaDashboard.enabled=true")
    monitor = kind(docs, "ServiceMonitor")
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics"))
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    dashboard = kind(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["finetunejob-operator.json"])["panels"]
    assert any("finetunejob_jobs" in t["expr"] for p in panels for t in p["targets"])
    no_metrics = [d["kind"] for d in template(helm, "metrics.enabled=false", "metrics.serviceMonitor.enabled=true")]
    assert "ServiceMonitor" not in no_metrics


UPGRADE = "kubectl apply --server-side --force-conflicts -f charts/finetunejob/crds/"


def test_notes_tell_how_to_upgrade_the_crd(installed):
    out = installed  # what `helm install` printed
    assert UPGRADE in out and UPGRADE in (ROOT / "docs" / "tasks" / "upgrade.md").read_text()
    assert "kubectl get finetunejobs -w" in out


def test_the_documented_crd_upgrade_works_on_a_crd_that_helm_installed(helm, kubectl, tmp_path):
    """The session's CRD was applied by kubectl, so helm would skip it: the same CRD under another group, in a
    chart of its own, is installed by helm, then upgraded with the command the NOTES give."""
    def crd(description: str) -> str:
        text = (ROOT / "charts" / "finetunejob" / "crds" / "finetunejob.yaml").read_text()
        doc = yaml.safe_load(text.replace(c.GROUP, "upgrade-test.finetunejob.dev"))
        doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = description
        return yaml.safe_dump(doc)

    chart = tmp_path / "chart"
    (chart / "crds").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: crd-upgrade-test\nversion: 0.1.0\n")
    (chart / "crds" / "finetunejob.yaml").write_text(crd("the chart's first version"))
    helm("install", "crd-upgrade-test", str(chart), "--namespace", "default")
    try:
        name = f"{c.PLURAL}.upgrade-test.finetunejob.dev"
        assert "helm" in json.dumps(kubectl.json("get", "crd", name, "--show-managed-fields")["metadata"])
        (chart / "crds" / "finetunejob.yaml").write_text(crd("the chart's next version"))
        old = kubectl.run("apply", "--server-side", "-f", str(chart / "crds"), check=False)
        assert old.returncode != 0 and "conflict" in old.stderr.lower()  # what the README used to say
        args = UPGRADE.split()[1:-1] + [str(chart / "crds")]
        kubectl.run(*args)
        schema = kubectl.json("get", "crd", name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert schema["description"] == "the chart's next version"
    finally:
        helm("uninstall", "crd-upgrade-test", "--namespace", "default", check=False)
        kubectl.run("delete", "crd", f"{c.PLURAL}.upgrade-test.finetunejob.dev", "--ignore-not-found", check=False)
