"""Rendered children on a real apiserver: every example's children pass a server-side dry-run; a real apply
runs through the Job controller, the scheduler (GPU capacity of kwok nodes) and Pod Security admission."""

import json

import pytest
import yaml

from finetune_operator.api import constants as c
from finetune_operator.api.validation import validate_job
from finetune_operator.api.volumes import NOT_RESTRICTED, SOURCE_FIELDS
from finetune_operator.render import RenderContext, render_all, render_trainer_identity
from tests.builders import make_job
from tests.conftest import EXAMPLES
from tests.support.polling import wait_until


def children(doc, namespace, attempt=1):
    job = validate_job({**doc, "metadata": {**doc["metadata"], "namespace": namespace}})
    ctx = RenderContext(name=job.name, namespace=namespace, attempt=attempt, job_labels=job.labels)
    # The namespace's trainer identity first, as the operator applies it before a namespace's first job.
    return [*render_trainer_identity(namespace, job.spec.pod.service_account_name), *render_all(job.spec, ctx)]


def apply(kubectl, objects, *extra):
    # YAML documents: kubectl's stream decoder silently drops a JSON document past 4 KiB after a "---" separator.
    stream = "---\n".join(yaml.safe_dump(o) for o in objects)
    return kubectl.run("apply", "--server-side", "--field-manager=finetunejob-test", *extra, "-f", "-", input=stream)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_rendered_child_passes_server_side_dry_run(kubectl, namespace, path):
    objects = children(yaml.safe_load(path.read_text()), namespace)
    proc = apply(kubectl, objects, "--dry-run=server")
    assert proc.stdout.count("serverside-applied (server dry run)") == len(objects), proc.stdout + proc.stderr


def wait_for(predicate, timeout=60.0, interval=0.5):
    return wait_until("the condition", predicate, timeout, interval)


def pods_of(kubectl, namespace, name):
    return kubectl.json("get", "pods", "-n", namespace, "-l", f"{c.LABEL_JOB}={name}")["items"]


def test_two_node_gpu_job_is_scheduled_indexed_and_running(kubectl, namespace):
    doc = make_job({"metadata.name": "gang", "spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8})
    apply(kubectl, children(doc, namespace))
    pods = wait_for(lambda: (lambda ps: ps if len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps)
                             else None)(pods_of(kubectl, namespace, "gang")))
    indexes = sorted(p["metadata"]["annotations"][c.ANNOTATION_COMPLETION_INDEX] for p in pods)
    assert indexes == ["0", "1"]
    # Each 8-GPU pod fills one fake node: the scheduler honoured the GPU request.
    assert len({p["spec"]["nodeName"] for p in pods}) == 2
    for pod in pods:
        assert pod["spec"]["hostname"] == f"gang-a1-{pod['metadata']['annotations'][c.ANNOTATION_COMPLETION_INDEX]}"
        assert pod["spec"]["subdomain"] == "gang"
    # A second gang needing 16 more GPUs cannot fit on the two 8-GPU nodes: it stays Pending (Unschedulable).
    apply(kubectl, children(make_job({"metadata.name": "late", "spec.distributed.numNodes": 2,
                                      "spec.distributed.gpusPerNode": 8}), namespace))
    late = wait_for(lambda: (lambda ps: ps if len(ps) == 2 and all(
        any(cd.get("reason") == "Unschedulable" for cd in p["status"].get("conditions", [])) for p in ps) else None)(
        pods_of(kubectl, namespace, "late")))
    assert all(p["status"]["phase"] == "Pending" for p in late)
    kubectl.run("delete", "job", "-n", namespace, "gang-a1", "late-a1", "--wait=false")


def test_trainer_pods_are_admitted_under_restricted_pod_security(kubectl, namespace):
    kubectl.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    objects = children(make_job({"metadata.name": "secure"}), namespace)
    apply(kubectl, [o for o in objects if o["kind"] == "ServiceAccount"])  # the pod runs as the job's identity
    job = next(o for o in objects if o["kind"] == "Job")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "secure-probe", "namespace": namespace, **job["spec"]["template"]["metadata"]},
           "spec": job["spec"]["template"]["spec"]}
    proc = kubectl.run("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "violate" not in proc.stderr
    # Control: the same pod without its hardening is refused, so the check above is real.
    pod["spec"]["containers"][0].pop("securityContext")
    refused = kubectl.run("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr


def test_every_volume_kind_but_those_documented_is_admitted_under_restricted_pod_security(kubectl, namespace):
    """api/volumes.py says which kinds of spec.pod.volumes restricted Pod Security refuses (nfs); every other kind
    is admitted (the attack review found the docs promising every kind)."""
    kubectl.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    kinds = {"claim_name": {"claimName": "c"}, "config_map": {"configMap": "m"}, "secret": {"secret": "s"},
             "nfs": {"nfs": {"server": "nfs.local", "path": "/x"}}}
    assert set(kinds) == set(SOURCE_FIELDS)
    refused = set()
    for kind, source in kinds.items():
        objects = children(make_job({"metadata.name": "vol", "spec.pod": {"volumes": [
            {"name": "d", "mountPath": "/d", **source}]}}), namespace)
        apply(kubectl, [o for o in objects if o["kind"] == "ServiceAccount"])
        template = next(o for o in objects if o["kind"] == "Job")["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vol-probe", "namespace": namespace,
                                                               **template["metadata"]}, "spec": template["spec"]}
        proc = kubectl.run("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        if proc.returncode != 0:
            assert "violates PodSecurity" in proc.stderr, proc.stderr
            refused.add(kind)
    assert refused == set(NOT_RESTRICTED)
