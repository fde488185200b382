"""docs/getting-started/first-cluster-job.md, run as written: every ```bash block of the page, verbatim, in order,
against the test control plane, each block's output compared with the ```text block the page shows after it
(tests/support/doc_commands.py); then the install page's commands for a cluster (INSTALL_SECTIONS) and the object
storage page, which start where it ends. A page whose commands or output drift from the code fails here.

Collected by two modules that take the case from here: test_getting_started_containers.py (the chart's operator
Deployment and the trainer pods from our images) and test_getting_started_processes.py (the operator and the pods
as processes from this checkout: the twin, run with --twins). What stands in for a real cluster, and nothing else:

- the placeholders are replaced: `<your registry>` by REGISTRY, and the object storage page's `<your S3 endpoint>`
  and `<your bucket>` by the suite's MinIO (tests/support/minio.py) and a bucket made there;
- `docker` is tests/support/docker_stand_in.py: `docker build` names the images hack/build-images.sh built (no
  rebuild), `docker push` checks the name;
- the test kubelet (tests/support/pod_runner.py) runs the pods, with the Hub at a local stand-in
  (tests/support/hub_server.py) that serves a locally built tiny Qwen2 under the page's model id, and a free port
  for the rendezvous (pods here share one network); a stand-in provisioner (tests/support/provisioner.py) gives
  the page's claim a volume; the chart's operator runs as chart_operator.py starts it (no kubelet runs the
  Deployment here).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support import doc_commands
from tests.support.chart_operator import start_installed_operator
from tests.support.containers import ContainerPodRunner, built_images, podman
from tests.support.hub_server import StandInHub
from tests.support.pod_runner import PodRunner
from tests.support.provisioner import StandInProvisioner

PAGE = ROOT / "docs" / "getting-started" / "first-cluster-job.md"
# Run after the page, in what it made: the install page's commands for a cluster (its pip and docker commands are
# the quick start's test's and the page's own).
INSTALL = ROOT / "docs" / "operations" / "install.md"
INSTALL_SECTIONS = ("Prerequisites", "Claims and the Hub token the examples use")
# Then the object storage page, which starts where the first job's page ends, against MinIO.
OBJECT_STORAGE = ROOT / "docs" / "getting-started" / "object-storage.md"
REGISTRY = "localhost/finetunejob-docs"
# The page's model: TRL's tiny test model, which TRL's own tests load with the transformers we pin.
HUB_MODEL = "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"
STEP_TIMEOUT = 1200  # a block's own waits (kubectl wait --timeout) end first
READ_AGAIN_SECONDS = 60  # how long a block of kubectl reads is run again until it prints what the page shows


@pytest.fixture(scope="module")
def hub_model(tmp_path_factory) -> Path:
    """A stand-in for HUB_MODEL: its shape (Qwen2, 2 layers, hidden 8, vocabulary 152064), our small tokenizer."""
    from finetune_trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("hub-model"), architecture="qwen2", hidden=8, heads=4,
                            kv_heads=2, intermediate=32, vocab_size=152064)


def page_value(steps: list[doc_commands.Step], pattern: str) -> tuple[str, ...]:
    """Groups of the first match of `pattern` in the page's commands (the namespace it creates, its release)."""
    for step in steps:
        m = re.search(pattern, step.commands)
        if m:
            return m.groups()
    raise AssertionError(f"{PAGE.name} has no command matching {pattern}")


