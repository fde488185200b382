"""The operator a `helm install` of the chart deploys, run for a test control plane (which has no kubelet for it):
the chart's Deployment as a container from our operator image, or the operator as a process from this checkout,
either way under the chart's ServiceAccount (its token, so the chart's least-privilege RBAC applies)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tests.support.containers import OperatorContainer
from tests.support.controlplane import free_port
from tests.support.operator_process import OperatorProcess


def ports_of_its_own(deployment: dict) -> dict:
    """The Deployment with free ports for its container's health and metrics endpoints (in its args, env and
    ports, probes follow by name). In a cluster each pod has its own network; `podman --network host` shares this
    machine's, where the other containers module's operator may be listening at the same time."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for port in container.get("ports", []):
        old, new = port["containerPort"], free_port()
        port["containerPort"] = new
        container["args"] = [f"{a[:-len(str(old))]}{new}" if a.startswith("--") and a.endswith(f"={old}") else a
                             for a in container.get("args", [])]
        for env in container.get("env", []):
            if env.get("value") == str(old):
                env["value"] = str(new)
    return deployment


def start_installed_operator(runtime: str, control_plane, kubectl, workdir: Path, release: str, namespace: str):
    """The installed release's operator, started: `runtime` "containers" runs its Deployment with the image the
    chart was given, "processes" this checkout's operator. Returns it (stop() ends it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    token = kubectl.run("create", "token", f"{release}-operator", "-n", namespace, "--duration=2h").stdout.strip()
    if runtime == "containers":
        deployment = kubectl.json("get", "deployment", f"{release}-operator", "-n", namespace)
        # A name per pytest-xdist worker: starting a container removes any of the same name, and two workers may
        # each run a containers module at once (their own control planes, one podman).
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        return OperatorContainer(ports_of_its_own(deployment), token, control_plane, workdir,
                                 name=f"{release}-operator-{worker}").start()
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    (workdir / "kubeconfig").write_text(yaml.safe_dump(config))
    return OperatorProcess(workdir / "kubeconfig", control_plane.work / f"operator-{release}.log",
                           restart_backoff=1).start()
