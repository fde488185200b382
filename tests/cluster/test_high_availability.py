"""Two operator replicas with leader election (the chart's default), on the real control plane. One writes; the
standby reads nothing but its Lease, takes over when the leader is SIGKILLed while a gang fails, and within a
retry when the leader stops cleanly; a leader cut off (a partition) while jobs are in flight steps down before the
takeover, and nothing it sent into the partition lands; a renewal that conflicts with itself is not a lost Lease; a
replica whose reconcile pass hangs on a dead connection fails its liveness probe. Who wrote what comes from the
apiserver's audit log (each replica is its own audited user). The chart's replicas as pods, a frozen leader among
them: test_operator_pods.py."""

import json
import time
from datetime import datetime

import pytest

from tests.builders import make_job
from tests.cluster.test_faults import FAIL_ATTEMPTS, FAIL_EXIT_CODE, submit
from tests.cluster.test_operator import attempt_pods, wait_for, wait_phase
from tests.support import audit
from tests.support.replicas import health, lease, proxied_kubeconfig, replica, takeover
from tests.support.tcp_proxy import FreezableProxy

pytestmark = pytest.mark.cluster
A, B = "operator-replica-a", "operator-replica-b"


def lease_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def start_pair(control_plane, kubectl, namespace, tmp_path, server_a=None):
    """Replica a leads (started first; through `server_a` when given, e.g. a proxy), replica b stands by."""
    a = replica(control_plane, namespace, A, tmp_path, server=server_a).start()
    b = None
    try:
        wait_for(lambda: lease(kubectl, namespace).get("holderIdentity") == A, 60, "replica a leads", a)
        b = replica(control_plane, namespace, B, tmp_path).start()
        wait_for(lambda: (health(b) or (0, {}))[1].get("role") == "standby", 60, "replica b stands by", b)
    except BaseException:
        for op in (a, b):
            if op is not None:
                op.stop()
        raise
    return a, b


@pytest.fixture
def pair(control_plane, kubectl, namespace, tmp_path):
    a, b = start_pair(control_plane, kubectl, namespace, tmp_path)
    yield a, b
    for op in (a, b):
        op.stop()


def writes(control_plane, user, start, namespace=None):
    return [e for e in audit.events(control_plane.audit_log, start=start, user=user, namespace=namespace)
            if e["verb"] in audit.WRITE_VERBS and e["objectRef"].get("resource") != "leases"]


