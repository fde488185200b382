"""The whole user flow with real training: helm install -> operator -> kubectl apply -> pods really train
(run by a test kubelet) -> kubectl get finetunejobs says Succeeded with a loss.

Collected by test modules that take their cases from here and define the `runtime` fixture:
test_cluster_training_containers.py (and _containers_bucket.py, a file of its own so that pytest-xdist runs it on
another worker) with our images as containers (the chart's operator Deployment and the trainer pods from the images
hack/build-images.sh builds, tests/support/containers.py), and test_cluster_training_processes.py with both as
local processes from this checkout (tests/support/pod_runner.py: for a machine without podman). A case collected
both ways runs in containers; its processes twin runs with --twins (tests/support/twins.py, mark_twins)."""

import json
import random
import re
import shutil
import subprocess
import time

import pytest
import yaml

from tests.conftest import ROOT
from tests.support.chart_operator import start_installed_operator
from tests.support.containers import ContainerPodRunner, built_images
from tests.support.controlplane import free_port
from tests.support.events import wait_events
from tests.support.hub_server import StandInHub
from tests.support.pod_runner import PodRunner
from tests.support.polling import NotWithin, tree_bytes, wait_until

RELEASE, SYSTEM_NS = "ftj-e2e", "finetunejob-e2e"
# The killed-node cases kill a node once a checkpoint at step >= 20 is seen: the remaining steps are the margin for
# the kill to land before the run ends (the pods train ~5 steps/s here, and the kill landed 4 steps after it).
KILLED_RUN_STEPS = 200


def helm_install(control_plane, kubectl, *values: str) -> dict:
    """helm install the chart; returns the operator Deployment as the apiserver stored it."""
    sets = [arg for value in values for arg in ("--set", value)]
    subprocess.run([str(control_plane.bin_dir / "helm"), "install", RELEASE, str(ROOT / "charts" / "finetunejob"),
                    "--namespace", SYSTEM_NS, "--create-namespace", *sets],
                   env=kubectl.env, check=True, capture_output=True)
    return kubectl.json("get", "deployment", f"{RELEASE}-operator", "-n", SYSTEM_NS)


@pytest.fixture(scope="module")
def chart_operator(runtime, control_plane, kubectl, tmp_path_factory):
    """helm install, then the operator under the chart's ServiceAccount: the chart's Deployment as a container from
    our operator image, or the operator as a process."""
    workdir = tmp_path_factory.mktemp("operator")
    if runtime == "containers":
        operator_image, trainer_image = built_images()
        repository, tag = operator_image.rsplit(":", 1)
        helm_install(control_plane, kubectl, f"image.repository={repository}", f"image.tag={tag}",
                     f"trainerImage={trainer_image}", "restartBackoffSeconds=1")
    else:
        helm_install(control_plane, kubectl)
    op = start_installed_operator(runtime, control_plane, kubectl, workdir, RELEASE, SYSTEM_NS)
    yield op
    op.stop()
    # The kubelet restarts an operator container that ends: only a step-down (a Lease it could not renew in time,
    # the apiserver starved on a loaded machine) may have ended one, never a crash or a failed liveness probe.
    assert not getattr(op, "crashes", list)(), (op.restarts, op.log_tail(60))
    subprocess.run([str(control_plane.bin_dir / "helm"), "uninstall", RELEASE, "--namespace", SYSTEM_NS, "--wait"],
                   env=kubectl.env, check=False, capture_output=True)


def pod_runner(runtime, kubectl, control_plane, namespace, workdir):
    runner = ContainerPodRunner if runtime == "containers" else PodRunner
    return runner(kubectl, control_plane, namespace, workdir)


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
    # Pods run on this host's network: a port of its own, as the other half of these cases runs at the same time.
    doc["spec"]["distributed"]["rendezvousPort"] = free_port()
    doc["spec"]["output"] = {"claimName": "shared"}
    doc["spec"]["training"].update(training)
    doc["spec"].setdefault("runPolicy", {})["preflight"] = preflight
    path.write_text(yaml.safe_dump(doc))
    return path


