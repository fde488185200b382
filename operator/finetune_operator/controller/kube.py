"""The only module that talks to the Kubernetes API: server-side apply with owner references, deletes, the suspend
flag, the conditional status patch and the fresh read of a FineTuneJob after a conflict. Everything else is read
from the watch caches (handlers.py)."""

import threading
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from ..api import constants as c
from .fencing import FENCE, Fence, fence_client, fenced_configuration
from .observed import controller_reference, finetunejob_controller

FIELD_MANAGER = "finetunejob-operator"
# The nodes' shape is read at most this often (one list, only when a new job asks for GPUs), and not at all for a
# while after the chart's nodeShapeCheck is off (403): the check is a courtesy, never a reason to fail.
NODE_SHAPE_TTL_SECONDS = 60.0
NODE_SHAPE_FORBIDDEN_RETRY_SECONDS = 600.0
# Without the runtime CRDs (a chart from before them), whether they appeared is looked at this often.
RUNTIME_CRD_RETRY_SECONDS = 60.0


# What to do about a name clash, said with it (the job's status and a Warning Event).
CHILD_REMEDY = ("The operator never adopts or changes an object it did not create: rename or delete that object, or "
                "create the FineTuneJob under another name")
IDENTITY_REMEDY = ("The operator never adopts or changes an object it did not create, and finetunejob-trainer is its "
                   "trainer identity in every namespace (another job name would meet the same object): delete that "
                   "object (the operator then creates its own), or run the job as a ServiceAccount of yours "
                   "(spec.pod.serviceAccountName)")


class NameConflict(Exception):
    """Objects the job would create exist already and are not its own: nothing was written. The message ends with
    the remedy: a job's child is the job's name plus a suffix, the trainer identity has one name everywhere."""

    def __init__(self, conflicts: list[str], remedy: str = CHILD_REMEDY):
        super().__init__(f"{'; '.join(conflicts)}. {remedy}")
        self.conflicts = conflicts


def owner_conflict(obj: dict[str, Any], existing: dict[str, Any] | None, owner: dict[str, Any] | None
                   ) -> str | None:
    """Why `existing` (the object now under `obj`'s name) must not be applied over, or None when it is absent or
    ours: a job's child must have that job (its UID) as controller owner; namespace infrastructure (the trainer
    identity) must carry our managed-by label, which the chart's trainer-identity admission policy lets nobody but
    the operator (and cluster admins) set. A name alone proves nothing: a FineTuneJob `web` must never rewrite,
    adopt, and so later delete, a ConfigMap `web-config` somebody else made."""
    if existing is None:
        return None
    meta = existing.get("metadata") or {}
    if owner is not None:
        if finetunejob_controller(existing) == owner["metadata"]["uid"]:
            return None
    elif (meta.get("labels") or {}).get(c.LABEL_MANAGED_BY) == c.MANAGED_BY:
        return None
    controller = controller_reference(existing)
    if controller is not None:
        whose = f"owned by {controller.get('kind')} {controller.get('name')}"
        if controller.get("kind") == c.KIND and controller.get("name") == (owner or {}).get("metadata", {}).get(
                "name"):
            whose += " (an earlier FineTuneJob of this name, still being deleted)"
    else:
        managers = sorted({m.get("manager") for m in meta.get("managedFields") or [] if m.get("manager")})
        written = f", written by {', '.join(managers)}" if managers else ""
        whose = f"not owned by any object{written}"
    return f"{obj['kind']} {meta.get('name')} exists and is not this job's ({whose})"


# (connect, read) seconds. The client waits for ever by default, and a pooled connection lost without a reset (a
# NAT or load balancer that forgot it) would hang a reconcile pass for good; a read timeout drops that connection
# and the pass is retried on a new one. No request of ours streams or waits for the server on purpose. Writes of a
# leader are bounded tighter (fencing.py: leadership.Timing.write_timeout).
REQUEST_TIMEOUT: tuple[float, float] = (10.0, 30.0)


