"""A test-only kubelet: runs each scheduled trainer pod's container and reports its exit.

What a kubelet would do, and nothing the operator could rely on beyond that: the container's argv and env as
rendered (downward-API values filled from the pod), ConfigMap files materialised, volumes as local directories (the
output claim is one directory shared by all pods, like a ReadWriteMany volume), the ServiceAccount token where the
trainer reads it, and node 0's DNS name resolving to 127.0.0.1. When a pod is deleted its container's PID 1 gets
SIGTERM, then SIGKILL after the grace period; when it exits, the pod status gets the exit code and the termination
message.

The test kubelet also stands in for the cluster's network where a test asks it to: `network_env` gives every
container variables such as HF_ENDPOINT (a local Hub; without it, HF_HUB_OFFLINE=1 keeps pods off the Hub), and
`own_ports` gives each job's rendezvous a free port of this machine (pods here share its network, where the port a
spec names, e.g. the default 29500, may be taken by another test's pods), so a spec runs as written.

Two ways to run a container: `PodRunner` starts it as a local process from this checkout (mount paths rewritten to
the local directories; fast), `ContainerPodRunner` runs the pod's image with podman (tests/support/containers.py):
the real image, mounts at their pod paths, the pod's user, groups and read-only root.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.cli.local_run import extensions_dir
from finetune_operator.cli.processes import (
    argv_of,
    descendants,
    kill_tree,
    parent_of,
    training_process,
    with_argv,
)
from tests.support.controlplane import ROOT, free_port
from tests.support.pod_status import terminated

DEFAULT_GRACE_SECONDS = 30.0  # the kubelet's: SIGTERM, then SIGKILL after the pod's terminationGracePeriodSeconds
# A trainer pod whose log stays this long without a line gets its agent's and workers' threads dumped into it (their
# faulthandler on SIGUSR1): a pod that stalls on a loaded machine says where, before its test gives up on it.
SILENT_SECONDS = 90.0
MOST_DUMPS = 4  # per pod: a pod silent for good is not dumped for ever
AGENT_ARGV = b"finetune_trainer.agent"  # the agent and the workers it forks: the processes with the handler


def pressure() -> str:
    """The machine's load and CPU pressure at this moment, as a dump's context."""
    try:
        cpu = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        cpu = "no PSI"
    return f"load {os.getloadavg()[0]:.1f}, cpu {cpu}"


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: a variable defined earlier is substituted, $$ is a literal $, anything else
    stays as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


class LocalProcess:
    """A container run as a local process group."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def poll(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else (128 - code if code < 0 else code)  # killed by signal N: 128 + N

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        kill_tree(self.proc.pid)

    remove = kill  # what is left of a process group once the pod is gone: nothing

    def kill_worker(self) -> int:
        pid = training_process(descendants(self.proc.pid), argv_of, parent_of)
        os.kill(pid, signal.SIGKILL)
        return pid

    def pids(self) -> list[int]:
        return [self.proc.pid, *descendants(self.proc.pid)]