def wait_status(kubectl, namespace, predicate, timeout, op, runner, name="tiny-cpu-sft"):
    """The status once `predicate` holds. `timeout` counts from the last change of the status (a new step, phase or
    node count) or of what the job's pods wrote (their logs, the claims: a pod loading its model on a loaded
    machine says nothing in the status for minutes), up to 4 x `timeout` in all: a loaded machine makes a job slow,
    which is no failure; a job that stands still for `timeout` seconds is one."""
    started = changed = time.monotonic()
    st, seen = {}, None
    while True:
        st = kubectl.json("get", "ftj", name, "-n", namespace).get("status", {})
        if predicate(st):
            return st
        assert not runner.errors, runner.errors
        now = time.monotonic()
        moved = (st, tree_bytes(runner.workdir / "pods", runner.workdir / "pvc"))
        if moved != seen:
            seen, changed = moved, now
        if now - changed > timeout or now - started > 4 * timeout:
            raise AssertionError(f"status not reached ({now - changed:.0f} s with nothing new, {now - started:.0f} s "
                                 f"in all): {st}\n{op.log_tail(30)}")
        time.sleep(0.5)


def volume_progress_records(workdir):
    """Every attempt's progress records on the test cluster's shared volume (a local run's: trainer_run)."""
    files = list((workdir / "pvc" / "shared").glob("*/progress.jsonl"))
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    return [r for r in records if r.get("phase") != "Preparing"]  # the data preparation's heartbeat


def with_tracking_and_push(job, hub_url):
    """wandb offline and a push to a stand-in Hub, its token from a Secret; the test kubelet keeps pods off the Hub
    (HF_HUB_OFFLINE=1) unless the pod says otherwise, as this one must to push."""
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["tracking"] = {"reportTo": ["wandb"], "wandb": {"offline": True}}
    doc["spec"]["output"]["push"] = {"repo": "acme/tiny-2node", "endpoint": hub_url,
                                     "tokenSecret": {"name": "hf-write"}}
    doc["spec"].setdefault("pod", {})["env"] = [{"name": "HF_HUB_OFFLINE", "value": "0"}]
    job.write_text(yaml.safe_dump(doc))


