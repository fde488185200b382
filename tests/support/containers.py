"""Our images, run as real containers with podman (hack/podman.sh: the project's storage and settings).

`ContainerPodRunner` is the test kubelet's container mode: each trainer pod runs from the image its pod names, with
the pod's argv, env, user and groups, read-only root, dropped capabilities, volumes at their pod paths, the
ServiceAccount token and CA where in-cluster config reads them, and /dev/termination-log. `OperatorContainer` runs
the chart's operator Deployment the same way and probes its liveness endpoint as a kubelet would.

Host networking stands in for the pod network: the containers reach the test apiserver on 127.0.0.1, and node 0's
DNS name is an /etc/hosts entry for 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.cli.processes import descendants
from tests.support.controlplane import ROOT
from tests.support.pod_runner import PodRunner, expand, write_service_account
from tests.support.polling import wait_until

PODMAN = [str(ROOT / "hack" / "podman.sh")]


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, check=check, timeout=timeout)


@cache
def built_images() -> tuple[str, str]:
    """(operator image, trainer image, CPU variant), built by the project's script; hack/test.sh builds them before
    the tests and passes their names in FINETUNE_IMAGES (a build whose inputs are unchanged is skipped in a second;
    a source edit rebuilds the trainer on its virtualenv's image in seconds)."""
    named = os.environ.get("FINETUNE_IMAGES", "").split()
    if len(named) == 2 and all(podman("image", "exists", n, check=False).returncode == 0 for n in named):
        return named[0], named[1]
    out = subprocess.run(["bash", str(ROOT / "hack" / "build-images.sh")], capture_output=True, text=True,
                         timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"hack/build-images.sh failed ({out.returncode}):\n{out.stderr[-6000:]}")
    operator_image, trainer_image = out.stdout.split()[-2:]
    return operator_image, trainer_image


def memory_size(quantity: str) -> str:
    """A Kubernetes memory quantity as podman's size (1Gi -> 1073741824b)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return f"{int(float(quantity[: -len(suffix)]) * factor)}b"
    return f"{int(quantity)}b"


def security_args(pod_security: dict[str, Any], container_security: dict[str, Any]) -> list[str]:
    """The pod's and container's securityContext as podman flags (the container's fields win, as in Kubernetes)."""
    merged = {**pod_security, **container_security}
    args = []
    if "runAsUser" in merged:
        args += ["--user", f"{merged['runAsUser']}:{merged.get('runAsGroup', merged['runAsUser'])}"]
    if "fsGroup" in pod_security:
        args += ["--group-add", str(pod_security["fsGroup"])]
    if merged.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]  # no tmpfs /tmp, /run a pod would not have
    if merged.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if "ALL" in (merged.get("capabilities") or {}).get("drop", []):
        args += ["--cap-drop", "all"]
    return args


# Pod DNS names a container resolves (what the headless Service gives a cluster's pods): indexes 0 to this.
POD_NAMES_RESOLVED = 8


class PodmanContainer:
    """One running container; `podman run` stays attached, so its exit status is the container's."""

    def __init__(self, name: str, argv: list[str], log: Path):
        self.name = name
        # A loaded machine can still be removing a stopped container of this name: its name is free once it is gone.
        wait_until(f"the name {name} free of an old container", lambda: podman(
            "rm", "-f", "--ignore", name, check=False).returncode == 0 and podman(
            "container", "exists", name, check=False).returncode == 1, timeout=300, every=1)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([*PODMAN, "run", "--name", name, *argv], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        """SIGTERM to the container's PID 1, as a kubelet's stop does."""
        podman("kill", "--signal", "TERM", self.name, check=False)

    def kill(self) -> None:
        podman("kill", "--signal", "KILL", self.name, check=False)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def remove(self) -> None:
        self.kill()
        podman("rm", "-f", "--ignore", self.name, check=False)

    def kill_worker(self) -> int:
        """SIGKILL one training process inside the container (torchrun's worker, not the launcher or the agent)."""
        found = podman("exec", self.name, "python", "-c", KILL_WORKER, check=False)
        if found.returncode != 0 or not found.stdout.strip().isdigit():
            raise LookupError(f"no training process in {self.name}: {found.stdout} {found.stderr}")
        return int(found.stdout.strip())

    def pids(self) -> list[int]:
        """The container's processes, as this machine sees them (rootful podman: they are this machine's)."""
        found = podman("inspect", "--format", "{{.State.Pid}}", self.name, check=False, timeout=30)
        pid = int(found.stdout.strip() or 0) if found.returncode == 0 else 0
        return [pid, *descendants(pid)] if pid > 0 else []


# Run inside a trainer container (no procps there): SIGKILL a child of torchrun's agent (a training process).
KILL_WORKER = """
import os, signal
def argv(pid):
    try:
        return open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')
    except OSError:
        return []
def parent(pid):
    try:
        return int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])
    except OSError:
        return -1
pids = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]
agents = {p for p in pids if {b'finetune_trainer.agent', b'torch.distributed.run'} & set(argv(p))}
worker = next(p for p in sorted(pids) if parent(p) in agents)
os.kill(worker, signal.SIGKILL)
print(worker)
"""


def fs_group_volume(path: Path, gid: int) -> None:
    """What a kubelet does to a volume for the pod's fsGroup: group-owned, group-writable, setgid directories."""
    for p in [path, *path.rglob("*")]:
        os.chown(p, -1, gid)
        mode = p.stat().st_mode
        os.chmod(p, mode | 0o060 | (0o2010 if p.is_dir() else 0))


class ContainerPodRunner(PodRunner):
    def _start(self, pod: dict[str, Any]) -> PodmanContainer:
        name = pod["metadata"]["name"]
        root = self.workdir / "pods" / name
        spec = pod["spec"]
        container = next(ct for ct in spec["containers"] if ct["name"] == c.CONTAINER_NAME)
        mounts = self._local_mounts(pod, container)
        self._write_config_maps(pod, container, mounts, rewrite={})  # the container sees the pod's own paths
        volumes = {v["name"]: v for v in spec["volumes"]}
        pod_security = spec.get("securityContext", {})
        args = ["--network", "host", *security_args(pod_security, container.get("securityContext", {}))]
        for mount in container["volumeMounts"]:
            volume, local = volumes[mount["name"]], Path(mounts[mount["mountPath"]])
            if mount["mountPath"] == "/dev/shm":
                args += ["--shm-size", memory_size(volume["emptyDir"].get("sizeLimit", "64Mi"))]
                continue
            if "projected" in volume:  # kube-api-access-*: the ServiceAccount admission's token, CA and namespace
                local = self._service_account(pod, root)
            elif "emptyDir" in volume:
                local.chmod(0o777)  # an emptyDir is world-writable
            elif "persistentVolumeClaim" in volume and "fsGroup" in pod_security:
                fs_group_volume(local, pod_security["fsGroup"])
            args += ["--volume", f"{local}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
        termination = root / "termination-log"
        termination.touch()
        termination.chmod(0o666)
        args += ["--volume", f"{termination}:{container.get('terminationMessagePath', c.TERMINATION_MESSAGE_PATH)}"]
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.cp.api_port),
               # This machine's limits, not the pod's: no Hub to reach (unless a stand-in is named), two cores for
               # every container.
               **self._network(), "OMP_NUM_THREADS": "1"}
        for item in container["env"]:
            value = expand(item["value"], env) if "value" in item else self._value_from(pod, item)
            if value is not None:
                env[item["name"]] = value
        self._own_port(pod, env)
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        master = env[c.ENV_PET_MASTER_ADDR]
        args += ["--add-host", f"{master}:127.0.0.1"]
        # A job that restarts in place names each pod by its DNS name (PET_LOCAL_ADDR): every pod's must resolve.
        own, index = env.get(c.ENV_PET_LOCAL_ADDR), env.get(c.ENV_PET_NODE_RANK)
        if own and index is not None:
            head, _, tail = own.partition(f"-{index}.")
            args += [arg for i in range(POD_NAMES_RESOLVED) for arg in ("--add-host", f"{head}-{i}.{tail}:127.0.0.1")]
        args += ["--entrypoint", json.dumps(container["command"][:1]), container["image"],
                 *container["command"][1:], *container.get("args", [])]
        return PodmanContainer(name, args, root / "log")


STEP_DOWN = "leader election: lost the lead"  # finetune_operator.controller.main.lost(): an exit on purpose


class OperatorContainer:
    """The chart's operator Deployment (helm template) as a container, with a kubelet's liveness probe."""

    def __init__(self, deployment: dict[str, Any], token: str, control_plane, workdir: Path, name: str):
        self.deployment, self.token, self.cp, self.workdir, self.name = deployment, token, control_plane, workdir, name
        self.probes: list[int | str] = []  # liveness
        self.startup_probes: list[int | str] = []
        # Why each restart: "step-down" (the container's own log says it lost the lead and exited), "liveness", or
        # "exited <code>" (a crash: never expected).
        self.restarts: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a restart and stop() never interleave (no container left running)
        self._log_offset = 0

    def start(self) -> OperatorContainer:
        pod = self.deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        ca, namespace = self.cp.work / "certs" / "apiserver.crt", self.deployment["metadata"]["namespace"]
        sa_dir = write_service_account(self.workdir / "serviceaccount", self.token, ca, namespace)
        args = ["--network", "host", *security_args(pod.get("securityContext", {}),
                                                       container.get("securityContext", {})),
                "--volume", f"{sa_dir}:{c.SERVICEACCOUNT_DIR}:ro",
                *self._empty_dirs(pod, container),
                "--env", "KUBERNETES_SERVICE_HOST=127.0.0.1", "--env", f"KUBERNETES_SERVICE_PORT={self.cp.api_port}"]
        downward = {"metadata.namespace": namespace, "metadata.name": self.name}
        for item in container.get("env", []):
            value = downward[item["valueFrom"]["fieldRef"]["fieldPath"]] if "valueFrom" in item else item["value"]
            args += ["--env", f"{item['name']}={value}"]
        args += [container["image"], *container.get("args", [])]
        self.argv = args
        self.container = self._run()
        self._thread = threading.Thread(target=self._probe_loop, args=(container,), daemon=True)
        self._thread.start()
        return self

    def _empty_dirs(self, pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        args = []
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            assert "emptyDir" in volume, f"the operator pod mounts only emptyDirs, not {volume}"
            local = self.workdir / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            local.chmod(0o777)
            args += ["--volume", f"{local}:{mount['mountPath']}"]
        return args

    def _probe_loop(self, container: dict[str, Any]) -> None:
        """httpGet probes as the kubelet runs them: the startup probe until it answers once (failureThreshold
        failures restart the container), then liveness (failureThreshold failures in a row restart it). Liveness's
        period is the chart's, shortened so a test sees several probes; the tolerated silence stays the chart's.
        A container that exits by itself is restarted as restartPolicy Always does, after the kubelet's crash-loop
        back-off (10 s, doubling): a replica that lost its Lease exits on purpose and comes back as a standby."""
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        startup, liveness = container.get("startupProbe"), container["livenessProbe"]
        live_period = 2.0
        live_threshold = max(1, round(liveness.get("periodSeconds", 10) * liveness.get("failureThreshold", 3)
                                      / live_period))
        phase, failures, started = ("startup" if startup else "liveness"), 0, time.monotonic()
        quick = -1  # exits in a row, each after less than a minute of running
        while True:
            probe = startup if phase == "startup" else liveness
            period = probe.get("periodSeconds", 10) if phase == "startup" else live_period
            if self._stop.wait(period):
                return
            code = self.container.poll()
            if code is not None:
                own = self._own_log()
                self.restarts.append("step-down" if code == 1 and STEP_DOWN in own else f"exited {code}")
                # The kubelet's back-off doubles for exits in a row and starts over after a container ran a while
                # (10 min there; here 1 min, a test's scale).
                quick = quick + 1 if time.monotonic() - self._started < 60 else 0
                if self._stop.wait(min(300.0, 10.0 * 2 ** quick)):
                    return
                self._restart()
                phase, failures, started = ("startup" if startup else "liveness"), 0, time.monotonic()
                continue
            if time.monotonic() - started < probe.get("initialDelaySeconds", 0):
                continue
            port = probe["httpGet"]["port"]
            url = f"http://127.0.0.1:{ports.get(port, port)}{probe['httpGet']['path']}"
            record = self.startup_probes if phase == "startup" else self.probes
            try:
                with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1)) as response:
                    record.append(response.status)
                    failures = 0
                    phase = "liveness"
            except OSError as exc:
                record.append(repr(exc))
                failures += 1
            threshold = probe.get("failureThreshold", 3) if record is self.startup_probes else live_threshold
            if failures >= threshold:
                self.restarts.append(phase)
                self._restart()
                phase, failures, started = ("startup" if startup else "liveness"), 0, time.monotonic()

    def _run(self) -> PodmanContainer:
        log = self.workdir / "operator.log"
        self._log_offset = log.stat().st_size if log.exists() else 0
        self._started = time.monotonic()
        return PodmanContainer(self.name, self.argv, log)

    def _own_log(self) -> str:
        """What the running (or last) container wrote, not its predecessors."""
        with open(self.workdir / "operator.log", "rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def _restart(self) -> None:
        with self._lock:
            self.container.remove()
            if not self._stop.is_set():
                self.container = self._run()

    def crashes(self) -> list[str]:
        """Restarts a healthy operator never needs: any but a step-down."""
        return [why for why in self.restarts if why != "step-down"]

    def log_tail(self, lines: int = 60) -> str:
        path = self.workdir / "operator.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        self._stop.set()
        with self._lock:  # a restart under way ends first; none starts after
            pass
        self._thread.join(timeout=10)
        self.container.stop()
        try:
            self.container.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        self.container.remove()
