"""What the chart's admission policies on FineTuneJobs cost at `kubectl apply`, on a fresh real control plane;
prints figures.

First with no policy at all (the baseline), then with every policy the chart installs on jobs
(templates/admission-policy-runtimes.yaml and admission-policy-identity.yaml) and one ClusterFineTuneRuntime with
every limit set; `--applies` writes (server-side dry run: admission runs in full, nothing is stored) of
  - a job with no runtime, before and after the policies (what the policies cost a job they do not limit),
  - a job within the runtime's limits (every validation evaluated, admitted),
  - a job breaking the runtime's GPU limit (refused),
  - a job naming 3 Secrets, by a user who may get those 3 only (4 authorization checks, admitted),
  - a job running as a ServiceAccount, by a user who may create pods (1 authorization check, admitted),
  - an update of a started job (judged against its recorded limits),
timed from the client; p50/p99 of each and the ratios to the baseline (the same create, or the same update, with no
policy).
Usage: .venv/bin/python benchmarks/admission_latency.py [--applies 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402

from benchmarks.scale import percentile  # noqa: E402
from finetune_operator.api import constants as c  # noqa: E402
from finetune_operator.api.runtime_layers import resolve_offline  # noqa: E402
from tests.builders import make_job  # noqa: E402
from tests.support.controlplane import ControlPlane, build_binaries  # noqa: E402

# Every limit set, and a Secret lent (so the locks on where credentials go are evaluated too).
RUNTIME = {"apiVersion": c.API_VERSION, "kind": c.CLUSTER_RUNTIME_KIND, "metadata": {"name": "capped"},
           "spec": {"template": {"distributed": {"gpusPerNode": 8, "strategy": "deepspeed"},
                                 "pod": {"secretEnv": [{"name": "HF_TOKEN", "secretName": "hub-token", "key": "k"}]}},
                    "limits": {"locked": ["pod.image", "pod.nodeSelector"], "maxNodes": 4, "maxGpusPerJob": 16,
                               "allowedMethods": ["lora", "qlora"], "allowedStrategies": ["deepspeed"],
                               "allowedModelSources": ["meta-llama/", "/models/"], "allowTrustRemoteCode": False,
                               "allowedDataSources": ["/data/"], "allowedClaims": ["team-data"],
                               "allowedVolumeKinds": ["persistentVolumeClaim", "configMap", "secret"],
                               "maxActiveDeadlineSeconds": 86400}}}


SECRETS = ("hub-token", "wandb-key", "s3-creds")


def job(name: str, runtime: bool, nodes: int) -> dict:
    doc = make_job({"metadata.name": name, "metadata.namespace": "bench", "spec.model.name": "/models/tiny",
                    "spec.data.train": [{"path": "/data/train.jsonl"}],
                    "spec.runPolicy": {"activeDeadlineSeconds": 3600}})
    if runtime:
        doc["spec"].pop("distributed", None)
        doc["spec"].pop("pod", None)
        doc["spec"]["runtimeRef"] = {"name": "capped"}
        doc["spec"]["distributed"] = {"numNodes": nodes}
    return doc


def with_secrets(name: str) -> dict:
    doc = job(name, False, 1)
    doc["spec"]["pod"] = {"secretEnv": [{"name": f"S{i}", "secretName": s, "key": "k"} for i, s in enumerate(SECRETS)]}
    return doc


def as_account(name: str) -> dict:
    doc = job(name, False, 1)
    doc["spec"]["pod"] = {"serviceAccountName": "deployer"}
    return doc


def timed(custom: client.CustomObjectsApi, doc: dict, update: bool = False) -> tuple[float, bool]:
    started = time.perf_counter()
    try:
        if update:
            custom.patch_namespaced_custom_object(c.GROUP, c.VERSION, "bench", c.PLURAL, doc["metadata"]["name"],
                                                  {"spec": doc["spec"]}, dry_run="All")
        else:
            custom.create_namespaced_custom_object(c.GROUP, c.VERSION, "bench", c.PLURAL, doc, dry_run="All")
        admitted = True
    except client.ApiException as exc:
        if exc.status not in (403, 422):
            raise
        admitted = False
    return time.perf_counter() - started, admitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--applies", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    cp = ControlPlane(build_binaries()).start()
    finished = False  # a run that fails keeps the control plane's directory (its logs)
    try:
        api = config.new_client_from_config(str(cp.kubeconfig))
        for name in ("finetunejob.yaml", "finetuneruntime.yaml", "clusterfinetuneruntime.yaml"):
            client.ApiextensionsV1Api(api).create_custom_resource_definition(
                yaml.safe_load((ROOT / "crds" / name).read_text()))
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
        time.sleep(3)  # the CRDs established
        custom = client.CustomObjectsApi(api)
        # A job that started under the runtime, its runtime recorded as the operator records it.
        started_job = job("started", True, 2)
        custom.create_namespaced_custom_object(c.GROUP, c.VERSION, "bench", c.PLURAL, started_job)
        snapshot = resolve_offline(started_job, [{**RUNTIME, "metadata": {"name": "capped", "generation": 1}}])
        custom.patch_namespaced_custom_object_status(c.GROUP, c.VERSION, "bench", c.PLURAL, "started", {
            "status": {"phase": "Running", "attempt": 1, "runtime": snapshot.snapshot}})
        suspended = {**started_job, "spec": {**started_job["spec"], "suspend": True}}
        for i in range(20):  # warm (connections, the apiserver's caches) before anything is timed
            timed(custom, job(f"w{i}", False, 1))
            timed(custom, suspended, update=True)
        baseline = [timed(custom, job(f"b{i}", False, 1))[0] for i in range(args.applies)]
        update_baseline = [timed(custom, suspended, update=True)[0] for _ in range(args.applies)]
        rbac = client.RbacAuthorizationV1Api(api)
        core = client.CoreV1Api(api)
        core.create_namespaced_service_account("bench", {"metadata": {"name": "deployer"}})
        for secret in SECRETS:
            core.create_namespaced_secret("bench", {"metadata": {"name": secret}, "stringData": {"k": "v"}})
        rbac.create_namespaced_role("bench", {"metadata": {"name": "tenant"}, "rules": [
            {"apiGroups": [c.GROUP], "resources": [c.PLURAL], "verbs": ["create", "get", "patch", "update"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": list(SECRETS)},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]})
        rbac.create_namespaced_role_binding("bench", {"metadata": {"name": "tenant"}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"kind": "User", "name": "tenant", "apiGroup": "rbac.authorization.k8s.io"}]})
        tenant_client = config.new_client_from_config(str(cp.kubeconfig))
        tenant_client.set_default_header("Impersonate-User", "tenant")
        tenant = client.CustomObjectsApi(tenant_client)
        custom.create_cluster_custom_object(c.GROUP, c.VERSION, c.CLUSTER_RUNTIME_PLURAL, RUNTIME)
        for template in ("admission-policy-runtimes.yaml", "admission-policy-identity.yaml"):
            rendered = subprocess.run([str(cp.bin_dir / "helm"), "template", "x", str(ROOT / "charts" / "finetunejob"),
                                       "--kube-version", "1.36.0", "--show-only", f"templates/{template}"],
                                      capture_output=True, text=True, check=True).stdout
            for doc in yaml.safe_load_all(rendered):
                if doc:
                    kind = doc["kind"]
                    (client.AdmissionregistrationV1Api(api).create_validating_admission_policy
                     if kind.endswith("Policy")
                     else client.AdmissionregistrationV1Api(api).create_validating_admission_policy_binding)(doc)
        cases = {"no_runtime": (custom, lambda i: job(f"j{i}", False, 1), False, True),
                 "within_limits": (custom, lambda i: job(f"j{i}", True, 2), False, True),
                 "refused": (custom, lambda i: job(f"j{i}", True, 8), False, False),
                 "three_secrets_by_name": (tenant, lambda i: with_secrets(f"s{i}"), False, True),
                 "service_account": (tenant, lambda i: as_account(f"a{i}"), False, True),
                 "update_of_a_started_job": (custom, lambda i: suspended, True, True)}
        deadline = time.time() + 60  # policies take effect once the apiserver has compiled them
        while timed(custom, job("probe", True, 8))[1] or timed(tenant, {**with_secrets("probe"), "spec": {
                **with_secrets("probe")["spec"], "pod": {"secretEnv": [{"name": "X", "secretName": "nope",
                                                                        "key": "k"}]}}})[1]:
            if time.time() > deadline:
                raise RuntimeError("the policies never refused a job over its limits or naming a Secret")
            time.sleep(0.5)
        seconds: dict[str, list[float]] = {k: [] for k in cases}
        for i in range(args.applies):
            for case, (api_of, make, update, admits) in cases.items():
                took, admitted = timed(api_of, make(i), update)
                assert admitted == admits, (case, admitted)
                seconds[case].append(took)
        figures = {"applies": args.applies, "no_policies_p50_ms": round(percentile(baseline, 50) * 1000, 2),
                   "no_policies_p99_ms": round(percentile(baseline, 99) * 1000, 2),
                   "no_policies_update_p50_ms": round(percentile(update_baseline, 50) * 1000, 2),
                   "no_policies_update_p99_ms": round(percentile(update_baseline, 99) * 1000, 2)}
        for case, values in seconds.items():
            figures[f"{case}_p50_ms"] = round(percentile(values, 50) * 1000, 2)
            figures[f"{case}_p99_ms"] = round(percentile(values, 99) * 1000, 2)
        for case in cases:
            base = figures["no_policies_update_p50_ms" if case.startswith("update") else "no_policies_p50_ms"]
            figures[f"{case}_p50_vs_no_policies"] = round(figures[f"{case}_p50_ms"] / base, 2)
        finished = True
    finally:
        cp.stop(remove=finished)
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
