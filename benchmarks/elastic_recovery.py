"""Time from a failure to the next training step: a gang restart (today's fixed gang), a restart in place
(runPolicy.inPlaceRestarts) and an elastic shrink (distributed.minNodes), side by side in one run on a fresh test
cluster; prints figures with each recovery broken down.

The same 3-node job (the tiny example, one process per node) each time, its pods run by the test kubelet (local
processes, or the images as podman containers with --runtime containers), the operator as a process with the
chart's default restart backoff (10 s; --backoff to change it):
  gang      a node's container is killed (SIGKILL): the attempt fails, the operator restarts the whole gang.
  in-place  one training process is killed: torchrun restarts the workers on the same pods, the group re-forms.
  elastic   a node's container is killed and its node made unschedulable: the survivors re-form on 2 nodes.
  elastic-deleted  the same node's pod deleted instead (a preemption or an eviction: SIGTERM, its grace period):
            the stopped node stops every rank at one step with a checkpoint, leaves the rendezvous, and the
            survivors re-form on 2 nodes without waiting for its keep-alives to expire.
Each recovery is measured from the kill to the next optimizer step (the trainer's record of the new group, which
notes when each phase of its start ended), with the Kubernetes steps of a gang restart from the objects' times.
Usage: .venv/bin/python benchmarks/elastic_recovery.py [--runtime processes|containers] [--backoff 10]
       [--only gang|in-place|elastic|elastic-deleted ...] [--kill-after 20] [--out F]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image")]

import yaml  # noqa: E402

from finetune_operator.api import constants as c  # noqa: E402
from finetune_trainer.tiny_model import build_tiny_model  # noqa: E402
from finetune_trainer.training.workers import parse_iso  # noqa: E402
from tests.conftest import CRD_FILE, Kubectl  # noqa: E402
from tests.e2e.cluster_training import shared_volume  # noqa: E402
from tests.e2e.elastic_training import NODE_LABEL, nodes_of_our_own, pods_by_index  # noqa: E402
from tests.support.containers import built_images  # noqa: E402
from tests.support.controlplane import ControlPlane, build_binaries, free_port  # noqa: E402
from tests.support.operator_process import OperatorProcess  # noqa: E402
from tests.support.polling import wait_until  # noqa: E402

SCENARIOS = ("gang", "in-place", "elastic", "elastic-deleted")


def k8s_time(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def job_doc(scenario: str, namespace: str) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-sft.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["name"] = "/output/models/tiny"
    spec["data"]["train"][0]["inline"] *= 2
    spec["training"].update(maxSteps=100000, perDeviceTrainBatchSize=1, gradientAccumulationSteps=2)
    spec["distributed"].update(numNodes=3, rendezvousPort=free_port())
    spec["output"] = {"claimName": "shared"}
    spec["checkpoints"] = {"saveSteps": 10, "keep": 3}
    spec["runPolicy"] = {"inPlaceRestarts": 3 if scenario == "in-place" else 0}
    if scenario.startswith("elastic"):
        spec["distributed"]["minNodes"] = 2
        spec["runPolicy"].pop("inPlaceRestarts")
    selector = {"matchLabels": {"finetunejob.dev/job-name": doc["metadata"]["name"]}}
    spec["pod"] = {"nodeSelector": {NODE_LABEL: namespace}, "affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}]}}}
    return doc


def groups(output: Path) -> list[dict]:
    path = output / "workers.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def last_step(output: Path) -> int:
    path = output / "progress.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return max((r["step"] for r in records if "loss" in r and r.get("phase") != "Preparing"), default=0)


def wait(what: str, predicate, timeout: float = 600.0):
    return wait_until(what, predicate, timeout)


def scenario_run(scenario: str, kubectl: Kubectl, cp: ControlPlane, work: Path, model: Path, runtime: str,
                 kill_after: int = 20) -> dict:
    from tests.e2e.cluster_training import pod_runner

    namespace = f"bench-{scenario}"
    kubectl.run("create", "namespace", namespace)
    root = work / namespace
    output = root / "pvc" / "shared" / "tiny-cpu-sft"
    shutil.copytree(model, output / "models" / "tiny")
    shared_volume(kubectl, namespace, root / "pvc" / "shared")
    nodes = nodes_of_our_own(kubectl, namespace)
    (root / "job.yaml").write_text(yaml.safe_dump(job_doc(scenario, namespace)))
    status = lambda: kubectl.json("get", "ftj", "tiny-cpu-sft", "-n", namespace).get("status") or {}  # noqa: E731
    victim = ""  # the pod deleted (elastic-deleted)
    try:
        with pod_runner(runtime, kubectl, cp, namespace, root) as runner:
            kubectl.run("apply", "-n", namespace, "-f", str(root / "job.yaml"))
            wait(f"3 nodes training past checkpoint {kill_after}", lambda: any(g["nodes"] == 3 for g in groups(output))
                 and (status().get("checkpoint") or {}).get("step", 0) >= kill_after)
            before = len(groups(output))
            if scenario == "in-place":
                runner.kill_worker(runner.running("-a1-1-"))
            else:
                if scenario.startswith("elastic"):
                    kubectl.run("cordon", pods_by_index(kubectl, namespace)["2"][-1]["spec"]["nodeName"])
                if scenario == "elastic-deleted":
                    victim = runner.running("-a1-2-")
                    kubectl.run("delete", "pod", victim, "-n", namespace, "--wait=false")
                else:
                    runner.kill(runner.running("-a1-2-"))
            killed = time.time()
            reached = last_step(output)  # what a gang restart redoes is not in its new group's report: counted here
            seen: dict[str, float] = {}  # when the operator's status first said Restarting (a gang restart)

            def next_group():
                if "restarting" not in seen and status().get("phase") == "Restarting":
                    seen["restarting"] = time.time()
                return len(groups(output)) > before and groups(output)[-1]

            group = wait("the next group's first step", next_group)
            if scenario != "gang":  # the operator's account of it (status.restartsInPlace), a pass after the report
                wait("the operator's account of the group", lambda: status().get("restartsInPlace", 0) >= 1, 120)
            st = status()
            attempt2 = kubectl.json_or_none("get", "job", "tiny-cpu-sft-a2", "-n", namespace)
            pods2 = [p for ps in pods_by_index(kubectl, namespace).values() for p in ps
                     if p["metadata"]["labels"].get("finetunejob.dev/attempt") == "2"]
    finally:
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
        for node in nodes:
            kubectl.run("delete", "node", node, "--wait=false", check=False)
    at = {name: parse_iso(value) for name, value in group["at"].items()}
    phases: dict[str, float] = {}
    if scenario == "gang":
        restarting = seen.get("restarting")
        created = k8s_time(attempt2["metadata"]["creationTimestamp"]) if attempt2 else None
        running = max((k8s_time(p["status"].get("startTime")) or 0 for p in pods2), default=None)
        marks = [("failure seen by the operator", restarting), ("backoff, old gang stopped, new Job", created),
                 ("pods scheduled and started", running), ("launcher, torchrun, rendezvous, worker start",
                                                           at["workersStarted"])]
    else:
        failed = parse_iso(group["failedAt"]) if group.get("failedAt") else None
        marks = [("detection (a survivor's collective fails)", failed),
                 ("torchrun restart and re-rendezvous, worker start", at["workersStarted"])]
    marks += [("imports, data, model load", at["modelLoaded"]), ("checkpoint load", at["checkpointLoaded"]),
              ("first optimizer step", at["firstStep"])]
    last = killed
    for name, when in marks:
        if when is not None:
            phases[name] = round(max(when - last, 0.0), 2)
            last = max(when, last)
    return {"seconds": round(at["firstStep"] - killed, 2), "phases": phases, "nodes": group["nodes"],
            "lostSteps": group.get("lostSteps"),
            "stepsRedone": max(reached - int(group.get("resumedStep") or 0), 0), "attempt": st.get("attempt"),
            "restartsInPlace": st.get("restartsInPlace", 0),
            # The deleted pod's agent took its node out of the rendezvous (finetune_trainer.agent.leave).
            "leftRendezvous": scenario == "elastic-deleted" and "left the rendezvous" in (
                root / "pods" / victim / "log").read_text(errors="replace")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runtime", choices=("processes", "containers"), default="processes")
    parser.add_argument("--backoff", type=float, default=10.0, help="the operator's restartBackoffSeconds")
    parser.add_argument("--only", choices=SCENARIOS, action="append")
    parser.add_argument("--kill-after", type=int, default=20, help="the checkpoint step after which the kill comes")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cp = ControlPlane(build_binaries()).start()
    work = Path(tempfile.mkdtemp(prefix="elastic-recovery-"))
    operator, finished = None, False
    try:
        kubectl = Kubectl(cp.kubeconfig)
        kubectl.run("apply", "--server-side", "-f", str(CRD_FILE.parent))
        kubectl.wait_condition("Established", "crd/finetunejobs.finetunejob.dev")
        # In containers mode the trainer pods run the image the operator names: the one built here, not the
        # published default (no registry is reachable from this machine).
        env = {c.ENV_OPERATOR_TRAINER_IMAGE: built_images()[1]} if args.runtime == "containers" else {}
        operator = OperatorProcess(cp.kubeconfig, work / "operator.log", restart_backoff=args.backoff,
                                   env=env).start()
        model = build_tiny_model(work / "model")
        results = {s: scenario_run(s, kubectl, cp, work, model, args.runtime, args.kill_after)
                   for s in args.only or SCENARIOS}
        finished = True
    finally:
        try:
            if operator is not None:
                operator.stop()
        finally:  # the control plane stops even when the operator's stop fails
            cp.stop(remove=finished)  # a run that failed keeps the control plane's logs and its own, says where
        if finished:  # what cannot be removed is said, not skipped in silence
            shutil.rmtree(work, onerror=lambda _f, path, exc: print(f"could not remove {path}: {exc[1]}",
                                                                     file=sys.stderr))
        else:
            print(f"the benchmark's directory kept for its logs: {work}", file=sys.stderr)
    gang = results.get("gang", {}).get("seconds")
    print(f"time from a failure to the next training step ({args.runtime}, restartBackoffSeconds {args.backoff:g})")
    for name, r in results.items():
        ratio = f"  ({gang / r['seconds']:.1f}x faster than the gang restart)" if gang and name != "gang" else ""
        print(f"  {name:9s} {r['seconds']:6.1f} s on {r['nodes']} node(s), {r['stepsRedone']} step(s) redone, "
              f"attempt {r['attempt']}, restarts in place {r['restartsInPlace']}{ratio}")
        for phase, seconds in r["phases"].items():
            print(f"      {seconds:6.2f} s  {phase}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