def write_service_account(directory: Path, token: str, ca: Path, namespace: str) -> Path:
    """What a kubelet projects at /var/run/secrets/kubernetes.io/serviceaccount: token, CA and namespace,
    readable by the container's user."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    shutil.copy(ca, directory / "ca.crt")
    (directory / "namespace").write_text(namespace)
    for f in directory.iterdir():
        f.chmod(0o644)
    return directory


class PodRunner:
    def __init__(self, kubectl, control_plane, namespace: str, workdir: Path, network_env: dict[str, str] | None = None,
                 own_ports: bool = False):
        self.kubectl, self.cp, self.namespace, self.workdir = kubectl, control_plane, namespace, workdir
        self.network_env, self.own_ports = dict(network_env or {}), own_ports
        self.ports: dict[str, int] = {}  # job name -> the free port its rendezvous gets (own_ports)
        self.processes: dict[str, Any] = {}  # pod name -> LocalProcess or a podman container
        self.reported: set[str] = set()
        self.terminating: dict[str, float] = {}
        self.grace: dict[str, float] = {}  # pod name -> its terminationGracePeriodSeconds
        self.dumps: dict[str, int] = {}  # pod name -> thread dumps asked of it (SILENT_SECONDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> PodRunner:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for proc in self.processes.values():
            proc.remove()

    def running(self, fragment: str) -> str:
        """The pod whose name holds fragment (e.g. "-a1-2-": attempt 1, node 2) whose container still runs: a pod
        of a job that restarts in place may have been replaced, and the one before it is still listed."""
        live = [name for name, proc in self.processes.items() if fragment in name and proc.poll() is None]
        if len(live) != 1:
            raise LookupError(f"{len(live)} running pods named *{fragment}*: {sorted(self.processes)}")
        return live[0]

    def kill(self, pod_name: str) -> None:
        """SIGKILL one node's container (every process in it), as a node loss or an OOM kill would."""
        self.processes[pod_name].kill()

    def kill_worker(self, pod_name: str) -> int:
        """SIGKILL one training process of a node (torchrun's worker, not its launcher or agent), as a crash of
        that process would end it; its pid."""
        return self.processes[pod_name].kill_worker()

    # --- the loop --------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:
                self.errors.append(repr(exc))
            time.sleep(0.3)

    def _tick(self) -> None:
        pods = self.kubectl.json("get", "pods", "-n", self.namespace, "-l", c.LABEL_JOB)["items"]
        alive = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        now = time.monotonic()
        for name, proc in self.processes.items():
            if name in alive or proc.poll() is not None:
                continue
            if name not in self.terminating:  # the pod is going away: SIGTERM to PID 1 (the launcher) first
                self.terminating[name] = now
                proc.stop()
            elif now - self.terminating[name] > self.grace.get(name, DEFAULT_GRACE_SECONDS):
                proc.kill()
        for pod in pods:
            name = pod["metadata"]["name"]
            if name not in alive:
                continue
            if name not in self.processes and pod["status"].get("phase") == "Running":
                self.grace[name] = float(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
                self.processes[name] = self._start(pod)
            proc = self.processes.get(name)
            if proc is not None and proc.poll() is not None and name not in self.reported:
                self._report(pod, proc.poll())
                self.reported.add(name)
            elif proc is not None and proc.poll() is None:
                self._dump_if_silent(name, proc)

    def _dump_if_silent(self, name: str, proc: Any) -> None:
        log = self.workdir / "pods" / name / "log"
        try:
            silent = time.time() - log.stat().st_mtime
        except OSError:
            return
        if silent < SILENT_SECONDS or self.dumps.get(name, 0) >= MOST_DUMPS:
            return
        self.dumps[name] = self.dumps.get(name, 0) + 1
        pids = with_argv(proc.pids(), argv_of, (AGENT_ARGV,))
        line = f"test kubelet: {name} silent for {silent:.0f}s ({pressure()}); SIGUSR1 to {pids}\n"
        sys.stderr.write(line)  # in the test's captured output too
        with open(log, "a") as out:  # also marks the log written: the next dump comes after another silence
            out.write(line)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                continue

    # --- one container ---------------------------------------------------------------------------------------
    def _local_mounts(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        """Pod mount path -> local directory: one per volume mount (the claim's, with its subPath, shared)."""
        root = self.workdir / "pods" / pod["metadata"]["name"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts: dict[str, str] = {}
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume:
                local = self.workdir / "pvc" / volume["persistentVolumeClaim"]["claimName"] / mount.get("subPath", "")
            else:
                local = root / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = str(local)
        return mounts

    def _write_config_maps(self, pod: dict[str, Any], container: dict[str, Any], mounts: dict[str, str],
                           rewrite: dict[str, str]) -> None:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                data = self.kubectl.json("get", "configmap", volume["configMap"]["name"], "-n", self.namespace)
                for key, content in data["data"].items():
                    # The trainer's config (JSON) names pod paths; a user's ConfigMap (reward code) is written as is.
                    if mount["name"] == c.CONFIG_VOLUME:
                        content = json.dumps(remap(json.loads(content), rewrite))
                    Path(mounts[mount["mountPath"]], key).write_text(content)

    def _start(self, pod: dict[str, Any]) -> LocalProcess:
        name = pod["metadata"]["name"]
        root = self.workdir / "pods" / name
        container = next(ct for ct in pod["spec"]["containers"] if ct["name"] == c.CONTAINER_NAME)
        mounts = self._local_mounts(pod, container)
        # The config files name paths in the other volumes (/output, ...): rewritten to the local directories.
        self._write_config_maps(pod, container, mounts, rewrite=mounts)
        env = {"PATH": os.environ["PATH"], "HOME": str(root), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")]),
               "FINETUNE_TERMINATION_LOG": str(root / "termination-log"), **self._network(),
               "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.cp.api_port),
               "FINETUNE_SERVICEACCOUNT_DIR": str(self._service_account(pod, root))}
        for item in container["env"]:
            value = remap(expand(item["value"], env), mounts) if "value" in item else self._value_from(pod, item)
            if value is not None:
                env[item["name"]] = value
        self._own_port(pod, env)
        env["PET_MASTER_ADDR"] = "127.0.0.1"  # the headless-Service name of node 0, resolved as DNS would
        if "PET_LOCAL_ADDR" in env:  # the pod's own name (a job that restarts in place), resolved the same way
            env["PET_LOCAL_ADDR"] = "127.0.0.1"
        env["TORCH_EXTENSIONS_DIR"] = str(extensions_dir())  # this environment's builds, as `finetune run` keeps them
        argv = [sys.executable if arg == "python" else remap(arg, mounts) for arg in container["command"]]
        log = open(root / "log", "ab")  # noqa: SIM115 - owned by the process
        return LocalProcess(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True))

    def _network(self) -> dict[str, str]:
        """What this machine's network gives a container: no Hub (HF_HUB_OFFLINE) unless a stand-in is named."""
        return self.network_env if "HF_ENDPOINT" in self.network_env else {"HF_HUB_OFFLINE": "1",
                                                                             **self.network_env}

    def _own_port(self, pod: dict[str, Any], env: dict[str, str]) -> None:
        """own_ports: the job's rendezvous on a free port of this machine, the same for every pod of the job."""
        if self.own_ports and c.ENV_PET_MASTER_PORT in env:
            job = pod["metadata"]["labels"][c.LABEL_JOB]
            env[c.ENV_PET_MASTER_PORT] = str(self.ports.setdefault(job, free_port()))

    def _service_account(self, pod: dict[str, Any], root: Path) -> Path:
        # Bound to the pod, as a kubelet's projected token is: the chart's admission policy reads the pod name.
        token = self.kubectl.run("create", "token", pod["spec"]["serviceAccountName"], "-n", self.namespace,
                                 "--bound-object-kind=Pod", f"--bound-object-name={pod['metadata']['name']}",
                                 f"--bound-object-uid={pod['metadata']['uid']}", "--duration=1h").stdout.strip()
        return write_service_account(root / "serviceaccount", token, self.cp.work / "certs" / "apiserver.crt",
                                     pod["metadata"]["namespace"])

    def _value_from(self, pod: dict[str, Any], item: dict[str, Any]) -> str | None:
        secret = item["valueFrom"].get("secretKeyRef")
        if secret is not None:  # read from the apiserver, as the kubelet does (a missing one fails the test)
            data = self.kubectl.json("get", "secret", secret["name"], "-n", self.namespace)["data"]
            if secret.get("optional") and secret["key"] not in data:
                return None  # an optional key the Secret lacks: no variable, as the kubelet does
            return base64.b64decode(data[secret["key"]]).decode()
        path = item["valueFrom"]["fieldRef"]["fieldPath"]
        if path == "metadata.name":
            return pod["metadata"]["name"]
        if path == "metadata.namespace":
            return pod["metadata"]["namespace"]
        for field in ("annotations", "labels"):  # e.g. JOB_COMPLETION_INDEX, added by the Job controller
            prefix = f"metadata.{field}['"
            if path.startswith(prefix):
                return pod["metadata"][field][path.removeprefix(prefix).removesuffix("']")]
        raise KeyError(f"unsupported fieldRef {path}")

    def _report(self, pod: dict[str, Any], code: int) -> None:
        message_file = self.workdir / "pods" / pod["metadata"]["name"] / "termination-log"
        message = message_file.read_text()[:4096] if message_file.exists() else ""
        self.kubectl.run("patch", "pod", pod["metadata"]["name"], "-n", self.namespace, "--subresource=status",
                         "--type=merge", "-p", json.dumps(terminated(code, message=message)), check=False)


def remap(value: Any, mounts: dict[str, str]) -> Any:
    """Pod paths -> local paths, inside strings, lists and mappings (the trainer config is JSON)."""
    if isinstance(value, str):
        for mount, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == mount or value.startswith(mount + "/"):
                return local + value[len(mount):]
        return value
    if isinstance(value, list):
        return [remap(v, mounts) for v in value]
    if isinstance(value, dict):
        return {k: remap(v, mounts) for k, v in value.items()}
    return value