def shell_env(control_plane, kubectl, tmp_path: Path, images: dict[str, str]) -> dict[str, str]:
    """A user's shell: kubectl, helm and docker on PATH, the cluster in KUBECONFIG, a home of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\ncd "{ROOT}" && exec "{sys.executable}" -m tests.support.docker_stand_in "$@"\n')
    docker.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    path = os.pathsep.join([str(bin_dir), str(control_plane.bin_dir), str(Path(sys.executable).parent),
                            os.environ["PATH"]])
    return {**kubectl.env, "PATH": path, "HOME": str(home), "DOCKER_STAND_IN_LOG": str(tmp_path / "docker.log"),
            "DOCKER_STAND_IN_IMAGES": json.dumps(images),
            "DOCKER_STAND_IN_CACHE": os.environ.get("FINETUNE_CACHE", str(Path.home() / ".cache" / "finetunejob")),
            "HF_TOKEN": "hf_reader_token"}  # what install.md asks the reader to set


def test_first_cluster_job_runs_as_written(runtime, control_plane, kubectl, hub_model, minio, tmp_path):
    steps = [(PAGE, s) for s in doc_commands.steps(PAGE)]
    steps += [(INSTALL, s) for heading in INSTALL_SECTIONS for s in doc_commands.steps(INSTALL, heading)]
    steps += [(OBJECT_STORAGE, s) for s in doc_commands.steps(OBJECT_STORAGE)]
    fs = minio.filesystem()
    bucket = minio.bucket(f"finetunejob-docs-{runtime}-{uuid.uuid4().hex[:8]}").removeprefix("s3://")  # its own
    placeholders = {"<your registry>": REGISTRY, "<your S3 endpoint>": minio.url, "<your bucket>": bucket}
    (namespace,) = page_value([s for _, s in steps], r"kubectl create namespace (\S+)")
    release, system_ns = page_value([s for _, s in steps], r"helm install (\S+) \S+ --namespace (\S+)")
    images = dict(zip(("operator", "trainer"), built_images(), strict=True)) if runtime == "containers" else {}
    env = {**shell_env(control_plane, kubectl, tmp_path, images), **minio.env}  # the reader's S3 credentials
    runner_class = ContainerPodRunner if runtime == "containers" else PodRunner
    operator = None
    with StandInHub(token="hf_unused") as hub, StandInProvisioner(kubectl, namespace) as provisioner, \
            runner_class(kubectl, control_plane, namespace, tmp_path, network_env={"HF_ENDPOINT": hub.url},
                         own_ports=True) as runner:
        hub.serve_model(HUB_MODEL, hub_model)
        try:
            for page, step in steps:
                commands = step.commands
                for placeholder, value in placeholders.items():
                    commands = commands.replace(placeholder, value)
                where = f"{page.name}:{step.line}"
                deadline = time.monotonic() + READ_AGAIN_SECONDS
                while True:
                    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=ROOT, env=env,
                                          capture_output=True, text=True, timeout=STEP_TIMEOUT)
                    assert proc.returncode == 0, (f"{where} exited {proc.returncode}:\n{commands}\n{proc.stdout}\n"
                                                  f"{proc.stderr}\n{_tails(operator, runner, provisioner)}")
                    diff = None if step.expected is None else doc_commands.mismatch(step.expected, proc.stdout)
                    # A read may show the cluster a moment before what the page shows (an Event after the status
                    # the step before waited for): read again, as a reader would, until the deadline.
                    if diff is None or not doc_commands.only_reads(commands) or time.monotonic() > deadline:
                        break
                    time.sleep(1)
                assert diff is None, f"{where}: {diff}"
                if "helm install" in step.commands:  # no kubelet runs the chart's Deployment here
                    operator = start_installed_operator(runtime, control_plane, kubectl, tmp_path / "operator",
                                                        release, system_ns)
            # What the page promises beyond its printed output: the model came from the Hub by its id, and the
            # adapter is on the claim.
            assert f"/{HUB_MODEL}/resolve/" in " ".join(hub.downloads()), hub.requests
            final = tmp_path / "pvc" / "tiny-sft-output" / "tiny-sft" / "final"
            assert (final / "adapter_model.safetensors").is_file(), sorted(final.parent.glob("*"))
            # install.md's Secret: the token by reference, as the examples read it.
            secret = kubectl.json("get", "secret", "hf-token", "-n", namespace)
            assert base64.b64decode(secret["data"]["token"]).decode() == env["HF_TOKEN"]
            # The object storage page's job: its final/ in the bucket.
            assert fs.exists(f"{bucket}/runs/tiny-sft/final/adapter_model.safetensors")
            assert not runner.errors and not provisioner.errors, (runner.errors, provisioner.errors)
            assert not getattr(operator, "crashes", list)(), operator.restarts  # a step-down at most (containers)
        finally:
            if operator is not None:
                operator.stop()
            _clean_up(kubectl, control_plane, release, system_ns, namespace, provisioner, tmp_path / "docker.log",
                      images)


def _tails(operator, runner, provisioner) -> str:
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(runner.workdir.glob("pods/*/log")))
    return (f"operator:\n{operator.log_tail(30) if operator else '(not started)'}\npods:\n{logs}\n"
            f"runner errors: {runner.errors[-3:]}\nprovisioner errors: {provisioner.errors[-3:]}")


def _clean_up(kubectl, control_plane, release, system_ns, namespace, provisioner, docker_log: Path, images
              ) -> None:
    """What the page created, gone before the next module on this control plane (the twin creates it again)."""
    subprocess.run([str(control_plane.bin_dir / "helm"), "uninstall", release, "--namespace", system_ns, "--wait"],
                   env=kubectl.env, check=False, capture_output=True, timeout=300)
    for ns in (namespace, system_ns):
        kubectl.run("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
    provisioner.release()
    for ns in (namespace, system_ns):
        kubectl.run("wait", "namespace", ns, "--for=delete", "--timeout=180s", check=False, timeout=240)
    built = [json.loads(line) for line in docker_log.read_text().splitlines()] if docker_log.exists() else []
    for image in built if images else []:  # the names `docker build` gave our images
        podman("untag", images[image["image"]], image["tag"], check=False)
