"""The workload: one Indexed batch/v1 Job per attempt, one pod per node, torchrun in each.

Indexed Jobs are what Kueue and every cluster already understand; the completion index is the node rank and gives
each pod a stable hostname under the headless Service. backoffLimit 0: the operator owns gang restarts, so one
failed node fails the Job and the operator replaces the whole attempt. An attempt that restarts in place
(api/elastic.py) is the exception: its Job replaces a failed pod alone, and the operator counts those. A Job queued
in Kueue never fails by itself (a failed Job finishes its Workload and gives the quota up): the operator sees its
first failed pod, hands the admitted Workload to the next attempt and deletes the Job (controller/queueing.py).
"""

import hashlib
import json
from typing import Any

from ..api import constants as c
from ..api.constants import CACHE_VOLUME, CONFIG_VOLUME, OUTPUT_VOLUME, SHM_VOLUME, TMP_VOLUME
from ..api.elastic import in_place_restart_limit, restarts_in_place
from ..api.spec import FineTuneJobSpec
from ..api.volumes import Volume
from .context import RenderContext
from .env import trainer_env
from .grpo import reward_code_volumes
from .names import attempt_labels, config_map_name, service_name, workload_name
from .rbac import TRAINER_IDENTITY

# A queued attempt's Job: its pod failures are the operator's to act on, never a reason for the Job to fail.
KUEUE_BACKOFF_LIMIT = 2**31 - 1


def trainer_command(ctx: RenderContext) -> list[str]:
    """An argv list, never a shell string: the launcher waits for node 0's DNS name, then execs torchrun."""
    return ["python", "-m", "finetune_trainer.launch", "--config", f"{ctx.config_dir}/{c.CONFIG_FILE}"]


def _hash(value: Any) -> str:
    """The digest every annotation and status field of ours carries: 16 hex digits of the JSON's SHA-256."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _digest(spec: FineTuneJobSpec, exclude: set[str] | None = None) -> str:
    """Only the fields not at their default count (as in started_spec_digest): an operator upgrade that adds a field
    with a default leaves every Job's digest, so a suspended job it resumes is not taken as edited."""
    return _hash(spec.model_dump(mode="json", by_alias=True, exclude=exclude, exclude_defaults=True))


def spec_hash(spec: FineTuneJobSpec) -> str:
    """Stable digest of the spec, so the operator can tell which spec an attempt was rendered from."""
    return _digest(spec)


# What applies to the running attempt at once, without a new attempt (controller/lifecycle.py).
APPLIED_AT_ONCE = {"run_policy", "suspend"}


def attempt_spec_hash(spec: FineTuneJobSpec) -> str:
    """Digest of what an attempt is rendered from: an edit that changes it applies from the next attempt."""
    return _digest(spec, APPLIED_AT_ONCE)


def attempt_spec_hashes(spec: FineTuneJobSpec) -> set[str]:
    """Every digest an operator may have written for an attempt rendered from `spec`: attempt_spec_hash, and the
    form from before it left defaults out (every field dumped), so a Job written before the upgrade is no edit."""
    legacy = _hash(spec.model_dump(mode="json", by_alias=True, exclude=APPLIED_AT_ONCE))
    return {attempt_spec_hash(spec), legacy}


def started_spec_digest(spec: FineTuneJobSpec, labels: dict[str, str]) -> str:
    """What a job that started with no runtime runs, recorded in status.startedSpecDigest: the spec but what applies
    at once, and the Kueue labels that choose its queue and priority (an empty one is none, as admission compares
    them). Only the fields not at their default count, so an upgrade that adds a field with a default leaves it."""
    return _hash([spec.model_dump(mode="json", by_alias=True, exclude=APPLIED_AT_ONCE, exclude_defaults=True),
                  {k: labels[k] for k in c.KUEUE_JOB_LABELS if labels.get(k)}])


def pod_set_hash(job: dict[str, Any]) -> str:
    """What Kueue compares between a Job and the Workload it runs under (the pod count, containers and
    tolerations): equal, the next attempt can take over the Workload its predecessor was admitted with."""
    template = job["spec"]["template"]["spec"]
    return _hash([job["spec"]["parallelism"], template["containers"], template.get("tolerations")])


