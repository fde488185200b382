"""The chart's two operator replicas as pods: `helm install`, the real Deployment, ReplicaSet and disruption
controllers, and a test kubelet that runs each pod's container as the operator process from this checkout
(tests/support/operator_pods.py: readiness from its /healthz, restarts, SIGTERM on deletion). A rolling update,
a drain against the PodDisruptionBudget and a crash of the leader, with jobs being reconciled throughout; who wrote
what comes from the audit log (each pod's token is bound to it, so every request names its pod)."""

import json
import signal
import subprocess
import time

import pytest
from kubernetes import client

from tests.builders import make_job
from tests.cluster.test_operator import wait_for
from tests.conftest import ROOT
from tests.support import audit
from tests.support.controlplane import AUDITED_RELEASE_NAMESPACE
from tests.support.operator_pods import OperatorKubelet

pytestmark = pytest.mark.cluster
RELEASE, SYSTEM_NS, JOBS_NS = "ftj-ha", AUDITED_RELEASE_NAMESPACE, "ha-jobs"
OPERATOR = f"{RELEASE}-operator"  # the Deployment, its ServiceAccount and the Lease
SA_USER = f"system:serviceaccount:{SYSTEM_NS}:{OPERATOR}"
POD_NAME = "authentication.kubernetes.io/pod-name"


def helm(control_plane, kubectl, *args: str) -> str:
    proc = subprocess.run([str(control_plane.bin_dir / "helm"), *args], env=kubectl.env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def pods(control_plane, kubectl, tmp_path_factory):
    """The chart installed with its two replicas on the test kubelet's nodes, managing JOBS_NS; one leads."""
    kubectl.run("create", "namespace", JOBS_NS)
    kubelet = OperatorKubelet(control_plane, tmp_path_factory.mktemp("operator-pods")).__enter__()
    sets = [a for v in (*kubelet.values(), f"watchNamespaces={{{JOBS_NS}}}", "restartBackoffSeconds=1")
            for a in ("--set", v)]
    try:
        helm(control_plane, kubectl, "install", RELEASE, str(ROOT / "charts" / "finetunejob"), "--namespace",
             SYSTEM_NS, "--create-namespace", *sets)
        wait_for(lambda: available(kubectl) == 2 and holder(kubectl) in names(operator_pods(kubectl)), 120,
                 "two replicas available, one leading", _Tail(kubelet, kubectl))
        yield kubelet
    finally:
        subprocess.run([str(control_plane.bin_dir / "helm"), "uninstall", RELEASE, "--namespace", SYSTEM_NS],
                       env=kubectl.env, capture_output=True, timeout=120)
        deadline = time.monotonic() + 60  # the kubelet stops the pods the garbage collector deletes
        while operator_pods(kubectl, terminating=True) and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"chart pods gone {60 - (deadline - time.monotonic()):.1f} s after the uninstall")
        kubelet.__exit__(None, None, None)
        kubectl.run("delete", "namespace", JOBS_NS, SYSTEM_NS, "--wait=false", check=False)


class _Tail:
    """What a failed wait prints: the kubelet's errors, the pods and their logs."""

    def __init__(self, kubelet, kubectl):
        self.kubelet, self.kubectl = kubelet, kubectl

    def log_tail(self) -> str:
        pods = operator_pods(self.kubectl, terminating=True)
        return "\n".join([f"kubelet errors: {self.kubelet.errors[-5:]}", *(
            f"--- {name} {p['status'].get('conditions')}\n{self.kubelet.log_tail(name)}"
            for p in pods for name in [p["metadata"]["name"]])])


def operator_pods(kubectl, terminating: bool = False) -> list[dict]:
    items = kubectl.json("get", "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/instance=" + RELEASE)["items"]
    return [p for p in items if terminating or not p["metadata"].get("deletionTimestamp")]


