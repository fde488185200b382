"""Side by side with Kubeflow's training-operator v1.8.1 (PyTorchJob), in one run of the same harness: the same
control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes with 8 nvidia.com/gpu), the same
jobs (N jobs x 4 pods x 1 GPU), each controller alone under the same audited identity. Prints, per controller:
creation throughput (jobs/s until every pod of every job exists), apply -> pods-exist and apply -> all pods Running
latency (p50/p99), the controller's peak RSS, and its writes per job (apiserver audit log).

training-operator is the upstream Go module built by `go install` (benchmarks/peers.sh, cached outside the work
tree); its PyTorchJob CRD comes from the same module. It runs with its webhook server up (certs self-generated,
mounted as its pod would) and a ValidatingWebhookConfiguration with no webhooks, so creates are not slowed by a
webhook on either side. Our pods are created by the Job controller (kube-controller-manager), training-operator
creates its pods itself: writes are counted for the controller under test only, and pods-exist is what a user
waits for in both cases. kwok runs init containers (PyTorchJob workers have one) as a kubelet would.

Each side's figures are written to --out as soon as that side is measured; a failure in one side (or in stopping a
controller: SIGTERM, then SIGKILL after a grace) is recorded in the figures and never discards the other's. Exit
code: 0 when both sides were measured, else the sum of 1 (ours failed), 2 (the peer failed), 4 (clean-up failed).

Usage: .venv/bin/python benchmarks/peer_kubeflow.py [--jobs 300] [--nodes 300] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "benchmarks")]

import scale  # noqa: E402 - benchmarks/scale.py: nodes, percentiles, waits and the operator's job documents

from finetune_operator.api import constants as c  # noqa: E402
from tests.support import audit  # noqa: E402
from tests.support.controlplane import ControlPlane, build_binaries, free_port  # noqa: E402
from tests.support.operator_process import OperatorProcess  # noqa: E402

KF_VERSION = "v1.8.1"
KF_JOB_LABEL = "training.kubeflow.org/job-name"
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # controller-runtime's default, as its pod mounts it
REPLICAS = 4
STOP_GRACE_SECONDS = 30.0
OURS_FAILED, PEER_FAILED, CLEANUP_FAILED = 1, 2, 4


def stop_process(proc: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> str | None:
    """SIGTERM, then SIGKILL once the grace is over; what had to be done when it did not stop by itself."""
    if proc.poll() is not None:
        return None
    proc.terminate()
    try:
        proc.wait(grace)
        return None
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        return f"pid {proc.pid} did not exit within {grace:.0f} s of SIGTERM: killed"


def training_operator() -> tuple[Path, Path]:
    """(binary, PyTorchJob CRD), built by benchmarks/peers.sh into the cache when missing."""
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "peers.sh")], check=True, capture_output=True, text=True)
    binary, crd = out.stdout.strip().splitlines()[-2:]
    return Path(binary), Path(crd)


def pytorchjob(name: str, namespace: str) -> dict:
    """What a Kubeflow user writes for the same job: 1 master + 3 workers, one GPU each, our trainer image."""
    def replica(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [{
            "name": "pytorch", "image": c.DEFAULT_TRAINER_IMAGE,
            "command": ["python", "-m", "finetune_trainer.launch", "--config", "/etc/finetune/trainer.json"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(REPLICAS - 1)}}}


class PodWatch:
    """First time each job has all of its pods, and all of them Running (a pod watch in one namespace)."""

    def __init__(self, api, namespace: str, job_label: str):
        from kubernetes import client, watch

        self.exists_at: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self._pods: dict[str, dict[str, str]] = {}
        self._stop = threading.Event()

        def run() -> None:
            core = client.CoreV1Api(api)
            while not self._stop.is_set():
                for event in watch.Watch().stream(core.list_namespaced_pod, namespace, label_selector=job_label,
                                                  timeout_seconds=30):
                    pod = event["object"]
                    job = pod.metadata.labels[job_label]
                    self._pods.setdefault(job, {})[pod.metadata.name] = pod.status.phase or "Pending"
                    phases = self._pods[job].values()
                    now = time.time()
                    if len(phases) >= REPLICAS:
                        self.exists_at.setdefault(job, now)
                        if all(p == "Running" for p in phases):
                            self.running_at.setdefault(job, now)

        threading.Thread(target=run, daemon=True).start()


def measure(name: str, cp: ControlPlane, api, namespace: str, job_label: str, submit, start, jobs: int,
            submitters: int, timeout: float) -> dict:
    """The figures of one side; the controller is stopped at the end whatever happened (its clean-up's trouble,
    if any, is in "stopped")."""
    controller, pid = start()
    result: dict = {}
    try:
        time.sleep(5)  # informers synced, webhook certs written
        pods = PodWatch(api, namespace, job_label)
        names = [f"{name}-{i:04d}" for i in range(jobs)]
        submitted: dict[str, float] = {}

        def one(job: str) -> None:
            submitted[job] = time.time()
            submit(job)

        t0 = time.time()
        with ThreadPoolExecutor(submitters) as pool:
            list(pool.map(one, names))
        state = lambda: f"{len(pods.exists_at)} with pods, {len(pods.running_at)} Running"  # noqa: E731
        scale.wait(f"{name}: every job's pods", lambda: len(pods.exists_at) >= jobs, timeout, state)
        scale.wait(f"{name}: every job Running", lambda: len(pods.running_at) >= jobs, timeout, state)
        t_running = max(pods.running_at.values())
        time.sleep(3)
        rss = OperatorProcess.memory(pid)
        counts = audit.requests(cp.audit_log, start=t0, end=t_running + 3, namespace=namespace)
        exists = [pods.exists_at[n] - submitted[n] for n in names]
        running = [pods.running_at[n] - submitted[n] for n in names]
        result = {
            "creation_jobs_per_s": jobs / (max(pods.exists_at.values()) - t0),
            "pods_exist_p50_s": scale.percentile(exists, 50), "pods_exist_p99_s": scale.percentile(exists, 99),
            "running_p50_s": scale.percentile(running, 50), "running_p99_s": scale.percentile(running, 99),
            "peak_rss_mb": rss["VmHWM"] / 1024, "writes_per_job": audit.writes(counts) / jobs,
            "requests": {f"{v} {r}": n for (v, r), n in counts.items()},
            "load_average": os.getloadavg(),
        }
        return result
    finally:
        try:
            stopped = controller()
        except Exception as exc:  # the figures are taken: a controller that will not stop must not lose them
            stopped = f"{type(exc).__name__}: {exc}"
        if stopped:
            result["stopped"] = stopped


OURS, PEER = "finetunejob-operator", f"kubeflow training-operator {KF_VERSION}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--submitters", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    if 2 * args.jobs * REPLICAS > args.nodes * 8:
        parser.error("the two runs together need more GPUs than the fake nodes have")
    binary, kf_crd = training_operator()
    figures: dict[str, dict] = {}
    failed = 0
    cp = ControlPlane(build_binaries(), apiserver_args=["--disable-admission-plugins=TaintNodesByCondition",
                                                        "--max-requests-inflight=800"]).start()
    try:
        from kubernetes import client, config

        api = config.new_client_from_config(str(cp.kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        kubectl = str(Path(sys.executable).with_name("kubectl"))
        env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig)}
        subprocess.run([kubectl, "apply", "--server-side", "-f", str(ROOT / "crds" / "finetunejob.yaml"), "-f",
                        str(kf_crd)], env=env, check=True, capture_output=True)
        subprocess.run([kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                        f"crd/{c.PLURAL}.{c.GROUP}", "crd/pytorchjobs.kubeflow.org"], env=env, check=True,
                       capture_output=True)
        scale.add_nodes(api, args.nodes)
        for ns in ("ours", "kubeflow-jobs", "kubeflow"):
            core.create_namespace({"metadata": {"name": ns}})
        core.create_namespaced_secret("kubeflow", {"metadata": {"name": "training-operator-webhook-cert"}})
        # Its cert rotator waits until it has injected its CA into this configuration; with no webhooks in it the
        # apiserver calls none (our CRD has none either), and the operator starts.
        client.AdmissionregistrationV1Api(api).create_validating_webhook_configuration(
            {"metadata": {"name": "validator.training-operator.kubeflow.org"}, "webhooks": []})
        time.sleep(2)

        def start_ours():
            op = OperatorProcess(cp.audited_kubeconfig, cp.work / "operator.log", workers=16).start()

            def stop() -> str | None:
                said = stop_process(op.proc)
                op.log.close()
                return said
            return stop, op.proc.pid

        def mount_webhook_certs() -> None:
            """What the kubelet does in its pod: the cert Secret, once its rotator filled it, appears as files in
            the webhook server's cert dir (the operator starts its controllers only then)."""
            import base64
            import shutil

            shutil.rmtree(CERT_DIR, ignore_errors=True)
            deadline = time.time() + 120
            while time.time() < deadline:
                data = core.read_namespaced_secret("training-operator-webhook-cert", "kubeflow").data or {}
                if {"ca.crt", "tls.crt", "tls.key"} <= set(data):
                    CERT_DIR.mkdir(parents=True, exist_ok=True)
                    for key, value in data.items():
                        (CERT_DIR / key).write_bytes(base64.b64decode(value))
                    return
                time.sleep(0.5)

        def start_kubeflow():
            log = (cp.work / "training-operator.log").open("ab")
            proc = subprocess.Popen([str(binary), "--enable-scheme=pytorchjob", "--namespace=",
                                     f"--metrics-bind-address=127.0.0.1:{free_port()}",
                                     f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                                     f"--webhook-server-port={free_port()}", "--controller-threads=16"],
                                    env={**os.environ, "KUBECONFIG": str(cp.audited_kubeconfig),
                                         "MY_POD_NAMESPACE": "kubeflow"}, stdout=log, stderr=subprocess.STDOUT)
            mount_webhook_certs()

            def stop() -> str | None:
                said = stop_process(proc)
                log.close()
                return said
            return stop, proc.pid

        sides = (
            (OURS, OURS_FAILED, lambda: measure(
                "ftj", cp, api, "ours", c.LABEL_JOB,
                lambda job: custom.create_namespaced_custom_object(c.GROUP, c.VERSION, "ours", c.PLURAL,
                                                                   scale.job_doc(job, "ours", REPLICAS)),
                start_ours, args.jobs, args.submitters, args.timeout)),
            (PEER, PEER_FAILED, lambda: measure(
                "ptj", cp, api, "kubeflow-jobs", KF_JOB_LABEL,
                lambda job: custom.create_namespaced_custom_object("kubeflow.org", "v1", "kubeflow-jobs",
                                                                   "pytorchjobs", pytorchjob(job, "kubeflow-jobs")),
                start_kubeflow, args.jobs, args.submitters, args.timeout)),
        )
        for label, bit, run in sides:
            try:
                figures[label] = run()
            except Exception as exc:  # one side's failure never discards the other's figures
                figures[label] = {"failed": f"{type(exc).__name__}: {exc}"}
                failed |= bit
            if figures[label].get("stopped"):
                failed |= CLEANUP_FAILED
            save(args.out, figures)
    except Exception as exc:
        figures["setup"] = {"failed": f"{type(exc).__name__}: {exc}"}
        failed |= CLEANUP_FAILED if figures else OURS_FAILED | PEER_FAILED
    finally:
        try:
            cp.stop(remove=not failed)  # a failed run keeps the control plane's directory (its logs)
        except Exception as exc:
            figures["cleanup"] = {"failed": f"{type(exc).__name__}: {exc}"}
            failed |= CLEANUP_FAILED
        save(args.out, figures)
    report(args, figures)
    return failed


