"""A test kubelet for the operator's own pods: the chart's Deployment, its ReplicaSets and their pods are the real
controllers' (the test control plane runs the deployment, replicaset and disruption controllers), and the pods they
place on this kubelet's nodes run the operator as local processes from this checkout.

What a kubelet does, and what a rollout, a PodDisruptionBudget and a failover rely on:
- its nodes are Ready and tainted (`TAINT`): only pods that tolerate it (values(): the chart's tolerations and
  nodeSelector) land here, never another test's trainer pods;
- a pod's container is started with its args and env (downward API filled from the pod), its ServiceAccount's
  token bound to the pod (in a kubeconfig: processes share this machine, so the projected in-cluster path cannot
  be each pod's own), and a port of its own for each container port named in the args (one network for all);
- the startup probe runs every `periodSeconds` until it passes, then the readiness probe at once and every
  `periodSeconds`: Ready is what the operator's /healthz answers (liveness is not run);
- a container that exits is restarted (restartPolicy Always) with restartCount + 1;
- a deleted pod's container gets SIGTERM, SIGKILL after terminationGracePeriodSeconds, and the pod is then removed
  (the kubelet's final delete with grace 0).
Statuses are written to the apiserver as a kubelet writes them (pods/status).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.support.controlplane import ROOT, free_port

TAINT = "finetunejob.dev/test-kubelet"
NODE_LABEL = {TAINT: "operator"}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    pod: str
    namespace: str
    uid: str
    proc: subprocess.Popen
    health_port: int
    started_at: str
    spec: dict[str, Any]
    restarts: int = 0
    started: bool = False  # the startup probe passed
    ready: bool = False
    next_probe: float = 0.0
    last_exit: int | None = None
    stopping_since: float | None = None
    written: dict[str, Any] = field(default_factory=dict)

    def exited(self) -> bool:
        return self.proc.poll() is not None


class OperatorKubelet:
    def __init__(self, control_plane, workdir: Path, nodes: tuple[str, ...] = ("operator-node-0", "operator-node-1"),
                 server_for=None):
        self.cp, self.workdir, self.nodes = control_plane, workdir, nodes
        self.server_for = server_for or (lambda pod: control_plane.server)  # e.g. a proxy per pod
        self.api = config.new_client_from_config(str(control_plane.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.containers: dict[str, Container] = {}  # pod uid -> its container
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="operator-kubelet", daemon=True)

    @staticmethod
    def values() -> list[str]:
        """helm --set values that place the chart's operator pods on this kubelet's nodes."""
        key = TAINT.replace(".", "\\.")
        return [f"nodeSelector.{key}=operator", f"tolerations[0].key={TAINT}", "tolerations[0].operator=Exists",
                "tolerations[0].effect=NoSchedule"]

    def __enter__(self) -> OperatorKubelet:
        for name in self.nodes:
            capacity = {"cpu": "4", "memory": "8Gi", "pods": "10"}
            self.core.create_node({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **NODE_LABEL}},
                "spec": {"taints": [{"key": TAINT, "value": "operator", "effect": "NoSchedule"}]},
                "status": {"capacity": capacity, "allocatable": capacity}})
            # The apiserver's TaintNodesByCondition marks a new node not-ready; a kubelet's first status lifts it.
            self._node_ready(name)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for container in self.containers.values():
            _kill(container.proc)
        for name in self.nodes:
            with contextlib.suppress(client.ApiException):
                self.core.delete_node(name)

    def _node_ready(self, name: str) -> None:
        now = _now()
        self.core.patch_node_status(name, {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test kubelet",
             "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
        node = self.core.read_node(name)
        taints = [t for t in node.spec.taints or [] if t.key == TAINT]
        self.core.patch_node(name, {"spec": {"taints": [{"key": t.key, "value": t.value, "effect": t.effect}
                                                        for t in taints]}})

    # --- what a test asks --------------------------------------------------------------------------------------
    def container(self, pod_name: str) -> Container:
        return next(c for c in self.containers.values() if c.pod == pod_name)

    def kill(self, pod_name: str) -> None:
        """SIGKILL the pod's container (a crash, an OOM kill): the kubelet restarts it."""
        self.container(pod_name).proc.kill()

    def signal(self, pod_name: str, sig: signal.Signals) -> None:
        self.container(pod_name).proc.send_signal(sig)

    def log_tail(self, pod_name: str, lines: int = 40) -> str:
        path = self.workdir / f"{pod_name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    # --- the loop -------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # a tick that failed is tried again; the test reads the errors
                self.errors.append(repr(exc))
            self._stop.wait(0.3)

    def _tick(self) -> None:
        pods = [p for node in self.nodes
                for p in self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items]
        seen = set()
        for pod in pods:
            uid = pod.metadata.uid
            seen.add(uid)
            container = self.containers.get(uid)
            if pod.metadata.deletion_timestamp is not None:
                self._terminate(pod, container)
                continue
            if container is None:
                container = self.containers[uid] = self._start(pod)
            elif container.exited():  # restartPolicy Always
                container.last_exit = _exit_code(container.proc.returncode)
                replacement = self._start(pod)
                replacement.restarts, replacement.last_exit = container.restarts + 1, container.last_exit
                container = self.containers[uid] = replacement
            self._probe(pod, container)
            self._write_status(pod, container)
        for uid in [u for u in self.containers if u not in seen]:  # gone without us (force-deleted)
            _kill(self.containers.pop(uid).proc)

    def _terminate(self, pod: client.V1Pod, container: Container | None) -> None:
        if container is not None and not container.exited():
            now = time.monotonic()
            if container.stopping_since is None:
                container.stopping_since = now
                container.proc.send_signal(signal.SIGTERM)
            elif now - container.stopping_since > (pod.spec.termination_grace_period_seconds or 30):
                container.proc.kill()
            return
        self.containers.pop(pod.metadata.uid, None)
        try:  # the kubelet's final word: the pod is gone
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)))
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    # --- one container --------------------------------------------------------------------------------------
    def _start(self, pod: client.V1Pod) -> Container:
        spec = self.api.sanitize_for_serialization(pod.spec)
        (container,) = spec["containers"]
        name, namespace = pod.metadata.name, pod.metadata.namespace
        health = free_port()
        args = [f"--health-port={health}" if a.startswith("--health-port=") else a for a in container.get("args", [])]
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        downward = {"metadata.name": name, "metadata.namespace": namespace}
        for item in container.get("env", []):
            if "valueFrom" in item:
                env[item["name"]] = downward[item["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                env[item["name"]] = item.get("value", "")
        if "FINETUNE_METRICS_PORT" in env:  # one network for every pod here: a port of its own
            env["FINETUNE_METRICS_PORT"] = str(free_port())
        env.update(KUBECONFIG=str(self._credentials(pod)), PYTHONWARNINGS="ignore:Unverified HTTPS request",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")]))
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        # The image's entrypoint (Dockerfile): python -m finetune_operator.controller
        proc = subprocess.Popen([sys.executable, "-m", "finetune_operator.controller", *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        return Container(pod=name, namespace=namespace, uid=pod.metadata.uid, proc=proc, health_port=health,
                         started_at=_now(), spec=container)

    def _credentials(self, pod: client.V1Pod) -> Path:
        """The pod's ServiceAccount token, bound to the pod (so the audit log names the pod), in a kubeconfig."""
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[f"https://127.0.0.1:{self.cp.api_port}/"], expiration_seconds=3600,
            bound_object_ref=client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod.metadata.name,
                                                           uid=pod.metadata.uid)))
        token = self.core.create_namespaced_service_account_token(pod.spec.service_account_name,
                                                                  pod.metadata.namespace, request).status.token
        path = self.workdir / f"{pod.metadata.name}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "c", "cluster": {"server": self.server_for(pod.metadata.name),
                                                   "insecure-skip-tls-verify": True}}],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "pod"}}]}))
        return path

    def _probe(self, pod: client.V1Pod, container: Container) -> None:
        now = time.monotonic()
        if now < container.next_probe:
            return
        probe = container.spec["startupProbe" if not container.started else "readinessProbe"]
        ok = _healthz(container.health_port, probe.get("timeoutSeconds", 1))
        if not container.started:
            container.started = ok
            if ok:  # the readiness probe runs as soon as the startup probe has passed
                container.ready = _healthz(container.health_port, container.spec["readinessProbe"].get(
                    "timeoutSeconds", 1))
                probe = container.spec["readinessProbe"]
        else:
            container.ready = ok
        container.next_probe = now + probe.get("periodSeconds", 10)

    def _write_status(self, pod: client.V1Pod, container: Container) -> None:
        running = not container.exited()
        ready = running and container.ready
        state = {"running": {"startedAt": container.started_at}} if running else {
            "terminated": {"exitCode": _exit_code(container.proc.returncode), "finishedAt": _now()}}
        status = {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "hostIP": "127.0.0.1",
            "startTime": pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.status.start_time else _now(),
            "conditions": [{"type": t, "status": "True" if ok else "False"} for t, ok in (
                ("PodScheduled", True), ("Initialized", True), ("ContainersReady", ready), ("Ready", ready))],
            "containerStatuses": [{
                "name": container.spec["name"], "image": container.spec["image"], "imageID": "",
                "containerID": f"test://{container.proc.pid}", "ready": ready, "started": container.started,
                "restartCount": container.restarts, "state": state,
                "lastState": {"terminated": {"exitCode": container.last_exit, "finishedAt": container.started_at}}
                if container.last_exit is not None else {}}],
        }
        if status == container.written:
            return
        now = _now()
        for condition in status["conditions"]:
            condition["lastTransitionTime"] = now
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})
        container.written = {**status, "conditions": [{k: v for k, v in cd.items() if k != "lastTransitionTime"}
                                                      for cd in status["conditions"]]}


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128 + N, as a runtime says


def _healthz(port: int, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
