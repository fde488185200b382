"""Failover of the operator's replicas (leader election on a Lease), on a fresh real control plane; prints figures.

A fresh etcd + kube-apiserver + controller-manager + scheduler + kwok with GPU nodes, two operator replicas as
processes (each its own audited user, as the chart runs them: --leader-elect), and:
  1. kills: `--kills` times, the leader is SIGKILLed at the moment a new FineTuneJob is created; measured per kill:
     kill -> the standby holds the Lease, and kill -> that job's first status write (the user-visible gap). The
     killed replica comes back as the standby (a kubelet restart) before the next kill.
  2. rolling upgrade while `--jobs` jobs run: what `helm upgrade` does with maxSurge 1 / maxUnavailable 0 (a new
     replica starts and stands by, then an old one gets SIGTERM; twice), while a new job is created every
     `--every` seconds and a running gang loses a pod every few seconds; measured: the longest any of those changes
     waited for its reconcile, and, from the audit log, whether two replicas ever wrote in the same period.
  3. one writer at a time (benchmarks/failover_writers.py): `--freezes` SIGSTOP/SIGCONT trials and `--partitions`
     partition trials of the leader with jobs in flight (its writes after the takeover, from the audit log), and
     `--hog-minutes` with every core saturated (step-downs with nobody else holding the Lease).
Usage: .venv/bin/python benchmarks/failover.py [--kills 20] [--jobs 50] [--freezes 20] [--partitions 20]
       [--hog-minutes 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402

from benchmarks import failover_writers as writers  # noqa: E402
from benchmarks.scale import add_nodes, job_doc, percentile  # noqa: E402
from finetune_operator.api import constants as c  # noqa: E402
from tests.conftest import CRD_FILE  # noqa: E402
from tests.support import audit  # noqa: E402
from tests.support.controlplane import REPLICA_USERS, ControlPlane, build_binaries  # noqa: E402
from tests.support.replicas import health, replica  # noqa: E402
from tests.support.tcp_proxy import FreezableProxy  # noqa: E402

NAMESPACE, LEASES = "failover", "operator-system"
FAIL_ATTEMPTS, FAIL_EXIT_CODE = "test.finetunejob.dev/fail-attempts", "test.finetunejob.dev/fail-exit-code"


class Cluster:
    def __init__(self, cp: ControlPlane):
        api = config.new_client_from_config(str(cp.kubeconfig))
        self.api, self.core = api, client.CoreV1Api(api)
        self.custom, self.leases = client.CustomObjectsApi(api), client.CoordinationV1Api(api)

    def holder(self) -> str | None:
        try:
            return self.leases.read_namespaced_lease("finetunejob-operator", LEASES).spec.holder_identity
        except client.ApiException:
            return None

    def create(self, name: str, nodes: int = 1) -> float:
        self.custom.create_namespaced_custom_object(c.GROUP, c.VERSION, NAMESPACE, c.PLURAL,
                                                    job_doc(name, NAMESPACE, nodes, gpus=0))
        return time.time()

    def delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, NAMESPACE, c.PLURAL, name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def status(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(c.GROUP, c.VERSION, NAMESPACE, c.PLURAL, name).get(
            "status") or {}


def wait(what: str, predicate, timeout: float = 120.0, every: float = 0.05):
    return writers.wait(what, predicate, timeout, every)


def kills(cluster: Cluster, replicas: dict, count: int) -> dict:
    to_lease, to_reconcile = [], []
    for i in range(count):
        leader = wait("a leader", cluster.holder)
        standby = next(u for u in replicas if u != leader)
        wait("the standby standing by", lambda s=standby: (health(replicas[s]) or (0, {}))[1].get("role")
             == "standby")
        killed = time.time()
        replicas[leader].kill()
        name = f"kill-{i:02d}"
        cluster.create(name)
        wait("the standby leading", lambda s=standby: cluster.holder() == s, 60, 0.02)
        led = time.time()
        wait(f"{name} reconciled", lambda n=name: cluster.status(n).get("phase"), 60, 0.02)
        reconciled = time.time()
        to_lease.append(led - killed)
        to_reconcile.append(reconciled - killed)
        print(f"kill {i + 1:2d}: lease taken after {led - killed:5.2f}s, new job reconciled after "
              f"{reconciled - killed:5.2f}s", flush=True)
        replicas[leader].start()  # the kubelet restarts the killed container: the next standby
    return {"kills": count,
            "lease_taken_p50_s": percentile(to_lease, 50), "lease_taken_p99_s": percentile(to_lease, 99),
            "lease_taken_max_s": max(to_lease),
            "reconciled_p50_s": percentile(to_reconcile, 50), "reconciled_p99_s": percentile(to_reconcile, 99),
            "reconciled_max_s": max(to_reconcile)}


def rolling_upgrade(cp: ControlPlane, cluster: Cluster, replicas: dict, jobs: int, every: float) -> dict:
    names = [f"run-{i:02d}" for i in range(jobs)]
    for name in names:
        cluster.create(name, nodes=2)
    wait(f"{jobs} jobs Running", lambda: all(cluster.status(n).get("phase") == "Running" for n in names), 300, 1)
    print(f"{jobs} two-node jobs Running", flush=True)
    changes: list[tuple[str, float, tuple[str, int]]] = []  # (what, when, the status that says it was handled)
    seen: dict[tuple[str, int], float] = {}  # (job, attempt) -> first seen with a phase (0: any attempt)
    stop, recorded = threading.Event(), threading.Event()

    def record() -> None:  # one list every 0.2 s: when each job's status first showed what was asked
        while not recorded.is_set():
            now = time.time()
            for item in cluster.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, NAMESPACE,
                                                                     c.PLURAL)["items"]:
                st, name = item.get("status") or {}, item["metadata"]["name"]
                if st.get("phase"):
                    seen.setdefault((name, 0), now)
                    seen.setdefault((name, st.get("attempt") or 0), now)
            recorded.wait(0.2)

    def churn() -> None:
        i = 0
        while not stop.is_set():
            name = f"new-{i:03d}"
            changes.append((name, cluster.create(name), (name, 0)))
            if i % 4 == 0:  # a gang loses a pod: its restart is a reconcile the user waits for
                victim = names[(i // 4) % len(names)]
                attempt = cluster.status(victim).get("attempt", 1)
                pods = cluster.core.list_namespaced_pod(
                    NAMESPACE, label_selector=f"{c.LABEL_JOB}={victim},{c.LABEL_ATTEMPT}={attempt}").items
                pod0 = next((p for p in pods if p.metadata.annotations.get(
                    "batch.kubernetes.io/job-completion-index") == "0"), None)
                if pod0 is not None:
                    cluster.core.patch_namespaced_pod(pod0.metadata.name, NAMESPACE, {"metadata": {"annotations": {
                        FAIL_ATTEMPTS: str(attempt), FAIL_EXIT_CODE: "137"}}})
                    changes.append((f"{victim} restart", time.time(), (victim, attempt + 1)))
            i += 1
            stop.wait(every)

    started = time.time()
    thread = threading.Thread(target=churn, daemon=True)
    recorder = threading.Thread(target=record, daemon=True)
    thread.start()
    recorder.start()
    time.sleep(5)
    steps = []
    for old in list(replicas):  # maxSurge 1, maxUnavailable 0: the new pod first, then an old one goes
        new = next(u for u in REPLICA_USERS if u not in replicas)  # a new pod: its own user in the audit log
        replicas[new] = replica(cp, LEASES, new, cp.work).start()
        wait(f"{new} standing by", lambda n=new: (health(replicas[n]) or (0, {}))[1].get("role") == "standby")
        was = cluster.holder()
        replicas[old].stop()  # SIGTERM, as the kubelet does
        steps.append(f"{new} started, then SIGTERM to {old} ({'the leader' if was == old else 'a standby'})")
        time.sleep(5)
    time.sleep(10)
    stop.set()
    thread.join()
    ended = time.time()
    wait("every change reconciled", lambda: all(key in seen for _, _, key in changes), 180, 0.5)
    recorded.set()
    recorder.join()
    waits = [(seen[key] - when, what) for what, when, key in changes]
    # Two writers: each replica's writes (Leases aside) must form one unbroken run in time order.
    writes = sorted((audit.received(e), user) for user in REPLICA_USERS
                    for e in audit.events(cp.audit_log, start=started, end=ended, user=user)
                    if e["verb"] in audit.WRITE_VERBS and e["objectRef"].get("resource") != "leases")
    order = [user for _, user in writes]
    runs = [u for i, u in enumerate(order) if i == 0 or order[i - 1] != u]
    longest, what = max(waits)
    return {"jobs_running": jobs, "changes": len(changes), "steps": steps,
            "longest_unreconciled_s": longest, "longest_unreconciled_change": what,
            "unreconciled_p50_s": percentile([w for w, _ in waits], 50),
            "writers_in_order": runs, "two_writers_at_once": len(runs) != len(set(runs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between changes during the upgrade")
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--freezes", type=int, default=0, help="SIGSTOP/SIGCONT trials of the leader")
    parser.add_argument("--partitions", type=int, default=0, help="partition trials of the leader")
    parser.add_argument("--trial-jobs", type=int, default=10, help="jobs created as each trial begins")
    parser.add_argument("--hog-minutes", type=float, default=0, help="minutes with every core saturated")
    parser.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1), help="busy processes of the hog")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    # kwok nodes send no heartbeats: new nodes must not get the not-ready taint (as in scale.py).
    cp = ControlPlane(build_binaries(), apiserver_args=["--disable-admission-plugins=TaintNodesByCondition"]).start()
    replicas: dict = {}
    proxies: dict = {}
    finished = False  # a run that fails keeps the control plane's directory (its logs)
    try:
        cluster = Cluster(cp)
        client.ApiextensionsV1Api(cluster.api).create_custom_resource_definition(yaml.safe_load(CRD_FILE.read_text()))
        add_nodes(cluster.api, args.nodes)
        for ns in (NAMESPACE, LEASES):
            cluster.core.create_namespace({"metadata": {"name": ns}})
        time.sleep(2)
        # With partitions, each replica talks to the apiserver through a proxy of its own (cut one, not both).
        proxies = {user: FreezableProxy(cp.api_port) for user in REPLICA_USERS[:2]} if args.partitions else {}
        for user in REPLICA_USERS[:2]:
            server = f"https://127.0.0.1:{proxies[user].port}" if user in proxies else None
            replicas[user] = replica(cp, LEASES, user, cp.work, server=server).start()
            wait(f"{user} up", lambda u=user: health(replicas[u]), 120, 0.2)
        figures = {"kill": kills(cluster, replicas, args.kills) if args.kills else None}
        figures["freeze"] = writers.freezes(cp, cluster, replicas, args.freezes, args.trial_jobs) \
            if args.freezes else None
        figures["partition"] = writers.partitions(cp, cluster, replicas, proxies, args.partitions, args.trial_jobs) \
            if args.partitions else None
        figures["hog"] = writers.hog(cp, cluster, replicas, args.hog_minutes, args.hogs) if args.hog_minutes else None
        figures["rolling_upgrade"] = rolling_upgrade(cp, cluster, replicas, args.jobs, args.every) \
            if args.jobs else None
        finished = True
    finally:
        for op in replicas.values():
            op.stop()
        for proxy in proxies.values():
            proxy.close()
        cp.stop(remove=finished)
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
