"""Operator replicas with leader election, as the chart runs them, each as its own audited user."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from tests.support import audit
from tests.support.controlplane import free_port
from tests.support.operator_process import OperatorProcess

LEASE = "finetunejob-operator"


def replica(control_plane, lease_namespace: str, user: str, workdir: Path, server: str | None = None,
            env: dict[str, str] | None = None, leader_elect: bool = True) -> OperatorProcess:
    """One replica (not started) as `user`, its health endpoint on a free port (`op.health_port`); `server`
    replaces the apiserver address (a proxy in front of it)."""
    kubeconfig = control_plane.replica_kubeconfig(user)
    if server is not None:
        kubeconfig = with_server(kubeconfig, server, workdir / f"kubeconfig-{user}-proxied")
    port = free_port()
    op = OperatorProcess(kubeconfig, workdir / f"{user}.log", restart_backoff=1, env=env,
                         args=(f"--health-port={port}", *(("--leader-elect", f"--lease-namespace={lease_namespace}",
                                                           f"--lease-name={LEASE}", f"--identity={user}")
                                                          if leader_elect else ())))
    op.health_port = port  # type: ignore[attr-defined]
    return op


def with_server(kubeconfig: Path, server: str, path: Path) -> Path:
    """A copy of `kubeconfig` at `path` that talks to `server` (the client resets a host set in code to the
    kubeconfig's own before every request: its token refresh hook)."""
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = server
    path.write_text(yaml.safe_dump(config))
    return path


def proxied_kubeconfig(kubeconfig: Path, proxy, workdir: Path) -> Path:
    return with_server(kubeconfig, f"https://127.0.0.1:{proxy.port}", workdir / f"{kubeconfig.name}-{proxy.port}")


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


def takeover(control_plane, user: str, since: float, timeout: float = 10.0) -> float:
    """When `user` first wrote the Lease successfully after `since` (epoch seconds, as the apiserver received it):
    the moment it led. Read from the audit log, which is written asynchronously (polled until it shows)."""
    deadline = time.monotonic() + timeout
    while True:
        for event in audit.events(control_plane.audit_log, start=since, user=user):
            if (event["verb"] in ("update", "create") and event["objectRef"].get("resource") == "leases"
                    and 200 <= (event.get("responseStatus") or {}).get("code", 0) < 300):
                return audit.received(event)
        if time.monotonic() > deadline:
            raise AssertionError(f"no Lease write by {user} since {since} in the audit log")
        time.sleep(0.3)