def save(out: Path | None, figures: dict) -> None:
    if out is not None:
        out.write_text(json.dumps(figures, indent=2) + "\n")


def report(args: argparse.Namespace, figures: dict) -> None:
    ours, theirs = figures.get(OURS, {}), figures.get(PEER, {})
    for label, side in ((OURS, ours), (PEER, theirs)):
        if "failed" in side or "stopped" in side:
            print(f"{label}: {side.get('failed') or side.get('stopped')}")
    if "creation_jobs_per_s" not in ours or "creation_jobs_per_s" not in theirs:
        for label, side in ((OURS, ours), (PEER, theirs)):
            if "creation_jobs_per_s" in side:
                print(f"{label}: {json.dumps({k: v for k, v in side.items() if k != 'requests'})}")
        return
    print(f"\n{args.jobs} jobs x {REPLICAS} pods x 1 GPU on {args.nodes} kwok nodes x 8 GPUs, one control plane")
    print(f"{'':<34}{'FineTuneJob':>14}{'PyTorchJob':>14}{'ratio':>8}")
    for key, label, better in (("creation_jobs_per_s", "creation, jobs/s (pods exist)", "higher"),
                               ("pods_exist_p50_s", "apply -> pods exist p50, s", "lower"),
                               ("pods_exist_p99_s", "apply -> pods exist p99, s", "lower"),
                               ("running_p50_s", "apply -> all Running p50, s", "lower"),
                               ("running_p99_s", "apply -> all Running p99, s", "lower"),
                               ("peak_rss_mb", "controller peak RSS, MB", "lower"),
                               ("writes_per_job", "controller writes per job", "lower")):
        ratio = ours[key] / theirs[key] if better == "higher" else theirs[key] / max(ours[key], 1e-9)
        print(f"{label:<34}{ours[key]:>14.2f}{theirs[key]:>14.2f}{ratio:>7.2f}x")
    print("(ratio > 1: FineTuneJob better)")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # watch threads may sit in reads of the stopped apiserver