def test_two_node_job_trains_and_reports(runtime, chart_operator, kubectl, control_plane, namespace, tiny_model_dir,
                                         tmp_path):
    shared_volume(kubectl, namespace, tmp_path / "pvc" / "shared")
    job = tiny_two_node_job(tiny_model_dir, tmp_path, preflight=True)
    kubectl.run("create", "secret", "generic", "hf-write", "-n", namespace, "--from-literal=token=hf_e2e_write")
    with StandInHub(token="hf_e2e_write") as hub, pod_runner(runtime, kubectl, control_plane, namespace,
                                                             tmp_path) as runner:
        with_tracking_and_push(job, hub.url)
        kubectl.run("apply", "-n", namespace, "-f", str(job))
        st = wait_status(kubectl, namespace, lambda s: s.get("phase") in ("Succeeded", "Failed"), 300,
                         chart_operator, runner)
    assert st["phase"] == "Succeeded", st
    assert st["progress"]["step"] == 30 and st["progress"]["loss"] > 0 and st["checkpoint"]["step"] == 30, st
    row = kubectl.run("get", "finetunejobs", "-n", namespace, "--no-headers").stdout.split()
    assert row[0:2] == ["tiny-cpu-sft", "Succeeded"] and float(row[5]) == pytest.approx(st["progress"]["loss"])
    assert (tmp_path / "pvc" / "shared" / "tiny-cpu-sft" / "final" / "adapter_model.safetensors").exists()
    summary = json.loads((tmp_path / "pods").glob("tiny-cpu-sft-a1-0-*/termination-log").__next__().read_text())
    assert summary["worldSize"] == 2 and summary["modelWrapper"] == "DistributedDataParallel"
    # Caches are each pod's own: nothing on the claim that another writer could fill for the next attempt.
    assert not (tmp_path / "pvc" / "shared" / "tiny-cpu-sft" / ".cache").exists()
    if runtime == "processes":  # each node tokenized into its own emptyDir
        for index in (0, 1):
            pod = next((tmp_path / "pods").glob(f"tiny-cpu-sft-a1-{index}-*"))
            assert list((pod / "cache" / "tokenized").glob("*/complete")), index
    # The preflight ran the real checks in its own pod first, then the gang started.
    check = json.loads(next((tmp_path / "pods").glob("tiny-cpu-sft-a0-0-*/termination-log")).read_text())
    assert check["exitCode"] == 0 and check["preflight"]["sources"][0]["kept"] > 0 and st["preflight"] == "Passed"
    assert st["goodput"]["gpuHours"] == 0 and "runningSince" not in st["goodput"]  # a CPU job, finished
    # The adapter reached the Hub with the token from the Secret, and the status says where; wandb ran offline.
    final = tmp_path / "pvc" / "shared" / "tiny-cpu-sft" / "final"
    assert st["pushed"]["repo"] == "acme/tiny-2node" and st["pushed"]["commit"].startswith(hub.url)
    pushed = hub.files("acme/tiny-2node")
    assert pushed["adapter_model.safetensors"] == (final / "adapter_model.safetensors").read_bytes()
    assert list((tmp_path / "pvc" / "shared" / "tiny-cpu-sft" / "wandb").glob("offline-run-*/run-*.wandb"))
    if runtime == "containers":  # kubelet-style probes of the chart's Deployment: started, then live all along
        assert chart_operator.startup_probes[-1:] == [200], chart_operator.startup_probes
        # Live all along as a kubelet judges it: never failureThreshold misses in a row (restarts 0 below), the odd
        # probe missed on this busy machine at most.
        answered = [p for p in chart_operator.probes if p == 200]
        assert chart_operator.probes[-1:] == [200] and len(answered) >= 0.9 * len(chart_operator.probes), \
            chart_operator.probes
        # Restarted only where the operator stepped down on purpose (checked for every module at the fixture's end).
        assert not chart_operator.crashes(), chart_operator.restarts


@pytest.mark.parametrize("runtime", ["containers"], indirect=True)  # the images, as containers
def test_killed_node_gang_restarts_and_resumes_without_redoing_work(runtime, chart_operator, kubectl, control_plane,
                                                                    namespace, tiny_model_dir, tmp_path):
    shared_volume(kubectl, namespace, tmp_path / "pvc" / "shared")
    job = tiny_two_node_job(tiny_model_dir, tmp_path, maxSteps=KILLED_RUN_STEPS)
    with pod_runner(runtime, kubectl, control_plane, namespace, tmp_path) as runner:
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
    assert st["attempt"] == 2 and st["progress"]["step"] == KILLED_RUN_STEPS
    second = json.loads(next((tmp_path / "pods").glob("tiny-cpu-sft-a2-0-*/termination-log")).read_text())
    resumed_step = int(second["resumedFrom"].rsplit("-", 1)[1])
    steps = [r["step"] for r in volume_progress_records(tmp_path)]
    first_after_restart = steps[steps.index(max(s for s in steps if s <= resumed_step)) + 1:]
    # Attempt 2 starts right after the checkpoint it resumed from: at most the steps since it were redone.
    assert resumed_step >= 20 and min(first_after_restart) == resumed_step + 1