def names(pods: list[dict]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


def ready(pod: dict) -> bool:
    return any(cd["type"] == "Ready" and cd["status"] == "True" for cd in pod["status"].get("conditions") or [])


def available(kubectl) -> int:
    return kubectl.json("get", "deployment", OPERATOR, "-n", SYSTEM_NS).get("status", {}).get("availableReplicas", 0)


def holder(kubectl) -> str | None:
    lease = kubectl.json_or_none("get", "lease", OPERATOR, "-n", SYSTEM_NS)
    return (lease or {}).get("spec", {}).get("holderIdentity")


def submit(kubectl, name: str) -> None:
    doc = make_job({"metadata.name": name, "metadata.namespace": JOBS_NS, "spec.distributed.numNodes": 2,
                    "spec.distributed.gpusPerNode": 0, "spec.training.precision": "fp32"})
    kubectl.run("apply", "-f", "-", input=json.dumps(doc))


def submit_all(kubectl, prefix: str, count: int) -> list[str]:
    """`count` jobs in one request."""
    docs = [make_job({"metadata.name": f"{prefix}-{i}", "metadata.namespace": JOBS_NS, "spec.distributed.numNodes": 2,
                      "spec.distributed.gpusPerNode": 0, "spec.training.precision": "fp32"}) for i in range(count)]
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return [d["metadata"]["name"] for d in docs]


def reconciled(kubectl, job_names) -> bool:
    return all((kubectl.json("get", "ftj", n, "-n", JOBS_NS).get("status") or {}).get("phase") == "Running"
               for n in job_names)


def writers_in_order(control_plane, since: float) -> list[str]:
    """The pods whose writes (the Lease aside) reached the apiserver since `since`, one entry per unbroken run."""
    writes = sorted((audit.received(e), e["user"]["extra"][POD_NAME][0])
                    for e in audit.events(control_plane.audit_log, start=since, user=SA_USER)
                    if e["verb"] in audit.WRITE_VERBS and e["objectRef"].get("resource") != "leases")
    order = [pod for _, pod in writes]
    return [pod for i, pod in enumerate(order) if i == 0 or order[i - 1] != pod]


def test_a_rolling_update_of_the_two_replicas_keeps_both_available_and_never_two_writers(pods, kubectl,
                                                                                          control_plane):
    """`helm upgrade` with a new pod template: maxSurge 1 / maxUnavailable 0, so the new pod must be Ready (its
    /healthz, as a standby) before an old one is stopped; the stopped leader hands the Lease over. Jobs submitted
    every second meanwhile are all reconciled; the audit log shows each pod's writes as one unbroken run."""
    before = operator_pods(kubectl)
    assert len(before) == 2 and all(ready(p) for p in before)
    assert len({p["spec"]["nodeName"] for p in before}) == 2  # spread over the nodes (anti-affinity)
    assert holder(kubectl) in names(before)
    since = time.time()
    helm(pods.cp, kubectl, "upgrade", RELEASE, str(ROOT / "charts" / "finetunejob"), "--namespace", SYSTEM_NS,
         "--reuse-values", "--set", "podAnnotations.rollout=two")
    submitted, fewest, every = [], 2, time.monotonic()

    def rolled_out() -> bool:
        nonlocal fewest, every
        if time.monotonic() >= every:  # a new job every 3 s
            submitted.append(f"during-{len(submitted)}")
            submit(kubectl, submitted[-1])
            every += 3
        fewest = min(fewest, available(kubectl))
        now = operator_pods(kubectl, terminating=True)
        return len(now) == 2 and not names(now) & names(before) and all(ready(p) for p in now)

    wait_for(rolled_out, 180, "the rollout", _Tail(pods, kubectl))
    after = operator_pods(kubectl)
    wait_for(lambda: holder(kubectl) in names(after), 30, "a new pod leading", _Tail(pods, kubectl))
    wait_for(lambda: reconciled(kubectl, submitted), 90, f"{len(submitted)} jobs Running", _Tail(pods, kubectl))
    assert fewest == 2, "maxUnavailable 0: two replicas available throughout"
    time.sleep(1.5)  # the audit log is written asynchronously
    runs = writers_in_order(control_plane, since)
    assert len(runs) == len(set(runs)), f"two writers interleaved: {runs}"
    assert set(runs) <= names(before) | names(after) and runs[-1] in names(after), runs


def test_a_drain_evicts_one_replica_at_a_time(pods, kubectl):
    """The PodDisruptionBudget (minAvailable 1): evicting the leader is allowed, and it hands the Lease over; the
    other replica cannot be evicted until the ReplicaSet's replacement is Ready."""
    core = client.CoreV1Api(pods.api)
    wait_for(lambda: (kubectl.json("get", "pdb", OPERATOR, "-n", SYSTEM_NS).get("status") or {}).get(
        "disruptionsAllowed") == 1, 60, "the budget allowing one disruption", _Tail(pods, kubectl))
    leader = holder(kubectl)
    (standby,) = names(operator_pods(kubectl)) - {leader}

    def evict(name: str) -> None:
        core.create_namespaced_pod_eviction(name, SYSTEM_NS, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=SYSTEM_NS)))

    evicted = time.monotonic()
    evict(leader)
    with pytest.raises(client.ApiException) as refused:
        evict(standby)
    assert refused.value.status == 429 and "disruption budget" in refused.value.body, refused.value.body
    # The evicted leader releases the Lease: the standby, or the ReplicaSet's replacement if it is up first, takes
    # it (both are legitimate; what matters is that nobody waits the Lease out).
    wait_for(lambda: holder(kubectl) not in (None, "", leader), 15, "another replica leading", _Tail(pods, kubectl))
    handed = time.monotonic() - evicted
    assert handed < 10, f"handed over after {handed:.1f} s: waited out, not released"
    wait_for(lambda: len([p for p in operator_pods(kubectl) if ready(p)]) == 2, 90, "a Ready replacement",
             _Tail(pods, kubectl))
    wait_for(lambda: (kubectl.json("get", "pdb", OPERATOR, "-n", SYSTEM_NS).get("status") or {}).get(
        "disruptionsAllowed") == 1, 60, "one disruption allowed again", _Tail(pods, kubectl))


