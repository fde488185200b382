"""A real Kueue for the cluster tests: its manager built from the Go module (hack/build-components.sh), its CRDs
from the same module, run against the test apiserver with its webhooks registered (a 127.0.0.1 URL and a CA
bundle of our own), the batch/Job integration on. Never an imitation."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.controlplane import ControlPlane, free_port
from tests.support.port_retry import set_aside, start_on_free_ports

API = "kueue.x-k8s.io/v1beta2"
NAMESPACE = "kueue-system"
# Webhooks of what the tests use: batch Jobs and Kueue's own objects (the others' handlers are not served).
WEBHOOK_PATHS = ("-batch-v1-job", "-kueue-x-k8s-io-")
METRICS_CERTS = Path("/etc/kueue/metrics/certs")


def _certificates(directory: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (what controller-runtime's webhook server reads)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_crt), "-days", "2",
        "-subj", "/CN=kueue-test-ca")
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(directory / "tls.key"), "-out",
        str(directory / "tls.csr"), "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(directory / "tls.csr"), "-CA", str(ca_crt), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(directory / "tls.crt"), "-days", "2", "-extfile", str(ext))
    return ca_crt.read_bytes()


@dataclass
class Kueue:
    component: Path  # the cache directory: kueue, crds/, webhooks.yaml
    cp: ControlPlane
    kubectl: Any
    manage_jobs_without_queue_name: bool = False
    work: Path = field(init=False)
    proc: subprocess.Popen | None = None
    webhook_port: int = 0
    health_port: int = 0

    def __post_init__(self) -> None:
        self.work = self.cp.work / ("kueue-unlabelled" if self.manage_jobs_without_queue_name else "kueue")

    def install_crds(self) -> None:
        names = []
        for crd in sorted((self.component / "crds").glob("*.yaml")):
            self.kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crd))
            names.append("crd/" + yaml.safe_load(crd.read_text())["metadata"]["name"])
        self.kubectl.wait_condition("Established", *names)

    def start(self) -> Kueue:
        self.install_crds()
        self.kubectl.run("create", "namespace", NAMESPACE, check=False)
        ca = _certificates(self.work / "certs")
        # With its own certificate management off, Kueue v0.17 reads a metrics certificate from a fixed path (in a
        # cluster, a mounted Secret): the tests put theirs there (they run as root on a machine of their own).
        METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            shutil.copy(self.work / "certs" / name, METRICS_CERTS / name)
        start_on_free_ports(self._start_manager, self._forget)
        self._register_webhooks(ca)
        return self

    def _forget(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        set_aside(self.work / "kueue.log")

    def _start_manager(self) -> None:
        self.webhook_port, self.health_port = free_port(), free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(self.work / "certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": self.manage_jobs_without_queue_name,
            # Only the tests' namespaces: the control plane's own stay unmanaged.
            "managedJobsNamespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", NAMESPACE, "default"]}]},
            "integrations": {"frameworks": ["batch/job"]},
            "clientConnection": {"qps": 100, "burst": 200},
        }
        (self.work / "config.yaml").write_text(yaml.safe_dump(config))
        log = (self.work / "kueue.log").open("ab")
        self.proc = subprocess.Popen([str(self.component / "kueue"), f"--config={self.work / 'config.yaml'}",
                                      "--zap-log-level=2", "--feature-gates=VisibilityOnDemand=false"],
                                     env={"KUBECONFIG": str(self.cp.kubeconfig), "PATH": "/usr/bin:/bin"},
                                     stdout=log, stderr=log)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"kueue exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"kueue was not ready in 120 s:\n{self.log_tail()}")

    def _register_webhooks(self, ca: bytes) -> None:
        docs = [d for d in yaml.safe_load_all((self.component / "webhooks.yaml").read_text()) if d]
        for doc in docs:
            kept = []
            for hook in doc.get("webhooks") or []:
                path = hook["clientConfig"]["service"]["path"]
                if not any(p in path for p in WEBHOOK_PATHS):
                    continue
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}",
                                        "caBundle": base64.b64encode(ca).decode()}
                kept.append(hook)
            doc["webhooks"] = kept
            doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
            self.kubectl.run("apply", "-f", "-", input=json.dumps(doc))

    def log_tail(self, lines: int = 40) -> str:
        path = self.work / "kueue.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.kubectl.run("delete", kind, f"kueue-{kind.replace('webhookconfiguration', '')}-webhook-configuration",
                             "--ignore-not-found", check=False)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cluster_queue(name: str, gpus: int, flavor: str = "default-flavor",
                  preemption: str = "LowerPriority") -> list[dict[str, Any]]:
    """A ResourceFlavor and a ClusterQueue of `gpus` GPUs (CPU and memory plentiful), open to every namespace."""
    return [
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": preemption},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [{
                "name": flavor, "resources": [{"name": "cpu", "nominalQuota": "1000"},
                                              {"name": "memory", "nominalQuota": "10Ti"},
                                              {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}]}},
    ]


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue_name}}


def priority_class(name: str, value: int) -> dict[str, Any]:
    """A WorkloadPriorityClass (Kueue's own; the label kueue.x-k8s.io/priority-class names it)."""
    return {"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}


def wait_quota_free(kubectl: Any, cluster_queue_name: str, timeout: float = 180.0) -> None:
    """Wait until no Workload holds quota in the ClusterQueue: a test that needs its GPUs must not start while the
    jobs of a namespace still being deleted (an earlier test's) hold them. Fails naming the holders."""
    deadline = time.monotonic() + timeout
    while True:
        st = kubectl.json("get", "clusterqueues.kueue.x-k8s.io", cluster_queue_name).get("status") or {}
        if not st.get("reservingWorkloads") and not st.get("admittedWorkloads"):
            return
        if time.monotonic() > deadline:
            holders = [f"{w['metadata']['namespace']}/{w['metadata']['name']}"
                       for w in kubectl.json("get", "workloads.kueue.x-k8s.io", "-A")["items"]
                       if (w.get("status") or {}).get("admission")]
            raise AssertionError(f"ClusterQueue {cluster_queue_name} still held after {timeout}s by {holders}")
        time.sleep(1)
