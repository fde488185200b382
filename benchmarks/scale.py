"""Scale: FineTuneJobs by the thousand on fake GPU nodes, against a real control plane; prints what it measured.

A fresh etcd + kube-apiserver + controller-manager + scheduler + kwok (tests/support/controlplane.py), N kwok nodes
with 8 nvidia.com/gpu each, the operator as a process (python -m finetune_operator.controller) under an audited
identity. Jobs are submitted as fast as `--submitters` client threads can create them. Measured:
  - apply -> children created latency per job (p50, p99): from the create call to the watch seeing its Job (the
    last child applied), and creation throughput (jobs/s) against the submission rate of the same run (baseline);
  - time until every job is Running (pods scheduled by the real scheduler, made Running by kwok);
  - the operator's peak RSS (VmHWM);
  - the operator's API requests by verb and resource, from the apiserver's audit log: writes per job to create
    its children, writes per job until Running, and requests per minute in steady state (every job Running,
    nothing changing).
Usage: .venv/bin/python benchmarks/scale.py [--jobs 1000] [--nodes 500] [--nodes-per-job 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from kubernetes import client, config, watch  # noqa: E402
from kubernetes.dynamic import DynamicClient  # noqa: E402

from finetune_operator.api import constants as c  # noqa: E402
from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.controller.kube import Kube  # noqa: E402
from finetune_operator.render import RenderContext, render_all  # noqa: E402
from tests.builders import make_job  # noqa: E402
from tests.support import audit  # noqa: E402
from tests.support.controlplane import ControlPlane, build_binaries, fake_gpu_node  # noqa: E402
from tests.support.operator_process import OperatorProcess  # noqa: E402

NAMESPACE = "scale"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class Recorder:
    """Watches Jobs and FineTuneJobs in the benchmark namespace; first time each job's child / Running is seen."""

    def __init__(self, api: client.ApiClient):
        self.batch, self.custom = client.BatchV1Api(api), client.CustomObjectsApi(api)
        self.children_at: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self.stop = threading.Event()
        for target in (self._jobs, self._finetunejobs):
            threading.Thread(target=target, daemon=True).start()

    def _jobs(self) -> None:
        while not self.stop.is_set():
            for event in watch.Watch().stream(self.batch.list_namespaced_job, NAMESPACE, timeout_seconds=30,
                                              label_selector=c.LABEL_JOB):
                self.children_at.setdefault(event["object"].metadata.labels[c.LABEL_JOB], time.time())

    def _finetunejobs(self) -> None:
        while not self.stop.is_set():
            for event in watch.Watch().stream(self.custom.list_namespaced_custom_object, c.GROUP, c.VERSION,
                                              NAMESPACE, c.PLURAL, timeout_seconds=30):
                obj = event["object"]
                if (obj.get("status") or {}).get("phase") == "Running":
                    self.running_at.setdefault(obj["metadata"]["name"], time.time())


def add_nodes(api: client.ApiClient, count: int) -> None:
    core, nodes = client.CoreV1Api(api), DynamicClient(api).resources.get(api_version="v1", kind="Node")
    with ThreadPoolExecutor(16) as pool:  # the dynamic client: the typed one insists on a kubelet's nodeInfo
        list(pool.map(lambda i: nodes.create(body=fake_gpu_node(f"gpu-{i:04d}")), range(count)))
    deadline = time.time() + 300
    while time.time() < deadline:
        ready = sum(1 for n in core.list_node().items
                    if any(cd.type == "Ready" and cd.status == "True" for cd in n.status.conditions or []))
        if ready == count:
            return
        time.sleep(1)
    raise RuntimeError(f"only {ready}/{count} kwok nodes became Ready")


def job_doc(name: str, namespace: str, nodes: int, gpus: int = 1) -> dict:
    return make_job({"metadata.name": name, "metadata.namespace": namespace, "spec.distributed.numNodes": nodes,
                     "spec.distributed.gpusPerNode": gpus, "spec.training.precision": "bf16" if gpus else "fp32"})


def baseline_jobs_per_s(kubeconfig: Path, jobs: int, threads: int) -> float:
    """The same three children per job (ConfigMap, Service, suspended Job) applied by a plain client with as many
    threads as the operator has workers: what this apiserver accepts, measured in the same run."""
    kube = Kube.from_kubeconfig(str(kubeconfig), connections=threads)
    batches = []
    for i in range(jobs):
        job = validate_job(job_doc(f"base-{i:04d}", "baseline", 4))
        children = render_all(job.spec, RenderContext(name=job.name, namespace="baseline"))
        for child in children:
            child["metadata"]["labels"].pop(c.LABEL_JOB)  # not the operator's business
        children[-1]["spec"]["suspend"] = True  # no pods: the GPUs are for the measured jobs
        batches.append(children)
    started = time.time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda children: [kube.apply(child) for child in children], batches))
    return jobs / (time.time() - started)


