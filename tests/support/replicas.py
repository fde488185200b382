"""Operator replicas with leader election, as the chart runs them, each as its own audited user."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from tests.support.controlplane import free_port
from tests.support.operator_process import OperatorProcess

LEASE = "finetunejob-operator"


def replica(control_plane, lease_namespace: str, user: str, workdir: Path, server: str | None = None,
            env: dict[str, str] | None = None, leader_elect: bool = True) -> OperatorProcess:
    """One replica (not started) as `user`, its health endpoint on a free port (`op.health_port`); `server`
    replaces the apiserver address (a proxy in front of it)."""
    kubeconfig = control_plane.replica_kubeconfig(user)
    if server is not None:
        config = yaml.safe_load(kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = server
        kubeconfig = workdir / f"kubeconfig-{user}-proxied"
        kubeconfig.write_text(yaml.safe_dump(config))
    port = free_port()
    op = OperatorProcess(kubeconfig, workdir / f"{user}.log", restart_backoff=1, env=env,
                         args=(f"--health-port={port}", *(("--leader-elect", f"--lease-namespace={lease_namespace}",
                                                           f"--lease-name={LEASE}", f"--identity={user}")
                                                          if leader_elect else ())))
    op.health_port = port  # type: ignore[attr-defined]
    return op


def health(op: OperatorProcess) -> tuple[int, dict] | None:
    """(HTTP status, report) of the replica's /healthz, or None while it does not answer."""
    url = f"http://127.0.0.1:{op.health_port}/healthz"  # type: ignore[attr-defined]
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None


def lease(kubectl, namespace: str) -> dict:
    """The Lease's spec ({} while there is none)."""
    found = kubectl.json_or_none("get", "lease", LEASE, "-n", namespace)
    return found["spec"] if found is not None else {}