def test_a_crashed_leader_leads_again_once_restarted_and_a_frozen_one_is_taken_over_and_writes_nothing(
        pods, kubectl, control_plane):
    """Two failures of the leader's pod. SIGKILL of its container: the kubelet restarts it at once, and a job
    created at the crash is reconciled, by the new process (the same pod, so the same identity in the Lease: it
    leads again at once) or, where its start outlasted the Lease on a loaded machine, by the other pod. SIGSTOP
    of the leader's container (a hung node) as it creates a batch of jobs: the other pod takes the Lease once
    it has seen it unrenewed for the lease duration and reconciles them, and those created meanwhile; resumed, with
    passes half-done and its watch full of events, the frozen process writes nothing (the audit log, by the pod its
    token is bound to), steps down, and is restarted (as the standby: the other pod keeps the Lease)."""
    leader = holder(kubectl)
    (other,) = names(operator_pods(kubectl)) - {leader}
    pods.kill(leader)
    submit(kubectl, "at-the-crash")
    wait_for(lambda: restart_count(kubectl, leader) == 1, 30, "the killed container restarted", _Tail(pods, kubectl))
    wait_for(lambda: reconciled(kubectl, ["at-the-crash"]), 60, "the job reconciled", _Tail(pods, kubectl))
    last = pod_of(kubectl, leader)["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 137
    crashed, leader = leader, holder(kubectl)
    assert leader in (crashed, other), leader
    if leader != crashed:
        print(f"\nthe restarted {crashed} came back after its Lease expired: {other} leads")
        other = crashed
    frozen_restarts = restart_count(kubectl, leader)

    in_flight = submit_all(kubectl, "in-flight", 6)  # it is creating their children when it freezes
    time.sleep(0.3)
    frozen = time.time()
    pods.signal(leader, signal.SIGSTOP)
    try:
        in_flight += submit_all(kubectl, "while-frozen", 3)  # its watch holds them for when it resumes
        wait_for(lambda: holder(kubectl) == other, 40, "the other replica leading", _Tail(pods, kubectl))
        took = time.time() - frozen
        wait_for(lambda: reconciled(kubectl, in_flight), 90, "the jobs reconciled", _Tail(pods, kubectl))
    finally:
        pods.signal(leader, signal.SIGCONT)
    wait_for(lambda: restart_count(kubectl, leader) == frozen_restarts + 1, 60,
             "the frozen container stepped down, restarted", _Tail(pods, kubectl))
    time.sleep(1.5)  # the audit log is written asynchronously
    tried = [e for e in audit.events(control_plane.audit_log, start=frozen + took, user=SA_USER)
             if e["user"]["extra"][POD_NAME][0] == leader and e["verb"] in audit.WRITE_VERBS
             and e["objectRef"].get("resource") != "leases"]
    # A write it checked just before it froze goes out when it resumes: the chart's leader policy refuses it.
    late = [e for e in tried if audit.accepted(e)]
    assert not late, [(e["verb"], e["requestURI"]) for e in late]
    assert all((e.get("responseStatus") or {}).get("code") == 403 for e in tried), tried
    assert holder(kubectl) == other
    print(f"\nleader pod frozen: the other pod led after {took:.1f} s; resumed, the old one wrote nothing")


def test_only_the_leading_replicas_pod_may_write_as_the_operator(pods, kubectl):
    """The API server's side of the fence (the chart's leader policy): the operator's identity, from a token bound to
    the standby's pod, is refused any write; from the leader's, it writes. (The Lease itself stays writable by both,
    which is how a standby comes to lead: the failovers above take it over.)"""
    def as_pod(name: str, *args: str):
        pod = pod_of(kubectl, name)
        token = kubectl.run("create", "token", OPERATOR, "-n", SYSTEM_NS, "--bound-object-kind=Pod",
                            f"--bound-object-name={name}", f"--bound-object-uid={pod['metadata']['uid']}",
                            "--duration=10m").stdout.strip()
        return kubectl.run(*args, f"--token={token}", check=False)

    def standby_refused():
        # Read each time: an earlier case may leave the Lease changing hands (a drain, a rolling update).
        leader = holder(kubectl)
        standby = (names(operator_pods(kubectl)) - {leader} or {None}).pop()
        if standby is None:
            return None
        answer = as_pod(standby, "create", "configmap", "probe-standby", "-n", JOBS_NS)
        if answer.returncode == 0:  # the policy not in force yet (just installed), or the Lease just moved to it
            kubectl.run("delete", "configmap", "probe-standby", "-n", JOBS_NS)
            return None
        return leader, answer

    leader, refused = wait_for(standby_refused, 60, "the leader policy in force", _Tail(pods, kubectl))
    assert "does not hold the Lease" in refused.stderr and f"its holder: {leader}" in refused.stderr, refused.stderr
    leader = holder(kubectl)
    allowed = as_pod(leader, "create", "configmap", "probe-leader", "-n", JOBS_NS)
    assert allowed.returncode == 0, allowed.stderr
    kubectl.run("delete", "configmap", "probe-leader", "-n", JOBS_NS)


def pod_of(kubectl, name: str) -> dict:
    return next(p for p in operator_pods(kubectl) if p["metadata"]["name"] == name)


def restart_count(kubectl, name: str) -> int:
    statuses = pod_of(kubectl, name)["status"].get("containerStatuses") or [{}]
    return statuses[0].get("restartCount", 0)
