"""A real Kubernetes control plane on loopback: etcd, kube-apiserver (RBAC on), kube-controller-manager,
kube-scheduler and kwok with fake GPU nodes. Binaries come from hack/build-controlplane.sh (cached by version).

Every process is a child of the caller and is stopped by `stop()`; a component that fails to start raises with
the tail of its log, so a broken environment is loud instead of a hang.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from finetune_operator.cli.ports import free_port
from tests.support.port_retry import set_aside, start_on_free_ports

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "finetunejob-test-admin-token"
# A second admin whose every request the apiserver audits: the operator under measurement runs as it.
AUDITED_TOKEN = "finetunejob-test-audited-token"
AUDITED_USER, AUDITED_GROUP = "operator-under-test", "finetunejob:audited"
# Operator replicas told apart in the audit log (who wrote what, and when), audited like the user above.
REPLICA_USERS = ("operator-replica-a", "operator-replica-b", "operator-replica-c", "operator-replica-d")
# The chart's operator run as pods (tests/support/operator_pods.py) is installed here: its ServiceAccount's requests
# are audited too, each told apart by the pod its token is bound to.
AUDITED_RELEASE_NAMESPACE = "finetunejob-ha"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata",
               "userGroups": [AUDITED_GROUP, f"system:serviceaccounts:{AUDITED_RELEASE_NAMESPACE}"]},
              {"level": "None"}],
}
# Client rate limits sized for a 500-node cluster, as production control planes set them; the defaults (20 qps for
# the controller manager) would measure client-go's throttle, not the operator.
CLIENT_QPS = ["--kube-api-qps=300", "--kube-api-burst=600"]
# The Go components' garbage collector ran a fifth of the apiservers' CPU in the suite (pprof) on a 2-core machine
# with memory to spare: collect half as often (a larger heap, a few hundred MiB in all), unless GOGC is set.
GO_ENV = {"GOGC": "200"}
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# A kubelet runs init containers first (Kubeflow PyTorchJob workers have one): the general stages do that too.
KWOK_STAGES = ("node/fast/node-initialize.yaml", "pod/general/pod-create.yaml",
               "pod/general/pod-init-container-running.yaml", "pod/general/pod-init-container-completed.yaml",
               "pod/general/pod-ready.yaml")
OUR_STAGES = ("pod-fail-on-request.yaml", "pod-delete-after-checkpoint.yaml", "pod-image-pull-fails.yaml")


def build_binaries() -> Path:
    """Runs the project's build script (instant when cached) and returns the directory of the binaries."""
    proc = subprocess.run(["bash", str(ROOT / "hack" / "build-controlplane.sh")], check=True, text=True,
                          stdout=subprocess.PIPE)
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass
class ControlPlane:
    bin_dir: Path
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ftj-controlplane-")))
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    api_port: int = 0
    apiserver_args: list[str] = field(default_factory=list)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.work / "kubeconfig"

    @property
    def audited_kubeconfig(self) -> Path:
        """Admin rights, but every request lands in audit_log: for counting what the operator asks."""
        return self.work / "kubeconfig-audited"

    def replica_kubeconfig(self, user: str) -> Path:
        """Admin rights as `user` (one of REPLICA_USERS), audited: one operator replica each."""
        return self.work / f"kubeconfig-{user}"

    @property
    def audit_log(self) -> Path:
        return self.work / "audit.log"

    def start(self) -> ControlPlane:
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig(self.kubeconfig, ADMIN_TOKEN)
            self._write_kubeconfig(self.audited_kubeconfig, AUDITED_TOKEN)
            for user in REPLICA_USERS:
                self._write_kubeconfig(self.replica_kubeconfig(user), f"{user}-token")
            self._start("kube-controller-manager", [
                "--kubeconfig", str(self.kubeconfig), "--leader-elect=false", "--secure-port=0",
                # resourcequota-controller: a ResourceQuota is enforced only once it has computed its usage;
                # clusterrole-aggregation-controller: the built-in admin/edit/view roles gather the chart's user
                # roles as in a real cluster (the tenancy tests act as users bound to them); deployment, replicaset
                # and disruption controllers: the chart's operator Deployment rolls out and its PodDisruptionBudget
                # holds (tests/cluster/test_operator_pods.py).
                "--controllers=garbage-collector-controller,job-controller,namespace-controller,"
                "serviceaccount-controller,persistentvolume-binder-controller,resourcequota-controller,"
                "clusterrole-aggregation-controller,deployment-controller,replicaset-controller,"
                "disruption-controller",
                "--concurrent-job-syncs=20", *CLIENT_QPS,
            ])
            self._start("kube-scheduler", [
                # No HTTPS endpoint: nothing reads it, and a port picked here could be taken before the bind
                # (the scheduler would exit unseen and no pod would ever be scheduled).
                "--kubeconfig", str(self.kubeconfig), "--leader-elect=false", "--secure-port=0", *CLIENT_QPS,
            ])
            stages = [a for s in KWOK_STAGES for a in ("--config", str(self.bin_dir / "kwok-stages" / s))]
            stages += [a for s in OUR_STAGES for a in ("--config", str(ROOT / "tests" / "support" / "kwok" / s))]
            self._start("kwok", [
                "--kubeconfig", str(self.kubeconfig), "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                "--server-address=", *stages,
            ])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, remove: bool = False) -> None:
        """Stops every component; `remove` also deletes the working directory (~100 MB: etcd's data, the logs, the
        audit log), for a run that passed. Otherwise the directory stays for its logs, and says where it is."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
        if remove:
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            print(f"control plane's directory kept: {self.work}", file=sys.stderr)

    def exited(self) -> dict[str, str]:
        """The components that have stopped, each with the end of its log: what to say when the cluster stands still."""
        return {name: f"exit {proc.returncode}: {self.log_tail(name, 10)}"
                for name, proc in self.procs.items() if proc.poll() is not None}

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.work / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    # --- components -------------------------------------------------------------------------------------------
    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen([str(self.bin_dir / name), *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**GO_ENV, **os.environ})
        self.procs[name] = proc
        return proc

    def _forget(self, name: str, *paths: Path) -> Callable[[], None]:
        """Clears a component that could not start, for another start on other ports: its process, its data, and
        its log (kept aside: the next start's log says only its own story)."""
        def forget() -> None:
            proc = self.procs.pop(name, None)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            set_aside(self.work / f"{name}.log")
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)
        return forget

    def _start_etcd(self) -> None:
        start_on_free_ports(self._start_etcd_once, self._forget("etcd", self.work / "etcd"))

    def _start_etcd_once(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._start("etcd", [
            "--name=default", f"--data-dir={self.work / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}", "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])
        self._wait("etcd", lambda: _http_ok(f"{self.etcd_url}/health"), timeout=60)

    def _start_apiserver(self) -> None:
        start_on_free_ports(self._start_apiserver_once, self._forget("kube-apiserver", self.work / "certs"))

    def _start_apiserver_once(self) -> None:
        self.api_port = free_port()
        sa_key = self.work / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True)
        tokens = self.work / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n'
                          f'{AUDITED_TOKEN},{AUDITED_USER},audited-uid,"system:masters,{AUDITED_GROUP}"\n'
                          + "".join(f'{user}-token,{user},{user}-uid,"system:masters,{AUDITED_GROUP}"\n'
                                    for user in REPLICA_USERS))
        policy = self.work / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self._start_apiserver_process([
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}", "--audit-log-maxsize=0",
            f"--token-auth-file={tokens}", *self.apiserver_args,
        ])

    def restart_apiserver(self) -> None:
        """Stop and start kube-apiserver on the same port and etcd: what a control-plane upgrade looks like."""
        proc = self.procs.pop("kube-apiserver")
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:  # open watches can hold a graceful shutdown for minutes
            proc.kill()
            proc.wait()
        self._start_apiserver_process(self._apiserver_extra)

    def _start_apiserver_process(self, extra: list[str]) -> None:
        self._apiserver_extra = extra
        sa_key = self.work / "sa.key"
        self._start("kube-apiserver", [
            f"--etcd-servers={self.etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}", f"--cert-dir={self.work / 'certs'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--service-account-issuer=https://127.0.0.1:{self.api_port}/",
            f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
            "--authorization-mode=RBAC", "--allow-privileged=true", "--enable-admission-plugins=PodSecurity",
            *extra,
        ])
        self._wait("kube-apiserver", lambda: _http_ok(f"{self.server}/readyz", ADMIN_TOKEN), timeout=120)

    def _write_kubeconfig(self, path: Path, token: str) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.server, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin", "namespace": "default"}}],
        }
        path.write_text(yaml.safe_dump(config))

    def _wait(self, name: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            if ready():
                return
            time.sleep(0.25)
        raise RuntimeError(f"{name} not ready after {timeout}s:\n{self.log_tail(name)}")


def _http_ok(url: str, token: str | None = None) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    context = ssl._create_unverified_context()  # loopback test server with a self-signed certificate
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def fake_gpu_node(name: str, gpus: int = 8) -> dict:
    """A Node that kwok manages (annotation) with GPU capacity, so the real scheduler places GPU pods on it."""
    capacity = {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": str(gpus),
                "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                     "labels": {"kubernetes.io/hostname": name, "type": "kwok", "nvidia.com/gpu.present": "true"}},
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity, "nodeInfo": {"kubeletVersion": "fake"}},
    }