class Kube:
    def __init__(self, api_client: client.ApiClient):
        self.dyn = DynamicClient(api_client)
        self.quotas = self.dyn.resources.get(api_version="v1", kind="ResourceQuota")
        self.ftj = self.dyn.resources.get(api_version=c.API_VERSION, kind=c.KIND)
        self.jobs = self.dyn.resources.get(api_version="batch/v1", kind="Job")
        self.pods = self.dyn.resources.get(api_version="v1", kind="Pod")
        self.events = self.dyn.resources.get(api_version="v1", kind="Event")
        self.nodes = self.dyn.resources.get(api_version="v1", kind="Node")
        self.namespaces = self.dyn.resources.get(api_version="v1", kind="Namespace")
        self._runtime_resources: dict[str, tuple[Any, float]] = {}  # kind -> (resource or None, look again at)
        self._runtime_lock = threading.Lock()
        self._shape_lock = threading.Lock()
        self._shape: tuple[float, list[dict[str, Any]] | None] = (float("-inf"), None)  # (expires, nodes)

    @classmethod
    def from_environment(cls, connections: int = 16) -> "Kube":
        """In-cluster credentials in a pod, else $KUBECONFIG / ~/.kube/config."""
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            return cls.from_kubeconfig(None, connections)
        return cls._pooled(configuration, connections)

    @classmethod
    def from_kubeconfig(cls, path: str | None, connections: int = 16, fence: Fence = FENCE) -> "Kube":
        """Credentials from a kubeconfig file (None: $KUBECONFIG / ~/.kube/config)."""
        configuration = client.Configuration()
        config.load_kube_config(config_file=path, client_configuration=configuration)
        return cls._pooled(configuration, connections, fence)

    @classmethod
    def _pooled(cls, configuration: client.Configuration, connections: int, fence: Fence = FENCE) -> "Kube":
        """One pooled connection per worker thread (the client's default pool of 4 would serialise passes)."""
        configuration.connection_pool_maxsize = connections
        api_client = client.ApiClient(fenced_configuration(configuration))
        fence_client(api_client, REQUEST_TIMEOUT, fence)  # writes leave only while this replica leads (fencing.py)
        return cls(api_client)

    def _runtimes(self, kind: str) -> Any:
        """The runtime kind's resource, or None while its CRD is not installed (a chart before runtimes). Looked up
        by one thread at a time and an absence remembered for a while: a miss makes the client rediscover every
        API group, which is slow and not safe to run from several threads at once."""
        with self._runtime_lock:
            found, expires = self._runtime_resources.get(kind, (None, float("-inf")))
            if found is None and time.monotonic() >= expires:
                try:
                    found = self.dyn.resources.get(api_version=c.API_VERSION, kind=kind)
                except ResourceNotFoundError:
                    found = None
                self._runtime_resources[kind] = (found, time.monotonic() + RUNTIME_CRD_RETRY_SECONDS)
            return found

    def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A FineTuneRuntime (in `namespace`) or ClusterFineTuneRuntime, or None when there is none of that name."""
        resource = self._runtimes(kind)
        if resource is None:
            return None
        return self._get(resource, namespace if kind == c.RUNTIME_KIND else None, name)

    def default_runtimes(self, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The runtimes marked default: (this namespace's FineTuneRuntimes, the ClusterFineTuneRuntimes). Read
        only for a job that has not started and names none."""
        found = []
        for kind, ns in ((c.RUNTIME_KIND, namespace), (c.CLUSTER_RUNTIME_KIND, None)):
            resource = self._runtimes(kind)
            items = resource.get(namespace=ns).to_dict()["items"] if resource is not None else []
            found.append([r for r in items if (r.get("spec") or {}).get("default") is True])
        return found[0], found[1]

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """A namespace's labels: which ClusterFineTuneRuntimes its jobs may use (their namespaceSelector). Read only
        for a job that has not started, when such a runtime has a selector."""
        found = self._get(self.namespaces, None, namespace)
        return dict(((found or {}).get("metadata") or {}).get("labels") or {})

    def job_controllers(self, namespace: str, name: str) -> tuple[str, str | None] | None:
        """A batch Job's UID and the FineTuneJob that controls it (None: no FineTuneJob), or None when there is no
        such Job. Read only for a pod whose Job is not among the job's own in the cache."""
        found = self._get(self.jobs, namespace, name)
        return None if found is None else (found["metadata"]["uid"], finetunejob_controller(found))

    def get_finetunejob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self.ftj, namespace, name)

    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Every attempt's pods of one job: read when an attempt failed or a restart waits for the old gang."""
        return self.pods.get(namespace=namespace, label_selector=f"{c.LABEL_JOB}={name}").to_dict()["items"]

    def list_job_events(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """Events about one batch Job (FailedCreate: quota, admission): read only while its gang waits."""
        selector = f"involvedObject.kind=Job,involvedObject.name={job}"
        items: list[dict[str, Any]] = self.events.get(namespace=namespace, field_selector=selector).to_dict()["items"]
        return items

    def node_shapes(self) -> list[dict[str, Any]] | None:
        """Every node's name, labels, taints, unschedulable flag and allocatable resources (cached for a while:
        read for new jobs only), or None when the nodes cannot be read (no RBAC for it)."""
        with self._shape_lock:
            expires, shapes = self._shape
            if time.monotonic() >= expires:
                try:
                    nodes = self.nodes.get().to_dict()["items"]
                    shapes = [{"name": n["metadata"]["name"], "labels": n["metadata"].get("labels") or {},
                               "taints": (n.get("spec") or {}).get("taints") or [],
                               "unschedulable": bool((n.get("spec") or {}).get("unschedulable")),
                               "allocatable": (n.get("status") or {}).get("allocatable") or {}} for n in nodes]
                    expires = time.monotonic() + NODE_SHAPE_TTL_SECONDS
                except ApiException as exc:
                    if exc.status not in (401, 403):
                        raise
                    shapes = None
                    expires = time.monotonic() + NODE_SHAPE_FORBIDDEN_RETRY_SECONDS
                self._shape = (expires, shapes)
        return shapes

    def resource_quotas(self, namespace: str) -> list[dict[str, Any]] | None:
        """The namespace's ResourceQuotas (read for new jobs only), or None without the right to read them."""
        try:
            items: list[dict[str, Any]] = self.quotas.get(namespace=namespace).to_dict()["items"]
        except ApiException as exc:
            if exc.status not in (401, 403):
                raise
            return None
        return items

    def apply(self, obj: dict[str, Any], owner: dict[str, Any] | None = None, exists: bool = True) -> None:
        """Server-side apply of an object known to be ours (owner_conflict), with the owner reference set for a job's
        children (not for namespace infrastructure): idempotent, so a retried or repeated pass converges. An object
        not there yet is created (POST), so one that someone else creates meanwhile is refused, never merged into."""
        if owner is not None:
            meta = owner["metadata"]
            obj = {**obj, "metadata": {**obj["metadata"], "ownerReferences": [{
                "apiVersion": c.API_VERSION, "kind": c.KIND, "name": meta["name"], "uid": meta["uid"],
                "controller": True, "blockOwnerDeletion": True}]}}
        resource = self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        if not exists:
            try:
                resource.create(body=obj, namespace=namespace, field_manager=FIELD_MANAGER)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
                found = self._get(resource, namespace, name)  # created since it was read: whose is it?
                conflict = owner_conflict(obj, found, owner)
                if conflict is not None:
                    raise NameConflict([conflict], CHILD_REMEDY if owner is not None else IDENTITY_REMEDY) from None
        resource.server_side_apply(body=obj, name=name, namespace=namespace, field_manager=FIELD_MANAGER,
                                   force_conflicts=True)

    def apply_all(self, objects: list[dict[str, Any]], owner: dict[str, Any] | None = None) -> None:
        """In order: a job's config and Service exist before the pods that use them. Every object is read first:
        one that exists and is not ours (owner_conflict) stops the whole set before anything is written, so a name
        clash neither changes someone else's object nor leaves half a set of children."""
        found = [self._get(self.dyn.resources.get(api_version=o["apiVersion"], kind=o["kind"]),
                           o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects]
        conflicts = [why for obj, there in zip(objects, found, strict=True)
                     if (why := owner_conflict(obj, there, owner)) is not None]
        if conflicts:
            raise NameConflict(conflicts, CHILD_REMEDY if owner is not None else IDENTITY_REMEDY)
        for obj, there in zip(objects, found, strict=True):
            self.apply(obj, owner, exists=there is not None)

    def delete_workload(self, namespace: str, name: str) -> None:
        """Background propagation: the garbage collector removes the attempt's pods."""
        self._delete(self.jobs, namespace, name)

    def set_suspend(self, namespace: str, name: str, suspend: bool) -> None:
        """The operator's own suspend (no Kueue), marked so that a suspend by anyone else is told apart."""
        marked = {c.ANNOTATION_SUSPENDED: "true"} if suspend else {c.ANNOTATION_SUSPENDED: None}
        self.jobs.patch(name=name, namespace=namespace, body={"metadata": {"annotations": marked},
                                                              "spec": {"suspend": suspend}},
                        content_type="application/merge-patch+json")

    def set_deadline(self, namespace: str, name: str, seconds: int | None) -> None:
        """An attempt Job's own activeDeadlineSeconds (controller/deadlines.py); None removes it."""
        self.jobs.patch(name=name, namespace=namespace, body={"spec": {"activeDeadlineSeconds": seconds}},
                        content_type="application/merge-patch+json")

    def set_labels(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        """Labels of a queued (suspended, not admitted) attempt's Job, e.g. its Kueue queue name or priority class:
        Kueue updates the Job's Workload (both may change while the Job waits)."""
        self.jobs.patch(name=name, namespace=namespace, body={"metadata": {"labels": labels}},
                        content_type="application/merge-patch+json")

    def set_kueue_active(self, namespace: str, name: str, active: bool) -> None:
        """Deactivate (or activate again) a Kueue Workload: Kueue evicts it, suspending its Job and releasing the
        quota, the way Kueue's own users stop a workload (kubectl patch workload --type=merge spec.active)."""
        self._kueue_workloads().patch(name=name, namespace=namespace, body={"spec": {"active": active}},
                                      content_type="application/merge-patch+json")

    def _kueue_workloads(self):
        return self.dyn.resources.get(api_version=f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}", kind="Workload")

    def hold_kueue_workload(self, namespace: str, name: str, finetunejob: dict[str, Any],
                            pod_set_hash: str | None, since: str) -> None:
        """Make the FineTuneJob the controller owner of its failed attempt's admitted Workload, so that deleting
        that Job neither finishes the Workload (Kueue finishes those whose owner is gone) nor frees its quota; the
        pod-set hash says which next attempt may take it over (controller/queueing.py)."""
        meta = finetunejob["metadata"]
        self._kueue_workloads().patch(name=name, namespace=namespace, content_type="application/merge-patch+json",
                                      body={"metadata": {
                                          "ownerReferences": [{"apiVersion": c.API_VERSION, "kind": c.KIND,
                                                               "name": meta["name"], "uid": meta["uid"],
                                                               "controller": True, "blockOwnerDeletion": False}],
                                          "annotations": {c.ANNOTATION_POD_SET_HASH: pod_set_hash,
                                                          c.ANNOTATION_HELD_SINCE: since}}})

    def hand_kueue_workload(self, namespace: str, name: str, job_name: str) -> None:
        """Make the new attempt's Job (which names the Workload) its controller owner: Kueue starts it under the
        admission the Workload already has."""
        job = self.jobs.get(name=job_name, namespace=namespace)
        self._kueue_workloads().patch(name=name, namespace=namespace, content_type="application/merge-patch+json",
                                      body={"metadata": {"ownerReferences": [{
                                          "apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                          "uid": job.metadata.uid, "controller": True, "blockOwnerDeletion": True}]}})

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str
                     ) -> dict[str, Any]:
        """A merge patch (merge_patch.py) of the operator's own fields only, so the trainer's progress is never
        overwritten.

        resourceVersion makes it conditional: 409 Conflict if the object changed since the plan read it. Returns
        the object as written."""
        return self.ftj.status.patch(name=name, namespace=namespace,
                                     body={"metadata": {"resourceVersion": resource_version}, "status": status},
                                     content_type="application/merge-patch+json").to_dict()

    def post_event(self, obj: dict[str, Any], type: str, reason: str, message: str, instance: str) -> None:
        """A core/v1 Event about `obj`, as `kubectl describe` shows it ("From: finetunejob-operator"). Through this
        client, so Events are fenced like every other write (kopf's own poster, a queue drained later by another
        client, could post an Event after the Lease moved on)."""
        meta, now = obj["metadata"], datetime.now(UTC).isoformat()
        self.events.create(namespace=meta["namespace"], body={
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"namespace": meta["namespace"], "generateName": f"{c.APP_NAME}-"},
            "type": type, "reason": reason, "message": message, "action": reason,
            "reportingComponent": c.MANAGED_BY, "reportingInstance": instance, "source": {"component": c.MANAGED_BY},
            "involvedObject": {"apiVersion": obj.get("apiVersion", c.API_VERSION), "kind": obj.get("kind", c.KIND),
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
            "firstTimestamp": now, "lastTimestamp": now, "eventTime": now})

    def delete_finetunejob(self, namespace: str, name: str) -> None:
        self._delete(self.ftj, namespace, name)

    @staticmethod
    def _delete(resource, namespace: str, name: str) -> None:
        """Already gone is fine: deletes are repeated whenever a pass is."""
        try:
            resource.delete(name=name, namespace=namespace, body={"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status != 404:
                raise

    @staticmethod
    def _get(resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return resource.get(name=name, namespace=namespace).to_dict()
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
