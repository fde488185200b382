"""A stand-in for a cluster's dynamic volume provisioner: every claim left Pending gets a volume of its own.

What a storage class's provisioner does for `kubectl apply` of a PersistentVolumeClaim, so a page's commands run
as written on the test control plane: a PersistentVolume with the claim's access modes, size and class, bound to it
by claimRef (the controller-manager's binder completes the binding). The pod runners map a claim to a local
directory by its name, so the volume's hostPath is only a placeholder.

The test control plane runs no pvc-protection or pv-protection controller, which would lift the claims' and
volumes' protection finalizers once no pod uses them: `release()` does it for the claims provisioned here, so their
namespace can be deleted (and made again by the next test).
"""

from __future__ import annotations

import json
import threading
from typing import Any


class StandInProvisioner:
    def __init__(self, kubectl, namespace: str):
        self.kubectl, self.namespace = kubectl, namespace
        self.created: dict[tuple[str, str], str] = {}  # (namespace, claim) -> its volume
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> StandInProvisioner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.release()

    def release(self) -> None:
        """The provisioned claims and volumes deleted, their protection finalizers lifted (their pods are gone)."""
        self._stop.set()
        for claim, volume in self.created.items():
            namespace, name = claim
            self.kubectl.run("delete", "pvc", name, "-n", namespace, "--wait=false", "--ignore-not-found",
                             check=False)
            self.kubectl.run("patch", "pvc", name, "-n", namespace, "--type=merge", "-p",
                             '{"metadata": {"finalizers": null}}', check=False)
            self.kubectl.run("delete", "pv", volume, "--wait=false", "--ignore-not-found", check=False)
            self.kubectl.run("patch", "pv", volume, "--type=merge", "-p", '{"metadata": {"finalizers": null}}',
                             check=False)
        self.created.clear()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                claims = self.kubectl.json("get", "pvc", "-n", self.namespace)["items"]
                for claim in claims:
                    key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
                    if not claim["spec"].get("volumeName") and key not in self.created:
                        self._provision(claim)
            except Exception as exc:  # the test reads them
                self.errors.append(repr(exc))

    def _provision(self, claim: dict[str, Any]) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        name = f"pv-{meta['uid']}"
        volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                  "spec": {"capacity": {"storage": spec["resources"]["requests"]["storage"]},
                           "accessModes": spec["accessModes"],
                           "storageClassName": spec.get("storageClassName") or "",
                           "persistentVolumeReclaimPolicy": "Delete",
                           "hostPath": {"path": f"/tmp/stand-in-provisioner/{name}"},
                           "claimRef": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}}}
        self.kubectl.run("apply", "-f", "-", input=json.dumps(volume))
        self.created[(meta["namespace"], meta["name"])] = name