def render_workload(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    d = spec.distributed
    labels = attempt_labels(ctx, "trainer")
    # The Kueue labels and annotations users put on the FineTuneJob that say which queue, priority class and time
    # limit reach the Job, which Kueue manages; no other (constants.KUEUE_JOB_LABELS says why).
    kueue_labels = {k: v for k, v in ctx.job_labels.items() if k in c.KUEUE_JOB_LABELS}
    kueue_annotations = {k: v for k, v in ctx.job_annotations.items() if k in c.KUEUE_JOB_ANNOTATIONS}
    queue = kueue_labels.get(c.LABEL_KUEUE_QUEUE)
    annotations = {c.ANNOTATION_SPEC_HASH: spec_hash(spec), c.ANNOTATION_ATTEMPT_SPEC_HASH: attempt_spec_hash(spec),
                   **kueue_annotations}
    if spec.suspend and not queue:  # our own suspend (controller/queueing.py tells it from Kueue's)
        annotations[c.ANNOTATION_SUSPENDED] = "true"
    if queue and ctx.kueue_workload:
        kueue_labels[c.LABEL_KUEUE_PREBUILT] = ctx.kueue_workload
    in_place = restarts_in_place(spec)
    if in_place:
        annotations[c.ANNOTATION_RESTARTS_IN_PLACE] = str(in_place_restart_limit(spec))
    if d.elastic:
        annotations[c.ANNOTATION_MIN_NODES] = str(d.min_nodes)
        if queue:  # Kueue may admit it with fewer pods (at least minNodes) when its quota is short
            annotations[c.ANNOTATION_KUEUE_MIN_PARALLELISM] = str(d.min_nodes)
            annotations[c.ANNOTATION_KUEUE_COMPLETIONS_EQUAL_PARALLELISM] = "true"
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": workload_name(ctx),
            "namespace": ctx.namespace,
            "labels": {**labels, **kueue_labels},
            "annotations": annotations,
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": d.num_nodes,
            "parallelism": d.num_nodes,
            # In place, a failed pod is replaced alone (same index, same name) and the operator counts it.
            "backoffLimit": KUEUE_BACKOFF_LIMIT if queue or in_place else 0,
            # Kueue admits a queued workload by unsuspending it, so a queued job starts suspended.
            "suspend": spec.suspend or bool(queue),
            "podReplacementPolicy": "Failed",
            "template": _pod_template(spec, ctx, labels),
            # Its own end, should it outlive the FineTuneJob's watch (controller/deadlines.py).
            **({"activeDeadlineSeconds": ctx.deadline_seconds} if ctx.deadline_seconds is not None else {}),
        },
    }
    if in_place:
        # Node 0's agent hosts the rendezvous and leaves last (torchrun's exit barrier waits for every agent), and
        # it is rank 0 whenever it is in the group (ranks follow the nodes' addresses): its success is the job's,
        # after its final save and upload, even when a lost node's replacement never ran (an elastic job that
        # finished smaller). Not any node's: the others exit 0 once the exit barrier times out (300 s), while
        # rank 0 may still upload the final model.
        job["spec"]["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    annotations[c.ANNOTATION_POD_SET_HASH] = pod_set_hash(job)
    return job


def _pod_template(spec: FineTuneJobSpec, ctx: RenderContext, labels: dict[str, str]) -> dict[str, Any]:
    pod = spec.pod
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": service_name(ctx),
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": c.TRAINER_UID,
            "runAsGroup": c.TRAINER_UID,
            "fsGroup": c.TRAINER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(spec, ctx)],
        "volumes": _volumes(spec, ctx),
        "terminationGracePeriodSeconds": pod.termination_grace_period_seconds,
    }
    optional = {
        # The namespace's trainer identity (render/rbac.py): rank 0 may patch this job's status and nothing else.
        "serviceAccountName": pod.service_account_name or TRAINER_IDENTITY,
        "priorityClassName": pod.priority_class_name,
        "schedulerName": pod.scheduler_name,
        "affinity": pod.affinity,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    if pod.node_selector:
        pod_spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in pod.tolerations]
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in pod.image_pull_secrets]
    return {
        "metadata": {"labels": {**pod.labels, **labels}, "annotations": dict(pod.annotations)},
        "spec": pod_spec,
    }


def _container(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    res = spec.resources
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if spec.distributed.gpus_per_node > 0:
        limits[res.gpu_resource_name] = str(spec.distributed.gpus_per_node)
        requests[res.gpu_resource_name] = str(spec.distributed.gpus_per_node)
    for name, value in (("cpu", res.cpu), ("memory", res.memory), ("ephemeral-storage", res.ephemeral_storage)):
        if value is not None:
            requests[name] = value
            limits[name] = value
    return {
        "name": c.CONTAINER_NAME,
        "image": spec.pod.image or ctx.trainer_image,
        "imagePullPolicy": spec.pod.image_pull_policy,
        "command": trainer_command(ctx),
        "env": trainer_env(spec, ctx),
        "ports": [{"name": c.RENDEZVOUS_PORT_NAME, "containerPort": spec.distributed.rendezvous_port,
                   "protocol": "TCP"}],
        "resources": {"limits": limits, "requests": requests},
        "volumeMounts": [
            {"name": CONFIG_VOLUME, "mountPath": ctx.config_dir, "readOnly": True},
            _output_mount(spec, ctx),
            {"name": CACHE_VOLUME, "mountPath": c.CACHE_MOUNT_PATH},
            {"name": TMP_VOLUME, "mountPath": c.TMP_MOUNT_PATH},
            {"name": SHM_VOLUME, "mountPath": c.SHM_MOUNT_PATH},
            *(_user_mount(v) for v in spec.pod.volumes),
            *reward_code_volumes(spec)[1],
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePath": c.TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _output_mount(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    """On a claim, each job writes to its own directory so jobs can share one ReadWriteMany volume."""
    mount = {"name": OUTPUT_VOLUME, "mountPath": ctx.output_dir}
    if spec.output.claim_name:
        mount["subPath"] = spec.output.sub_path or ctx.name
    return mount


def _volumes(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    out = spec.output
    if out.claim_name:
        output_volume: dict[str, Any] = {"name": OUTPUT_VOLUME, "persistentVolumeClaim": {"claimName": out.claim_name}}
    else:
        output_volume = {"name": OUTPUT_VOLUME, "emptyDir": {}}
    return [
        {"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(ctx)}},
        output_volume,
        {"name": CACHE_VOLUME, "emptyDir": {}},
        {"name": TMP_VOLUME, "emptyDir": {}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        *({"name": v.name, **v.source()} for v in spec.pod.volumes),
        *reward_code_volumes(spec)[0],
    ]


def _user_mount(volume: Volume) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount_path, "readOnly": volume.read_only}
    if volume.sub_path:
        mount["subPath"] = volume.sub_path
    return mount