def test_the_standby_restarts_a_gang_whose_leader_was_killed_as_it_failed(kubectl, control_plane, namespace, pair):
    a, b = pair
    since = time.time()
    submit(kubectl, namespace, "ha", backoff_limit=3)
    wait_phase(kubectl, namespace, "ha", "Running", a, timeout=90, attempt=1, nodes="2/2")
    # While it stands by, the standby asks for nothing but its Lease: no watch, no list, no write.
    time.sleep(1.5)  # the audit log is written asynchronously
    asked = audit.requests(control_plane.audit_log, start=since, user=B)
    assert set(asked) <= {("get", "leases")}, asked

    (pod0,) = [p for p in attempt_pods(kubectl, namespace, "ha", 1)
               if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0"]
    killed = time.time()
    a.kill()
    kubectl.run("annotate", "pod", pod0["metadata"]["name"], "-n", namespace, f"{FAIL_ATTEMPTS}=1",
                f"{FAIL_EXIT_CODE}=137")
    wait_for(lambda: lease(kubectl, namespace).get("holderIdentity") == B, 30, "replica b leads", b)
    st = wait_phase(kubectl, namespace, "ha", "Running", b, timeout=120, attempt=2, nodes="2/2")
    assert st["restarts"] == 1
    spec = lease(kubectl, namespace)
    print(f"\nleader SIGKILLed: replica b led {lease_time(spec['acquireTime']) - killed:.1f} s later "
          f"(lease {spec['leaseDurationSeconds']} s), restarted the gang")

    def created_attempt_2() -> list[dict] | None:  # in the audit log, which is written asynchronously
        theirs = writes(control_plane, B, since, namespace)
        return theirs if any(e["verb"] == "create" and e["objectRef"]["resource"] == "jobs" for e in theirs) else None

    theirs = wait_for(created_attempt_2, 60, "replica b's creation of attempt 2 in the audit log")
    assert all(audit.received(e) >= killed for e in theirs)  # b wrote only once a was gone
    assert not writes(control_plane, A, killed, namespace)


def test_a_clean_stop_hands_the_lease_over_without_waiting_it_out(kubectl, namespace, pair):
    a, b = pair
    before = lease(kubectl, namespace)
    stopped = time.time()
    a.stop()  # SIGTERM: kopf stops, then the Lease is released
    wait_for(lambda: lease(kubectl, namespace).get("holderIdentity") == B, 30, "replica b leads", b)
    after = lease(kubectl, namespace)
    # Taken before a's last renewal could have expired: handed over, not waited out.
    assert lease_time(after["acquireTime"]) < lease_time(before["renewTime"]) + before["leaseDurationSeconds"] + 60
    assert lease_time(after["acquireTime"]) - stopped < before["leaseDurationSeconds"], (before, after, stopped)
    assert after["leaseTransitions"] == before.get("leaseTransitions", 0) + 1
    submit(kubectl, namespace, "after-handover")
    wait_phase(kubectl, namespace, "after-handover", "Running", b, timeout=90, attempt=1, nodes="2/2")
    code, report = health(b)  # once: the report's loop tick age changes between two calls
    assert code == 200 and report["role"] == "leader"


def jobs_in_flight(kubectl, namespace, prefix, count):
    """`count` two-node jobs in one request: the leader is busy creating their children when it is cut off."""
    docs = [make_job({"metadata.name": f"{prefix}-{i}", "metadata.namespace": namespace,
                      "spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 0,
                      "spec.training.precision": "fp32"}) for i in range(count)]
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return [d["metadata"]["name"] for d in docs]


def all_running(kubectl, namespace, names, op):
    wait_for(lambda: all((kubectl.json("get", "ftj", n, "-n", namespace).get("status") or {}).get("phase")
                         == "Running" for n in names), 180, f"{len(names)} jobs Running", op)


def test_a_partitioned_leader_steps_down_and_nothing_it_sent_lands_after_the_takeover(kubectl, control_plane,
                                                                                       namespace, tmp_path):
    """Every connection of the leader goes silent at once (a partition: no reset, no answer) while it creates a
    batch of jobs. It cannot renew, steps down before its Lease could pass on, and resets its connections; the
    standby takes over; the partition heals while the standby leads. Nothing the old leader sent into the partition
    reaches the apiserver then (the issue saw such requests land 5 s after that leader had died)."""
    proxy = FreezableProxy(control_plane.api_port)
    a, b = start_pair(control_plane, kubectl, namespace, tmp_path, server_a=f"https://127.0.0.1:{proxy.port}")
    try:
        names = jobs_in_flight(kubectl, namespace, "cut", 6)
        time.sleep(0.3)
        cut = time.time()
        proxy.frozen.set()
        exited = wait_for(lambda: a.proc.poll() is not None and time.time(), 30, "the cut-off leader steps down", a)
        wait_for(lambda: lease(kubectl, namespace).get("holderIdentity") == B, 40, "replica b leads", b)
        took = takeover(control_plane, B, cut)
        assert exited < took, (exited - cut, took - cut)  # stepped down before anyone else led
        time.sleep(2)
        proxy.frozen.clear()  # heals while b leads: whatever a's connections still held would land now
        all_running(kubectl, namespace, names, b)
        time.sleep(1.5)
        assert "lost the lead" in a.log_tail(), a.log_tail()
        late = writes(control_plane, A, took)
        assert not late, [(e["verb"], e["requestURI"]) for e in late]
        print(f"\npartitioned leader: stepped down {exited - cut:.1f} s after the cut, the standby led "
              f"{took - cut:.1f} s after it; {proxy.dropped} connection(s) it reset were never relayed")
    finally:
        proxy.frozen.clear()
        for op in (a, b):
            op.stop()
        proxy.close()


def test_a_reconcile_pass_hung_on_a_dead_connection_fails_the_liveness_probe(kubectl, control_plane, namespace,
                                                                             tmp_path):
    """A ConfigMap in the way keeps the job retrying (NameConflict, a pass every 15 s); the proxy then drops every
    byte: the next pass hangs on its request, kopf's event loop still runs, and /healthz must say so. (No leader
    election here: a leader cut off from the apiserver steps down on its own once it cannot renew.)"""
    proxy = FreezableProxy(control_plane.api_port)
    op = replica(control_plane, namespace, A, tmp_path, server=f"https://127.0.0.1:{proxy.port}",
                 env={"FINETUNE_STUCK_RECONCILE_SECONDS": "5"}, leader_elect=False).start()
    try:
        wait_for(lambda: (health(op) or (0, {}))[1].get("role") == "leader", 60, "leads", op)
        kubectl.run("create", "configmap", "blocked-config", "-n", namespace)
        submit(kubectl, namespace, "blocked")
        wait_phase(kubectl, namespace, "blocked", "Pending", op, timeout=60, reason="NameConflict")
        proxy.frozen.set()
        report = wait_for(lambda: (health(op) or (200, {}))[0] == 503 and health(op)[1], 60,
                          "the liveness probe failing", op)
        assert any("a reconcile pass has run for" in p for p in report["problems"]), report
        assert op.proc.poll() is None  # alive as a process: only the probe can tell
        proxy.frozen.clear()
        wait_for(lambda: (health(op) or (0, {}))[0] == 200, 60, "healthy again once the pass ends", op)
    finally:
        proxy.frozen.clear()
        op.stop()
        proxy.close()


def test_a_watch_on_a_connection_lost_without_a_reset_is_given_up_and_watched_again(kubectl, control_plane,
                                                                                    namespace, tmp_path):
    """Every connection the operator holds goes silent for good (a NAT that forgot the flow: no reset, no error),
    new ones work. A job submitted then is not seen while the dead watch lasts; once the client's own timeout ends
    the stream (FINETUNE_WATCH_SECONDS plus at least 10 s), kopf lists and watches again on a new connection and
    reconciles it. Without that timeout the operator would wait on the dead stream for ever, healthy to every
    probe (its event loop runs, no pass is stuck)."""
    from finetune_operator.controller.settings import watch_client_timeout

    server_timeout = 5
    give_up = watch_client_timeout(server_timeout)
    proxy = FreezableProxy(control_plane.api_port)
    op = replica(control_plane, namespace, A, tmp_path, server=f"https://127.0.0.1:{proxy.port}",
                 env={"FINETUNE_WATCH_SECONDS": str(server_timeout)}, leader_elect=False).start()
    try:
        submit(kubectl, namespace, "before")
        wait_phase(kubectl, namespace, "before", "Running", op, timeout=90)
        # Right after the server ended the watch streams and kopf opened new ones: all of them die young.
        time.sleep(server_timeout + 1)
        assert proxy.partition() > 0
        cut = time.monotonic()
        submit(kubectl, namespace, "after")
        while time.monotonic() - cut < give_up - 3:  # the dead stream hears nothing of it
            assert not (kubectl.json("get", "ftj", "after", "-n", namespace).get("status") or {}).get("phase"), \
                "reconciled while the watch was dead: something else than the watch found it"
            time.sleep(0.5)
        wait_phase(kubectl, namespace, "after", "Running", op, timeout=give_up + 60)
        assert health(op)[0] == 200
    finally:
        op.stop()
        proxy.close()


def coordination(kubeconfig):
    """A Lease client as the operator makes one (no client retries, resets on close)."""
    from kubernetes import client, config

    from finetune_operator.controller.fencing import fenced_configuration

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.CoordinationV1Api(client.ApiClient(fenced_configuration(configuration, retry_reads=0)))


def test_a_renewal_that_conflicts_with_itself_is_read_again_not_taken_for_a_lost_lease(control_plane, kubectl,
                                                                                     namespace):
    """The issue's step-down under load: a renewal whose answer was lost went out again and met 409 against its
    own first copy, and the leader exited saying another replica held the Lease. A 409 is now read again: our own
    record there is a renewal that landed; only another holder's name ends the lead."""
    from finetune_operator.controller.fencing import Fence
    from finetune_operator.controller.leadership import LeaseElector

    api = coordination(control_plane.kubeconfig)
    elector = LeaseElector(api, namespace, "self-conflict", "me", fence=Fence())
    assert elector.try_acquire_or_renew()
    sent_once = api.replace_namespaced_lease

    def sent_twice(*args, **kwargs):  # the first copy lands, its answer is lost, the client sends it again
        sent_once(*args, **kwargs)
        return sent_once(*args, **kwargs)

    api.replace_namespaced_lease = sent_twice
    before = elector.last_renewed
    assert elector.try_acquire_or_renew() is True
    assert elector.self_conflicts == 1 and elector.last_renewed > before
    assert elector.fence.renewed_at == elector.last_renewed
    api.replace_namespaced_lease = sent_once
    assert elector.try_acquire_or_renew() is True  # and renews on from what it read
    # Another holder's record, though, ends the lead.
    kubectl.run("patch", "lease", "self-conflict", "-n", namespace, "--type=merge", "-p",
                '{"spec": {"holderIdentity": "someone-else"}}')
    assert elector.try_acquire_or_renew() is False


def test_a_leader_cut_off_stops_writing_at_its_renew_deadline_and_steps_down_before_its_lease_can_pass(
        control_plane, namespace, tmp_path):
    """The Lease through a proxy that stops relaying (renewals hang, no error): each renewal attempt is bounded by
    the time left, so the step-down comes at the renew deadline on the leader's own clock, before the lease
    duration a standby waits out; from the deadline on, the operator's own client (not cut off) refuses every write
    before a byte leaves."""
    import threading

    from finetune_operator.controller.fencing import Fence, NotLeading
    from finetune_operator.controller.kube import Kube
    from finetune_operator.controller.leadership import LeaseElector, Timing

    proxy = FreezableProxy(control_plane.api_port)
    fence, timing, stop = Fence(), Timing(), threading.Event()
    try:
        proxied = proxied_kubeconfig(control_plane.kubeconfig, proxy, tmp_path)
        elector = LeaseElector(coordination(proxied), namespace, "cut", "me", timing=timing, fence=fence)
        assert elector.acquire(threading.Event())
        kube = Kube.from_kubeconfig(str(control_plane.audited_kubeconfig), fence=fence)

        def config_map(name):
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}

        kube.apply(config_map("while-leading"), exists=False)
        lost: list[tuple[float, str]] = []
        elector.hold(stop, lambda why: lost.append((time.monotonic(), why)))
        time.sleep(1.5)
        proxy.frozen.set()
        stepped, why = wait_for(lambda: lost and lost[0], 20, "the step-down")
        renewed = elector.last_renewed
        assert "not renewed for 6 s" in why
        # At the deadline (give or take the renewal thread's wake-up), well before the lease could pass on.
        assert timing.renew_deadline <= stepped - renewed < timing.renew_deadline + 1.0, stepped - renewed
        assert stepped - renewed < timing.lease_seconds - timing.write_timeout
        since = time.time()
        with pytest.raises(NotLeading, match="may no longer write"):
            kube.apply(config_map("after-the-deadline"), exists=False)
        time.sleep(1.5)
        assert not [e for e in audit.events(control_plane.audit_log, start=since, namespace=namespace)
                    if e["objectRef"].get("name") == "after-the-deadline"]
    finally:
        stop.set()
        proxy.frozen.clear()
        proxy.close()
