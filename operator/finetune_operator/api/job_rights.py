"""What a FineTuneJob does with its user's rights: which fields change what its pods run, and which name Secrets.

A FineTuneJob is no way around RBAC (render/job_rights_policy.py makes the API server hold these):
- its pods run as spec.pod.serviceAccountName when set: naming one, and any later change to what runs as it, needs
  the right to create pods in the namespace (whoever has it could run a pod as that ServiceAccount directly);
- its pods read every Secret it names: naming one, and any later change to what runs with it, needs the right to get
  that Secret.
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


def secret_names(spec: FineTuneJobSpec) -> dict[str, list[str]]:
    """The same references read from a validated spec (for tests and `finetune validate`): field -> Secret names."""
    push = spec.output.push
    return {
        "spec.pod.secretEnv": [e.secret_name for e in spec.pod.secret_env],
        "spec.pod.volumes": [v.secret for v in spec.pod.volumes if v.secret is not None],
        "spec.pod.imagePullSecrets": list(spec.pod.image_pull_secrets),
        "spec.output.push.tokenSecret": [push.token_secret.name] if push and push.token_secret else [],
        "spec.s3.credentialsSecret": [spec.s3.credentials_secret] if spec.s3.credentials_secret else [],
    }
