"""What a FineTuneJob does with its user's rights: which fields change what its pods run, and which name Secrets.

A FineTuneJob is no way around RBAC (render/job_rights_policy.py makes the API server hold these):
- its pods run as spec.pod.serviceAccountName when set: naming one, and any later change to what runs as it, needs
  the right to create pods in the namespace (whoever has it could run a pod as that ServiceAccount directly);
- its pods read every Secret and ConfigMap it names: naming one, and any later change to what runs with it, needs the
  right to get it;
- its pods mount the NFS exports it names, which a pod may mount only if its user may create pods: naming one, and
  any later change to what runs with it, needs that right;
- deleting it leaves nothing running: a delete that would orphan its attempts (propagationPolicy Orphan) is refused
  (an attempt left running would run on as the trainer identity, with what its runtime lent, past its deadline).
"What runs" is the whole spec but the fields listed in HARMLESS: anything else reaches the pods (their image,
environment, volumes, scheduling, annotations a mutating webhook may act on, the trainer's configuration, where
output and credentials go), so a field added to the spec later is protected without anyone remembering to.
"""

from typing import Any

from .resources import PodSpec
from .spec import FineTuneJobSpec

# Spec fields whose change leaves what the pods run as it was: stopping and resuming the same pods (suspend), and
# the operator's own deadlines, restarts and clean-up (runPolicy).
HARMLESS = ("suspend", "runPolicy")
SPLIT = "pod"  # a section whose fields are named one by one in a refusal (spec.pod.image, not spec.pod)


def _aliases(model: Any) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def watched_fields() -> list[str]:
    """Every spec path whose change changes what a job's pods run, in the manifest's spelling."""
    out = []
    for name in _aliases(FineTuneJobSpec):
        if name in HARMLESS:
            continue
        out += [f"{name}.{sub}" for sub in _aliases(PodSpec)] if name == SPLIT else [name]
    return out


# Every field that names a Secret, and the CEL list of the names it holds in the object at `{o}` (object or
# oldObject). A unit test finds every Secret reference in the spec's schema and checks it is here.
SECRET_REFERENCES: dict[str, str] = {
    "spec.pod.secretEnv": "(has({o}.spec.pod) && has({o}.spec.pod.secretEnv) ? "
                          "{o}.spec.pod.secretEnv.map(e, e.secretName) : [])",
    "spec.pod.volumes": "(has({o}.spec.pod) && has({o}.spec.pod.volumes) ? "
                        "{o}.spec.pod.volumes.filter(v, has(v.secret)).map(v, v.secret) : [])",
    "spec.pod.imagePullSecrets": "(has({o}.spec.pod) && has({o}.spec.pod.imagePullSecrets) ? "
                                 "{o}.spec.pod.imagePullSecrets : [])",
    "spec.output.push.tokenSecret": "(has({o}.spec.output) && has({o}.spec.output.push) && "
                                    "has({o}.spec.output.push.tokenSecret) ? [{o}.spec.output.push.tokenSecret.name] "
                                    ": [])",
    "spec.s3.credentialsSecret": "(has({o}.spec.s3) && has({o}.spec.s3.credentialsSecret) ? "
                                 "[{o}.spec.s3.credentialsSecret] : [])",
}


# Every field that names a ConfigMap, the same way (the operator's own ConfigMap is no field of the spec).
CONFIGMAP_REFERENCES: dict[str, str] = {
    "spec.pod.volumes": "(has({o}.spec.pod) && has({o}.spec.pod.volumes) ? "
                        "{o}.spec.pod.volumes.filter(v, has(v.configMap)).map(v, v.configMap) : [])",
    # A GRPO reward function's Python files: mounted into the trainer pods.
    "spec.method.grpo.rewards": "(has({o}.spec.method) && has({o}.spec.method.grpo) && "
                                "has({o}.spec.method.grpo.rewards) ? {o}.spec.method.grpo.rewards.filter(r, "
                                "has(r.configMap)).map(r, r.configMap) : [])",
}
# Whether the job mounts an NFS export (CEL, the object at `{o}`).
MOUNTS_NFS = "(has({o}.spec.pod) && has({o}.spec.pod.volumes) && {o}.spec.pod.volumes.exists(v, has(v.nfs)))"


def configmap_names(obj: dict[str, Any]) -> dict[str, list[str]]:
    """CONFIGMAP_REFERENCES read from a FineTuneJob as written: field -> ConfigMap names."""
    pod = (obj.get("spec") or {}).get("pod") or {}
    grpo = ((obj.get("spec") or {}).get("method") or {}).get("grpo") or {}
    return {"spec.pod.volumes": [v["configMap"] for v in pod.get("volumes") or [] if v.get("configMap") is not None],
            "spec.method.grpo.rewards": [r["configMap"] for r in grpo.get("rewards") or []
                                         if r.get("configMap") is not None]}


def mounts_nfs(obj: dict[str, Any]) -> bool:
    pod = (obj.get("spec") or {}).get("pod") or {}
    return any(v.get("nfs") is not None for v in pod.get("volumes") or [])


def secret_names(obj: dict[str, Any]) -> dict[str, list[str]]:
    """The same references read from a FineTuneJob as written (for tests and tools): field -> Secret names."""
    spec = obj.get("spec") or {}
    pod, push = spec.get("pod") or {}, (spec.get("output") or {}).get("push") or {}
    return {
        "spec.pod.secretEnv": [e.get("secretName") for e in pod.get("secretEnv") or []],
        "spec.pod.volumes": [v["secret"] for v in pod.get("volumes") or [] if v.get("secret") is not None],
        "spec.pod.imagePullSecrets": list(pod.get("imagePullSecrets") or []),
        "spec.output.push.tokenSecret": [push["tokenSecret"]["name"]] if push.get("tokenSecret") else [],
        "spec.s3.credentialsSecret": [spec["s3"]["credentialsSecret"]] if (spec.get("s3") or {}).get(
            "credentialsSecret") else [],
    }


def changed_fields(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """The watched fields (spec.<path>) an update from `old` to `new` changes; a create (old None): ["spec"]."""
    if old is None:
        return ["spec"]

    def get(obj: dict[str, Any], path: str) -> Any:
        node: Any = obj.get("spec") or {}
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return _ABSENT
            node = node[part]
        return node

    return [f"spec.{path}" for path in watched_fields() if get(old, path) != get(new, path)]


_ABSENT = object()