def wait(what: str, done, timeout: float, progress=None) -> None:
    deadline, last = time.time() + timeout, 0.0
    while not done():
        if time.time() > deadline:
            raise RuntimeError(f"timed out waiting for {what}" + (f" ({progress()})" if progress else ""))
        if progress and time.time() - last > 10:
            print(f"  ... {progress()}", flush=True)
            last = time.time()
        time.sleep(0.2)


CHILD_NAME = re.compile(r"^(?P<job>.+?)(-config|-a[0-9]+)?$")


def creation_writes(log: Path, children_at: dict[str, float]) -> int:
    """Writes about each job (its status, its children, its Events) received before its children all existed."""
    total = 0
    for event in audit.events(log, namespace=NAMESPACE):
        if event["verb"] not in audit.WRITE_VERBS:
            continue
        name = event["objectRef"].get("name", "")
        job = name.split(".")[0] if event["objectRef"]["resource"] == "events" else CHILD_NAME.match(name)["job"]
        if job in children_at and audit.received(event) <= children_at[job]:
            total += 1
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--nodes-per-job", type=int, default=4)
    parser.add_argument("--submitters", type=int, default=16)
    parser.add_argument("--workers", type=int, default=16, help="operator reconcile threads (FINETUNE_WORKERS)")
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")  # loopback apiserver, self-signed
    if args.jobs * args.nodes_per_job > args.nodes * 8:
        parser.error("more pods than the fake nodes have GPUs; every job must be able to run")

    # TaintNodesByCondition would taint every new node not-ready until a node-lifecycle controller lifts it;
    # kwok nodes send no heartbeats, so that controller is not run and the taint is not added.
    cp = ControlPlane(build_binaries(), apiserver_args=["--disable-admission-plugins=TaintNodesByCondition",
                                                        "--max-requests-inflight=800"]).start()
    operator = None
    finished = False  # a run that fails keeps the control plane's directory (its logs)
    try:
        api = config.new_client_from_config(str(cp.kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        import yaml

        from tests.conftest import CRD_FILE

        client.ApiextensionsV1Api(api).create_custom_resource_definition(yaml.safe_load(CRD_FILE.read_text()))
        started = time.time()
        add_nodes(api, args.nodes)
        print(f"{args.nodes} kwok nodes x 8 nvidia.com/gpu Ready in {time.time() - started:.1f}s", flush=True)
        for ns in (NAMESPACE, "warmup", "baseline"):
            core.create_namespace({"metadata": {"name": ns}})
        time.sleep(2)  # the ServiceAccount controller creates "default" in each

        baseline = baseline_jobs_per_s(cp.kubeconfig, min(args.jobs, 300), args.workers)
        print(f"baseline: a plain client applies the children of {baseline:.1f} jobs/s", flush=True)

        operator = OperatorProcess(cp.audited_kubeconfig, cp.work / "operator.log", workers=args.workers).start()
        custom.create_namespaced_custom_object(c.GROUP, c.VERSION, "warmup", c.PLURAL,
                                               job_doc("warm", "warmup", 1, gpus=0))
        def warm_status() -> dict:
            return custom.get_namespaced_custom_object(c.GROUP, c.VERSION, "warmup", c.PLURAL, "warm").get(
                "status") or {}

        def warm_state() -> str:  # what stood still: the job's status, its pods, who still lives
            pods = [(p.metadata.name, p.spec.node_name, p.status.phase)
                    for p in core.list_namespaced_pod("warmup").items]
            exited = operator.proc.poll()
            return (f"status {json.dumps(warm_status())[:600]}; pods {pods}; operator "
                    + (f"exited {exited}" if exited is not None else "running")
                    + f"; control plane components stopped: {cp.exited() or 'none'}")
        try:
            wait("the operator to run a warm-up job", lambda: warm_status().get("phase") == "Running", 120,
                 warm_state)
        except RuntimeError as exc:  # and the operator's last words
            raise RuntimeError(f"{exc}\noperator log:\n{operator.log_tail(40)}") from None

        recorder = Recorder(api)
        names = [f"ftj-{i:04d}" for i in range(args.jobs)]
        submitted: dict[str, float] = {}

        def submit(name: str) -> None:
            submitted[name] = time.time()
            custom.create_namespaced_custom_object(c.GROUP, c.VERSION, NAMESPACE, c.PLURAL,
                                                   job_doc(name, NAMESPACE, args.nodes_per_job))

        t0 = time.time()
        with ThreadPoolExecutor(args.submitters) as pool:
            list(pool.map(submit, names))
        submit_seconds = time.time() - t0
        print(f"submitted {args.jobs} FineTuneJobs in {submit_seconds:.1f}s", flush=True)

        def state() -> str:
            return f"{len(recorder.children_at)} with children, {len(recorder.running_at)} Running"
        wait("children of every job", lambda: len(recorder.children_at) >= args.jobs, args.timeout, state)
        wait("every job Running", lambda: len(recorder.running_at) >= args.jobs, args.timeout, state)
        t_running = max(recorder.running_at[n] for n in names)
        print(f"all {args.jobs} Running after {t_running - t0:.1f}s", flush=True)

        time.sleep(5)  # let the last Running transitions' writes land before the quiet window
        t_steady = time.time()
        time.sleep(args.steady_seconds)
        steady = audit.requests(cp.audit_log, start=t_steady, end=t_steady + args.steady_seconds)
        rss = OperatorProcess.memory(operator.proc.pid)

        latencies = [recorder.children_at[n] - submitted[n] for n in names]
        t_children = max(recorder.children_at[n] for n in names)
        until_running = audit.requests(cp.audit_log, start=t0, end=t_steady, namespace=NAMESPACE)
        all_requests = audit.requests(cp.audit_log, start=t0, end=t_steady)
        figures = {
            "jobs": args.jobs, "nodes": args.nodes, "nodes_per_job": args.nodes_per_job, "pods": args.jobs
            * args.nodes_per_job,
            "submission_jobs_per_s": args.jobs / submit_seconds,
            "baseline_plain_client_jobs_per_s": baseline,
            "creation_jobs_per_s": args.jobs / (t_children - t0),
            "children_latency_p50_s": percentile(latencies, 50),
            "children_latency_p99_s": percentile(latencies, 99),
            "all_running_s": t_running - t0,
            "operator_peak_rss_mb": rss["VmHWM"] / 1024, "operator_rss_mb": rss["VmRSS"] / 1024,
            "creation_writes_per_job": creation_writes(cp.audit_log, recorder.children_at) / args.jobs,
            "writes_per_job_until_running": audit.writes(until_running) / args.jobs,
            "requests_until_running_all_namespaces": sum(all_requests.values()),
            "steady_requests_per_minute": sum(steady.values()) * 60 / args.steady_seconds,
        }
        print()
        print(f"FineTuneJobs x nodes        {args.jobs} x {args.nodes_per_job} on {args.nodes} kwok nodes x 8 GPUs")
        print(f"submission (client)         {figures['submission_jobs_per_s']:8.1f} jobs/s")
        print(f"plain client, same children {baseline:8.1f} jobs/s   (baseline: this apiserver's ceiling)")
        print(f"creation (children exist)   {figures['creation_jobs_per_s']:8.1f} jobs/s   "
              f"{figures['creation_jobs_per_s'] / baseline:.2f}x of the baseline  (target >= 50)")
        print(f"apply -> children, p50/p99  {figures['children_latency_p50_s']:8.2f} / "
              f"{figures['children_latency_p99_s']:.2f} s   (target p99 < 2 s)")
        print(f"all Running after           {figures['all_running_s']:8.1f} s")
        print(f"operator peak RSS           {figures['operator_peak_rss_mb']:8.1f} MB   (target < 250)")
        print(f"writes per job, creation    {figures['creation_writes_per_job']:8.2f}   (target <= 6)")
        print(f"writes per job, to Running  {figures['writes_per_job_until_running']:8.2f}")
        print(f"steady state requests/min   {figures['steady_requests_per_minute']:8.1f}   "
              f"({args.steady_seconds:.0f} s with every job Running)")
        print(f"operator requests in namespace {NAMESPACE} until all Running (verb, resource, count, per job):")
        print(audit.table(until_running, per=args.jobs))
        print("operator requests in the steady window (verb, resource, count):")
        print(audit.table(steady) or "  none")
        if args.out:
            args.out.write_text(json.dumps({**figures, "requests_until_running": {
                f"{v} {r}": n for (v, r), n in until_running.items()}}, indent=2) + "\n")
        finished = True
    finally:
        if operator is not None:
            operator.stop()
        cp.stop(remove=finished)


if __name__ == "__main__":
    main()
    # The recorder's watch threads may sit in an SSL read of the now stopped apiserver; interpreter shutdown can
    # abort on them, so leave without it once everything is printed and the control plane is down.
    sys.stdout.flush()
    os._exit(0)
