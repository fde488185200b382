"""What the runtimes' admission policies cost at `kubectl apply`, on a fresh real control plane; prints figures.

The chart's runtime policies (templates/admission-policy-runtimes.yaml) and one ClusterFineTuneRuntime with every
limit set; `--applies` creates (server-side dry run: admission runs in full, nothing is stored) of
  - a job breaking the runtime's GPU limit (refused by the policy),
  - the same job within the limits (every validation evaluated, admitted),
  - a job with no runtime (the baseline: the policies see no runtime that applies),
timed from the client; p50/p99 of each and the ratios to the baseline.
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
from tests.builders import make_job  # noqa: E402
from tests.support.controlplane import ControlPlane, build_binaries  # noqa: E402

RUNTIME = {"apiVersion": c.API_VERSION, "kind": c.CLUSTER_RUNTIME_KIND, "metadata": {"name": "capped"},
           "spec": {"template": {"distributed": {"gpusPerNode": 8, "strategy": "deepspeed"}},
                    "limits": {"locked": ["pod.image", "pod.nodeSelector"], "maxNodes": 4, "maxGpusPerJob": 16,
                               "allowedMethods": ["lora", "qlora"], "allowedStrategies": ["deepspeed"],
                               "allowedModelSources": ["meta-llama/", "/models/"],
                               "allowedDataSources": ["/data/"], "maxActiveDeadlineSeconds": 86400}}}


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


def timed(custom: client.CustomObjectsApi, doc: dict) -> tuple[float, bool]:
    started = time.perf_counter()
    try:
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
        rendered = subprocess.run([str(cp.bin_dir / "helm"), "template", "x", str(ROOT / "charts" / "finetunejob"),
                                   "--kube-version", "1.36.0", "--show-only",
                                   "templates/admission-policy-runtimes.yaml"],
                                  capture_output=True, text=True, check=True).stdout
        time.sleep(3)  # the CRDs established
        custom = client.CustomObjectsApi(api)
        custom.create_cluster_custom_object(c.GROUP, c.VERSION, c.CLUSTER_RUNTIME_PLURAL, RUNTIME)
        for doc in yaml.safe_load_all(rendered):
            if doc:
                kind = doc["kind"]
                (client.AdmissionregistrationV1Api(api).create_validating_admission_policy if kind.endswith("Policy")
                 else client.AdmissionregistrationV1Api(api).create_validating_admission_policy_binding)(doc)
        cases = {"refused": (True, 8), "within_limits": (True, 2), "no_runtime": (False, 1)}
        deadline = time.time() + 60  # policies take effect once the apiserver has compiled them
        while timed(custom, job("probe", True, 8))[1]:
            if time.time() > deadline:
                raise RuntimeError("the runtime policy never refused a job over its limits")
            time.sleep(0.5)
        seconds: dict[str, list[float]] = {k: [] for k in cases}
        for i in range(args.applies):
            for case, (runtime, nodes) in cases.items():
                took, admitted = timed(custom, job(f"j{i}", runtime, nodes))
                assert admitted == (case != "refused"), (case, admitted)
                seconds[case].append(took)
        figures = {"applies": args.applies}
        for case, values in seconds.items():
            figures[f"{case}_p50_ms"] = round(percentile(values, 50) * 1000, 2)
            figures[f"{case}_p99_ms"] = round(percentile(values, 99) * 1000, 2)
        for case in ("refused", "within_limits"):
            figures[f"{case}_p50_vs_no_runtime"] = round(figures[f"{case}_p50_ms"] / figures["no_runtime_p50_ms"], 2)
        finished = True
    finally:
        cp.stop(remove=finished)
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