@pytest.mark.parametrize("runtime", ["processes"], indirect=True)  # six stop/resume cycles: fast starts
def test_suspending_a_two_node_job_at_random_moments_never_crashes_or_redoes_a_step(
        runtime, chart_operator, kubectl, control_plane, namespace, tiny_model_dir, tmp_path):
    """spec.suspend, flipped at random moments (startup, data preparation, mid-step, at a checkpoint):
    every node gets SIGTERM from its pod's deletion, the ranks agree on one stop step, save one checkpoint and exit
    143; the resumed gang starts right after it. Seeded, so a failure replays."""
    rng = random.Random(20261123)
    shared_volume(kubectl, namespace, tmp_path / "pvc" / "shared")
    job = tiny_two_node_job(tiny_model_dir, tmp_path, maxSteps=100000)
    suspend = ["patch", "ftj", "tiny-cpu-sft", "-n", namespace, "--type=merge", "-p"]
    stopped: list[str] = []
    with pod_runner(runtime, kubectl, control_plane, namespace, tmp_path) as runner:
        kubectl.run("apply", "-n", namespace, "-f", str(job))
        for cycle in range(6):  # three moments of each kind; seeded, the same six every run
            wait_status(kubectl, namespace, lambda s: s.get("phase") == "Running", 180, chart_operator, runner)
            if cycle % 2:  # while the gang starts: launcher, rendezvous, model loading, data preparation
                time.sleep(rng.uniform(0.0, 8.0))
            else:  # while it trains: a random moment after this run's first new step
                done = max([0, *(r["step"] for r in volume_progress_records(tmp_path) if "step" in r)])
                wait_until(f"cycle {cycle}: a step after {done}", lambda done=done: max(
                    [0, *(r["step"] for r in volume_progress_records(tmp_path) if "step" in r)]) > done, timeout=300)
                time.sleep(rng.uniform(0.0, 3.0))
            kubectl.run(*suspend, json.dumps({"spec": {"suspend": True}}))
            wait_status(kubectl, namespace, lambda s: s.get("phase") == "Suspended", 60, chart_operator, runner)
            live = [n for n, p in runner.processes.items() if n not in stopped]
            try:
                wait_until(f"cycle {cycle}: the stopped pods' processes end", lambda live=live: all(
                    runner.processes[n].poll() is not None for n in live), timeout=180, every=0.5)
            except NotWithin:
                pass  # the codes below say which did not
            codes = {n: runner.processes[n].poll() for n in live}
            assert len(codes) == 2 and set(codes.values()) == {143}, (cycle, codes)  # stopped, never crashed
            stopped += live
            kubectl.run(*suspend, json.dumps({"spec": {"suspend": False}}))
        st = wait_status(kubectl, namespace, lambda s: s.get("phase") == "Running", 180, chart_operator, runner)
    assert (st["attempt"], st["restarts"]) == (1, 0), st  # a suspend is not a failure
    steps = [r["step"] for r in volume_progress_records(tmp_path) if "step" in r]
    # One run of steps, each done once: every stop saved the step it stopped at and the next start resumed there.
    assert steps == sorted(set(steps)) and len(steps) >= 3, steps  # at least one per cycle that trained
    stops = [json.loads((tmp_path / "pods" / n / "termination-log").read_text()) for n in stopped
             if (tmp_path / "pods" / n / "termination-log").exists()]
    assert all(s["exitCode"] == 143 for s in stops), stops


