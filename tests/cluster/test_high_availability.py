"""Two operator replicas with leader election (the chart's default), on the real control plane. One writes; the
standby reads nothing but its Lease, takes over when the leader is SIGKILLed while a gang fails, and within a
retry when the leader stops cleanly; a replica whose reconcile pass hangs on a dead connection fails its liveness
probe. Who wrote what comes from the apiserver's audit log (each replica is its own audited user)."""

import time
from datetime import datetime

import pytest

from tests.cluster.test_faults import FAIL_ATTEMPTS, FAIL_EXIT_CODE, submit
from tests.cluster.test_operator import attempt_pods, wait_for, wait_phase
from tests.support import audit
from tests.support.replicas import health, lease, replica
from tests.support.tcp_proxy import FreezableProxy

pytestmark = pytest.mark.cluster
A, B = "operator-replica-a", "operator-replica-b"


def lease_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def pair(control_plane, kubectl, namespace, tmp_path):
    """Replica a leads (started first), replica b stands by."""
    a = replica(control_plane, namespace, A, tmp_path).start()
    b = None
    try:
        wait_for(lambda: lease(kubectl, namespace).get("holderIdentity") == A, 60, "replica a leads", a)
        b = replica(control_plane, namespace, B, tmp_path).start()
        wait_for(lambda: (health(b) or (0, {}))[1].get("role") == "standby", 60, "replica b stands by", b)
        yield a, b
    finally:
        for op in (a, b):
            if op is not None:
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

    time.sleep(1.5)
    theirs = writes(control_plane, B, since, namespace)
    assert theirs and all(audit.received(e) >= killed for e in theirs)  # b wrote only once a was gone
    assert any(e["verb"] == "create" and e["objectRef"]["resource"] == "jobs" for e in theirs)  # attempt 2
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
