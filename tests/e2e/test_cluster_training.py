"""The whole user flow with real training: helm install -> operator -> kubectl apply -> pods really train
(run by a test kubelet, tests/support/pod_runner.py) -> kubectl get finetunejobs says Succeeded with a loss."""

import json
import shutil
import time

import pytest
import yaml

from tests.conftest import ROOT
from tests.support.operator_process import OperatorProcess
from tests.support.pod_runner import PodRunner

RELEASE, SYSTEM_NS = "ftj-e2e", "finetunejob-e2e"


@pytest.fixture(scope="module")
def chart_operator(control_plane, kubectl, tmp_path_factory):
    """helm install, then the operator process under the chart's ServiceAccount (no image can run here)."""
    helm = control_plane.bin_dir / "helm"
    import subprocess

    subprocess.run([str(helm), "install", RELEASE, str(ROOT / "charts" / "finetunejob"), "--namespace", SYSTEM_NS,
                    "--create-namespace"], env=kubectl.env, check=True, capture_output=True)
    token = kubectl.run("create", "token", f"{RELEASE}-operator", "-n", SYSTEM_NS, "--duration=2h").stdout.strip()
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    kubeconfig = tmp_path_factory.mktemp("operator") / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    op = OperatorProcess(kubeconfig, control_plane.work / "operator-e2e.log", restart_backoff=1).start()
    yield op
    op.stop()
    subprocess.run([str(helm), "uninstall", RELEASE, "--namespace", SYSTEM_NS], env=kubectl.env, check=False)


def shared_volume(kubectl, namespace, path):
    """A ReadWriteMany claim bound to a hostPath volume (the pod runner maps it to one local directory)."""
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"pv-{namespace}"[:63]},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                   "hostPath": {"path": str(path)}, "claimRef": {"namespace": namespace, "name": "shared"}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared", "namespace": namespace},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                    "resources": {"requests": {"storage": "1Gi"}}}}
    kubectl.run("apply", "-f", "-", input=json.dumps(pv) + "\n---\n" + json.dumps(pvc))


def tiny_two_node_job(model_dir, workdir, preflight=False, **training):
    """The tiny example on 2 nodes, its model on the shared claim (where a user would keep it)."""
    shutil.copytree(model_dir, workdir / "pvc" / "shared" / "tiny-cpu-sft" / "models" / "tiny")
    path = workdir / "job.yaml"
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-sft.yaml").read_text())
    doc["spec"]["model"]["name"] = "/output/models/tiny"
    doc["spec"]["distributed"]["numNodes"] = 2
    doc["spec"]["output"] = {"claimName": "shared"}
    doc["spec"]["training"].update(training)
    doc["spec"].setdefault("runPolicy", {})["preflight"] = preflight
    path.write_text(yaml.safe_dump(doc))
    return path


def wait_status(kubectl, namespace, predicate, timeout, op, runner):
    deadline = time.monotonic() + timeout
    st = {}
    while time.monotonic() < deadline:
        st = kubectl.json("get", "ftj", "tiny-cpu-sft", "-n", namespace).get("status", {})
        if predicate(st):
            return st
        assert not runner.errors, runner.errors
        time.sleep(0.5)
    raise AssertionError(f"status not reached: {st}\n{op.log_tail(30)}")


def progress_records(workdir):
    files = list((workdir / "pvc" / "shared").glob("*/progress.jsonl"))
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    return [r for r in records if r.get("phase") != "Preparing"]  # the data preparation's heartbeat


def test_two_node_job_trains_and_reports(chart_operator, kubectl, control_plane, namespace, tiny_model_dir,
                                         tmp_path):
    shared_volume(kubectl, namespace, tmp_path / "pvc" / "shared")
    job = tiny_two_node_job(tiny_model_dir, tmp_path, preflight=True)
    with PodRunner(kubectl, control_plane, namespace, tmp_path) as runner:
        kubectl.run("apply", "-n", namespace, "-f", str(job))
        st = wait_status(kubectl, namespace, lambda s: s.get("phase") in ("Succeeded", "Failed"), 300,
                         chart_operator, runner)
    assert st["phase"] == "Succeeded", st
    assert st["progress"]["step"] == 30 and st["progress"]["loss"] > 0 and st["checkpoint"]["step"] == 30
    row = kubectl.run("get", "finetunejobs", "-n", namespace, "--no-headers").stdout.split()
    assert row[0:2] == ["tiny-cpu-sft", "Succeeded"] and float(row[5]) == pytest.approx(st["progress"]["loss"])
    assert (tmp_path / "pvc" / "shared" / "tiny-cpu-sft" / "final" / "adapter_model.safetensors").exists()
    summary = json.loads((tmp_path / "pods").glob("tiny-cpu-sft-a1-0-*/termination-log").__next__().read_text())
    assert summary["worldSize"] == 2 and summary["modelWrapper"] == "DistributedDataParallel"
    # The preflight ran the real checks in its own pod first, then the gang started.
    check = json.loads(next((tmp_path / "pods").glob("tiny-cpu-sft-a0-0-*/termination-log")).read_text())
    assert check["exitCode"] == 0 and check["preflight"]["sources"][0]["kept"] > 0 and st["preflight"] == "Passed"
    assert st["goodput"]["gpuHours"] == 0 and "runningSince" not in st["goodput"]  # a CPU job, finished


def test_killed_node_gang_restarts_and_resumes_without_redoing_work(chart_operator, kubectl, control_plane,
                                                                    namespace, tiny_model_dir, tmp_path):
    shared_volume(kubectl, namespace, tmp_path / "pvc" / "shared")
    job = tiny_two_node_job(tiny_model_dir, tmp_path, maxSteps=600)
    with PodRunner(kubectl, control_plane, namespace, tmp_path) as runner:
        kubectl.run("apply", "-n", namespace, "-f", str(job))
        st = wait_status(kubectl, namespace, lambda s: (s.get("checkpoint") or {}).get("step", 0) >= 20, 300,
                         chart_operator, runner)
        victim = next(n for n in runner.processes if "-a1-1-" in n)
        runner.kill(victim)
        st = wait_status(kubectl, namespace, lambda s: s.get("attempt") == 2, 120, chart_operator, runner)
        assert st["restarts"] == 1
        st = wait_status(kubectl, namespace, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600,
                         chart_operator, runner)
    assert st["phase"] == "Succeeded", st
    assert st["attempt"] == 2 and st["progress"]["step"] == 600
    second = json.loads(next((tmp_path / "pods").glob("tiny-cpu-sft-a2-0-*/termination-log")).read_text())
    resumed_step = int(second["resumedFrom"].rsplit("-", 1)[1])
    steps = [r["step"] for r in progress_records(tmp_path)]
    first_after_restart = steps[steps.index(max(s for s in steps if s <= resumed_step)) + 1:]
    # Attempt 2 starts right after the checkpoint it resumed from: at most the steps since it were redone.
    assert resumed_step >= 20 and min(first_after_restart) == resumed_step + 1