@pytest.mark.parametrize("runtime", ["processes"], indirect=True)
def test_a_diverging_job_fails_at_once_with_its_reason_and_is_not_retried(runtime, chart_operator, kubectl,
                                                                           control_plane, namespace, tiny_model_dir,
                                                                           tmp_path):
    shared_volume(kubectl, namespace, tmp_path / "pvc" / "shared")
    job = tiny_two_node_job(tiny_model_dir, tmp_path, learningRate=10)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["method"] = {"type": "full"}
    doc["spec"]["checkpoints"] = {"saveSteps": 1, "keep": 10}
    job.write_text(yaml.safe_dump(doc))
    with pod_runner(runtime, kubectl, control_plane, namespace, tmp_path) as runner:
        kubectl.run("apply", "-n", namespace, "-f", str(job))
        st = wait_status(kubectl, namespace, lambda s: s.get("phase") in ("Succeeded", "Failed"), 300,
                         chart_operator, runner)
    assert (st["phase"], st["reason"], st["attempt"], st["restarts"]) == ("Failed", "LossDiverged", 1, 0), st
    assert "the loss diverged" in st["message"] and "exit 79: not retried" in st["message"]
    assert re.search(r"the last checkpoint before the loss began to rise is \S+/checkpoint-\d+ \(verified, kept\)",
                     st["message"])
    assert st["message"].endswith("tune spec.runPolicy.divergence (exit 79: not retried)")  # the remedy, whole
    failed = next(cd for cd in st["conditions"] if cd["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "LossDiverged")
    row = kubectl.run("get", "ftj", "tiny-cpu-sft", "-n", namespace, "--no-headers").stdout.split()
    assert row[1] == "Failed" and "LossDiverged" in row
    assert wait_events(kubectl, namespace, reason="LossDiverged", type_="Warning", op=chart_operator)


@pytest.mark.parametrize("runtime", ["containers"], indirect=True)  # the images, as containers
def test_two_nodes_without_any_volume_resume_a_killed_gang_from_the_bucket(runtime, chart_operator, kubectl,
                                                                          control_plane, namespace, tiny_model_dir,
                                                                          minio, tmp_path):
    """No claim at all: model, data and output in MinIO, credentials from a Secret. A node killed after a
    checkpoint is complete in the bucket: the new gang (fresh emptyDirs) resumes from the bucket."""
    from tests.support.minio import ACCESS_KEY, SECRET_KEY

    digest = namespace.rsplit("-", 1)[-1]
    bucket = minio.bucket(f"e2e-{digest}")
    fs = minio.filesystem()
    for path in tiny_model_dir.iterdir():
        fs.put_file(str(path), f"{bucket}/models/tiny/{path.name}")
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-sft.yaml").read_text())
    rows = doc["spec"]["data"].pop("train")[0]["inline"]
    fs.pipe_file(f"{bucket}/data/train.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    doc["spec"]["model"]["name"] = f"{bucket}/models/tiny"
    doc["spec"]["data"]["train"] = [{"path": f"{bucket}/data/train.jsonl"}]
    doc["spec"]["distributed"]["numNodes"] = 2
    doc["spec"]["distributed"]["rendezvousPort"] = free_port()
    doc["spec"]["training"]["maxSteps"] = KILLED_RUN_STEPS
    doc["spec"]["output"] = {"uri": f"{bucket}/runs/tiny"}
    doc["spec"]["s3"] = {"endpointURL": minio.url, "region": "us-east-1", "credentialsSecret": "s3-creds"}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    kubectl.run("create", "secret", "generic", "s3-creds", "-n", namespace,
                f"--from-literal=AWS_ACCESS_KEY_ID={ACCESS_KEY}", f"--from-literal=AWS_SECRET_ACCESS_KEY={SECRET_KEY}")
    with pod_runner(runtime, kubectl, control_plane, namespace, tmp_path) as runner:
        kubectl.run("apply", "-n", namespace, "-f", str(job))
        st = wait_status(kubectl, namespace, lambda s: (s.get("upload") or {}).get("completeStep", 0) >= 20, 300,
                         chart_operator, runner)
        assert st["checkpoint"]["path"].startswith(f"{bucket}/runs/tiny/checkpoint-")
        victim = next(n for n in runner.processes if "-a1-1-" in n)
        runner.kill(victim)
        wait_status(kubectl, namespace, lambda s: s.get("attempt") == 2, 120, chart_operator, runner)
        st = wait_status(kubectl, namespace, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600,
                         chart_operator, runner)
    assert st["phase"] == "Succeeded", st
    assert st["attempt"] == 2 and st["progress"]["step"] == st["upload"]["completeStep"] == KILLED_RUN_STEPS
    second = json.loads(next((tmp_path / "pods").glob("tiny-cpu-sft-a2-0-*/termination-log")).read_text())
    assert int(second["resumedFrom"].rsplit("-", 1)[1]) >= 20  # from the bucket: the new pods' volumes were empty
    run = f"{bucket}/runs/tiny"
    assert fs.exists(f"{run}/final/adapter_model.safetensors") and fs.exists(f"{run}/summary.json")
    complete = minio.complete_checkpoints(run)
    assert max(complete) == KILLED_RUN_STEPS and len(complete) <= 2  # checkpoints.keep: 2 of the example
    secret_in_spec = kubectl.run("get", "ftj", "tiny-cpu-sft", "-n", namespace, "-o", "yaml").stdout
    assert SECRET_KEY not in secret_in_spec


@pytest.mark.parametrize("volume", ["claim", "emptyDir"])
def test_two_nodes_upload_complete_checkpoints_to_a_bucket_with_a_claim_or_without(
        runtime, chart_operator, kubectl, control_plane, namespace, tiny_model_dir, minio, tmp_path, volume):
    """output.uri on 2 nodes, both pods on one ReadWriteMany claim (node 0 uploads what the shared directory holds)
    or each on its emptyDir (each node uploads its own files, node 0 marks them complete): Succeeded, every kept
    checkpoint complete in the bucket with both processes' files, nothing partial, the prefix's lease released by
    the job that held it (issue 42, 5)."""
    from tests.support.minio import ACCESS_KEY, SECRET_KEY

    fs = minio.filesystem()
    bucket = minio.bucket(f"e2e-{volume.lower()}-{namespace.rsplit('-', 1)[-1]}")
    for path in tiny_model_dir.iterdir():
        fs.put_file(str(path), f"{bucket}/models/tiny/{path.name}")
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-sft.yaml").read_text())
    doc["spec"]["model"]["name"] = f"{bucket}/models/tiny"
    doc["spec"]["distributed"].update(numNodes=2, rendezvousPort=free_port())
    doc["spec"]["output"] = {"uri": f"{bucket}/runs/tiny"}
    if volume == "claim":
        shared_volume(kubectl, namespace, tmp_path / "pvc" / "shared")
        doc["spec"]["output"]["claimName"] = "shared"
    doc["spec"]["s3"] = {"endpointURL": minio.url, "region": "us-east-1", "credentialsSecret": "s3-creds"}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    kubectl.run("create", "secret", "generic", "s3-creds", "-n", namespace,
                f"--from-literal=AWS_ACCESS_KEY_ID={ACCESS_KEY}", f"--from-literal=AWS_SECRET_ACCESS_KEY={SECRET_KEY}")
    with pod_runner(runtime, kubectl, control_plane, namespace, tmp_path) as runner:
        kubectl.run("apply", "-n", namespace, "-f", str(job))
        st = wait_status(kubectl, namespace, lambda s: s.get("phase") in ("Succeeded", "Failed"), 300,
                         chart_operator, runner)
    assert st["phase"] == "Succeeded", st
    run = f"{bucket}/runs/tiny"
    steps = {entry.rstrip("/").rsplit("-", 1)[-1] for entry in fs.ls(run, detail=False, refresh=True)
             if entry.rstrip("/").rsplit("/", 1)[-1].startswith("checkpoint-")}
    assert steps == {"20", "30"} and minio.complete_checkpoints(run) == {20, 30}, steps  # keep 2, none partial
    names = {p.rsplit("/", 1)[-1] for p in fs.find(f"{run}/checkpoint-30")}
    assert {"trainer_state.json", "adapter_model.safetensors", "rng_state_0.pth", "rng_state_1.pth"} <= names, names
    assert st["upload"]["completeStep"] == 30 and st["checkpoint"]["path"] == f"{run}/checkpoint-30"
    summary = json.loads(next((tmp_path / "pods").glob("tiny-cpu-sft-a1-0-*/termination-log")).read_text())
    assert summary["uploaded"]["checkpointUploadRetries"] == 0 and "checkpointUploadFailures" not in summary["uploaded"]
    owner = json.loads(fs.cat_file(f"{run}/.finetune-owner.json"))
    uid = kubectl.json("get", "ftj", "tiny-cpu-sft", "-n", namespace)["metadata"]["uid"]
    assert owner["released"] is True and owner["writer"] == f"FineTuneJob {namespace}/tiny-cpu-sft (uid {uid})"
