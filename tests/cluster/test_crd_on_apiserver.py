"""The FineTuneJob API on a real kube-apiserver: install, apply, print, explain, refuse bad objects."""

import json
import time

import pytest
import yaml

from tests.builders import make_job
from tests.conftest import EXAMPLES


def test_crd_is_established_with_short_name(kubectl):
    resources = kubectl.run("api-resources", "--api-group=finetunejob.dev", "-o", "wide").stdout
    assert "finetunejobs" in resources and "ftj" in resources and "FineTuneJob" in resources


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_kubectl_apply_every_example(kubectl, namespace, path):
    kubectl.run("apply", "-n", namespace, "-f", str(path))
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    stored = kubectl.json("get", "ftj", name, "-n", namespace)
    # Server-side defaulting from the generated schema fills the same defaults pydantic uses.
    assert stored["spec"]["data"]["truncation"] == "truncate"
    assert stored["spec"]["model"]["trustRemoteCode"] is False


def test_get_finetunejobs_shows_printer_columns(kubectl, namespace):
    kubectl.run("apply", "-n", namespace, "-f", str(EXAMPLES[0]))
    name = yaml.safe_load(EXAMPLES[0].read_text())["metadata"]["name"]
    status = {"phase": "Running", "reason": "Running", "nodes": "2/2", "gpus": 16, "attempt": 1,
              "progress": {"step": 120, "maxSteps": 500, "percent": 24, "loss": 1.234, "eta": "12m",
                           "peakMemoryGiB": 61.27}}
    kubectl.run("patch", "ftj", name, "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))
    table = kubectl.run("get", "finetunejobs", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "NODES", "GPUS", "PROGRESS", "LOSS", "ETA", "REASON", "AGE"]
    assert table[1].split()[:8] == [name, "Running", "2/2", "16", "24", "1.234", "12m", "Running"]
    # The trainer's field names are the schema's: nothing it writes is pruned by the apiserver.
    stored = kubectl.json("get", "ftj", name, "-n", namespace)["status"]["progress"]
    assert stored["peakMemoryGiB"] == 61.27
    wide = kubectl.run("get", "ftj", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert "ATTEMPT" in wide and "REASON" in wide


def test_status_is_a_subresource(kubectl, namespace):
    """A spec update cannot smuggle in status; status has its own endpoint (and RBAC)."""
    job = make_job({"metadata.name": "sub", "metadata.namespace": namespace})
    job["status"] = {"phase": "Succeeded"}
    kubectl.run("apply", "-f", "-", input=json.dumps(job))
    assert "status" not in kubectl.json("get", "ftj", "sub", "-n", namespace) or \
        kubectl.json("get", "ftj", "sub", "-n", namespace)["status"].get("phase") != "Succeeded"


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"spec.distributed.numNodes": 0}, "spec.distributed.numNodes: Invalid value: 0"),
    ({"spec.distributed.numNodes": "two"}, 'spec.distributed.numNodes: Invalid value: "string"'),
    ({"spec.distributed.strategy": "horovod"}, 'spec.distributed.strategy: Unsupported value: "horovod"'),
    ({"spec.model.name": ""}, "spec.model.name: Invalid value"),
    ({"spec.data.train": []}, "spec.data.train: Invalid value"),
    ({"spec.resources.memory": "lots"}, "spec.resources.memory: Invalid value"),
    ({"spec.distributed.numNode": 2}, 'unknown field "spec.distributed.numNode"'),
    ({"metadata.name": "a" * 63}, "metadata.name: Too long: may not be more than 48"),
], ids=["num-nodes-zero", "string-for-integer", "unknown-strategy", "empty-model", "no-train-data",
        "bad-quantity", "unknown-field", "name-too-long"])
def test_apiserver_refuses_schema_violations(kubectl, namespace, overrides, expected):
    job = make_job({"metadata.name": "bad", **overrides, "metadata.namespace": namespace})
    proc = kubectl.run("apply", "-f", "-", input=json.dumps(job), check=False)
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr
    assert '<nil>: Invalid value: "object"' not in proc.stderr  # every refusal names its field


def test_kubectl_explain_uses_model_descriptions(kubectl):
    text = kubectl.run("explain", "finetunejob.spec.distributed").stdout
    assert "Nodes, processes and the parallelism strategy" in text
    assert "numNodes" in text and "gpusPerNode" in text
    field = kubectl.run("explain", "finetunejob.spec.distributed.gpusPerNode").stdout
    assert "0 runs on CPU" in field


def test_kubectl_wait_on_phase_works(kubectl, namespace):
    """Users script `kubectl wait --for=jsonpath=.status.phase=Succeeded`; the field path must exist."""
    job = make_job({"metadata.name": "waiter", "metadata.namespace": namespace})
    kubectl.run("apply", "-f", "-", input=json.dumps(job))
    kubectl.run("patch", "ftj", "waiter", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", '{"status": {"phase": "Succeeded"}}')
    started = time.monotonic()
    kubectl.run("wait", "ftj/waiter", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", "--timeout=20s")
    assert time.monotonic() - started < 20


def test_model_and_method_are_immutable_but_training_is_not(kubectl, namespace):
    job = make_job({"metadata.name": "frozen", "metadata.namespace": namespace})
    kubectl.run("apply", "-f", "-", input=json.dumps(job))
    refused = kubectl.run("patch", "ftj", "frozen", "-n", namespace, "--type=merge", "-p",
                          '{"spec": {"model": {"name": "/models/other"}}}', check=False)
    assert refused.returncode != 0 and "spec.model is immutable" in refused.stderr
    refused = kubectl.run("patch", "ftj", "frozen", "-n", namespace, "--type=merge", "-p",
                          '{"spec": {"method": {"type": "full"}}}', check=False)
    assert refused.returncode != 0 and "spec.method is immutable" in refused.stderr
    kubectl.run("patch", "ftj", "frozen", "-n", namespace, "--type=merge", "-p",
                '{"spec": {"training": {"learningRate": 0.5}}}')
