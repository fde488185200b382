"""The trainer container's environment: torchrun's PET_* rendezvous contract, our own variables, user entries."""

import posixpath
from typing import Any

from ..api import constants as c
from ..api.elastic import in_place_restart_limit, restarts_in_place
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .names import master_address, pod_address
from .trainer_config import cache_dir, pod_cache_dir

# The keys of spec.s3.credentialsSecret, as boto reads them from the environment (a session token only for
# temporary credentials).
S3_CREDENTIAL_KEYS = (("AWS_ACCESS_KEY_ID", False), ("AWS_SECRET_ACCESS_KEY", False), ("AWS_SESSION_TOKEN", True))


def trainer_env(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    """Reserved names come first and users cannot set them (the API rejects it), so nothing is silently overridden."""
    d = spec.distributed
    env: list[dict[str, Any]] = [
        {"name": c.ENV_PET_NNODES, "value": f"{d.min_nodes}:{d.num_nodes}" if d.elastic else str(d.num_nodes)},
        {"name": c.ENV_PET_NPROC_PER_NODE, "value": str(d.processes_per_node)},
        {"name": c.ENV_PET_NODE_RANK,
         "valueFrom": _field_ref(f"metadata.annotations['{c.ANNOTATION_COMPLETION_INDEX}']")},
        # Before PET_MASTER_ADDR, which names it: the kubelet expands $(VAR) of variables defined earlier.
        {"name": c.ENV_ATTEMPT, "valueFrom": _field_ref(f"metadata.labels['{c.LABEL_ATTEMPT}']")},
        {"name": c.ENV_PET_MASTER_ADDR, "value": master_address(ctx)},
        {"name": c.ENV_PET_MASTER_PORT, "value": str(d.rendezvous_port)},
        {"name": c.ENV_CONFIG, "value": posixpath.join(ctx.config_dir, c.CONFIG_FILE)},
        {"name": c.ENV_JOB_NAME, "value": ctx.name},
        {"name": c.ENV_JOB_NAMESPACE, "valueFrom": _field_ref("metadata.namespace")},
        {"name": c.ENV_POD_NAME, "valueFrom": _field_ref("metadata.name")},
        # Hub downloads (models, tokenizers, datasets) go to the cache (the root filesystem is read-only). A model
        # that brings code is always downloaded into the pod's own cache, and transformers copies and imports remote
        # code from the pod's own modules directory: code never comes from a volume someone else can write.
        {"name": c.ENV_HF_HOME, "value": posixpath.join(
            pod_cache_dir(ctx) if spec.model.trust_remote_code else cache_dir(spec, ctx), "huggingface")},
        {"name": c.ENV_HF_MODULES_CACHE, "value": posixpath.join(pod_cache_dir(ctx), "modules")},
        {"name": c.ENV_TORCH_EXTENSIONS_DIR, "value": posixpath.join(c.CACHE_MOUNT_PATH, "torch_extensions")},
        {"name": c.ENV_TRITON_CACHE_DIR, "value": posixpath.join(c.CACHE_MOUNT_PATH, "triton")},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if restarts_in_place(spec):
        env += rendezvous_env(spec, ctx)
    if d.gpus_per_node == 0:
        # DeepSpeed otherwise probes for CUDA and fails; the CPU accelerator runs ZeRO on gloo.
        env.append({"name": c.ENV_DS_ACCELERATOR, "value": "cpu"})
    if d.nccl_debug is not None:
        env.append({"name": c.ENV_NCCL_DEBUG, "value": d.nccl_debug})
    env += [{"name": e.name, "value": e.value} for e in spec.pod.env]
    env += [
        {"name": s.name,
         "valueFrom": {"secretKeyRef": {"name": s.secret_name, "key": s.key, "optional": s.optional}}}
        for s in spec.pod.secret_env
    ]
    if spec.s3.credentials_secret is not None:  # by reference: the keys never appear in the pod spec
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": spec.s3.credentials_secret, "key": key,
                                                             **({"optional": True} if optional else {})}}}
                for key, optional in S3_CREDENTIAL_KEYS]
    push = spec.output.push
    if push is not None and push.token_secret is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": push.token_secret.name,
                                                                        "key": push.token_secret.key}}})
    return env


def rendezvous_env(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    """torchrun's c10d rendezvous, one per attempt (its id), and its restarts of failed workers on their pods. Each
    agent names itself by its pod's DNS name (the name other nodes reach its workers by, when it is rank 0; and
    what orders the ranks: node 0 first). Attempt and index from the pod, as master_address does."""
    return [{"name": c.ENV_PET_RDZV_BACKEND, "value": c.RDZV_BACKEND_C10D},
            {"name": c.ENV_PET_RDZV_ID, "value": f"{ctx.name}-a$({c.ENV_ATTEMPT})"},
            {"name": c.ENV_PET_MAX_RESTARTS, "value": str(in_place_restart_limit(spec))},
            {"name": c.ENV_PET_LOCAL_ADDR, "value": pod_address(ctx, f"$({c.ENV_PET_NODE_RANK})")}]


def _field_ref(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}
