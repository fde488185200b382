"""One writer at a time, measured (issue 41); run from benchmarks/failover.py (--freezes, --partitions, --hog-minutes).

  freezes: the leader is frozen (SIGSTOP) right after a batch of jobs is created, more jobs arrive while it is
    frozen, the standby takes over, and the old leader is resumed (SIGCONT) a second later with passes half-done and
    a watch full of events. Counted from the audit log: the old leader's writes received after the takeover.
  partitions: every connection of the leader goes silent at once (its proxy stops relaying, no reset) right after a
    batch of jobs is created; it must step down before its Lease can pass on; the partition heals two seconds after
    the standby took over, when whatever the old leader's connections still held would land. Counted the same way.
  hog: every core saturated by busy processes (two per core) while jobs come and go: how often the leader stepped
    down with nobody else holding the Lease, and the longest time between two renewals of one leader.
Each replica is a process under its own audited user; an exited replica is started again, as a kubelet would.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time
from datetime import datetime

from kubernetes import client

from benchmarks.scale import percentile
from finetune_operator.api import constants as c
from finetune_operator.controller.leadership import Timing
from tests.support import audit
from tests.support.polling import wait_until
from tests.support.replicas import health

LOST = re.compile(r"lost the lead \((.*)\); exiting")


def _writes(cp, user: str, start: float, end: float = float("inf")) -> list[dict]:
    return [e for e in audit.events(cp.audit_log, start=start, end=end, user=user)
            if e["verb"] in audit.WRITE_VERBS and e["objectRef"].get("resource") != "leases"]


def _lease_writes(cp, user: str, start: float) -> list[float]:
    """When `user`'s successful Lease writes were received (the leader's renewals, a standby's acquisition)."""
    return [audit.received(e) for e in audit.events(cp.audit_log, start=start, user=user)
            if e["verb"] in ("update", "create") and e["objectRef"].get("resource") == "leases"
            and 200 <= (e.get("responseStatus") or {}).get("code", 0) < 300]


def _takeover(cp, user: str, since: float, timeout: float = 20.0) -> float:
    """When `user` first wrote the Lease after `since` (the audit log's time)."""
    return wait_until(f"a Lease write by {user} in the audit log since {since}",
                      lambda: _lease_writes(cp, user, since), timeout)[0]


def wait(what: str, predicate, timeout: float = 120.0, every: float = 0.1):
    return wait_until(what, predicate, timeout, every)


def _batch(cluster, prefix: str, count: int) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(count)]
    threads = [threading.Thread(target=cluster.create, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return names


def _reconciled(cluster, names: list[str]) -> bool:
    return all(cluster.status(n).get("phase") for n in names)


def _fenced(op, since_line: int) -> int:
    """Writes the replica's fence stopped (each failed pass names the NotLeading that ended it)."""
    lines = op.log_path.read_text(errors="replace").splitlines()[since_line:]
    return sum(1 for line in lines if "NotLeading" in line)


def _failed_passes(op, since_line: int) -> int:
    """Reconcile passes that failed on an API error (a write that timed out, a conflict that kept coming)."""
    lines = op.log_path.read_text(errors="replace").splitlines()[since_line:]
    return sum(1 for line in lines if "failed (" in line and "reconcile of" in line)


def _lines(op) -> int:
    return len(op.log_path.read_text(errors="replace").splitlines())


def _standby_ready(replicas: dict, user: str) -> bool:
    return (health(replicas[user]) or (0, {}))[1].get("role") == "standby"


def freezes(cp, cluster, replicas: dict, count: int, jobs: int) -> dict:
    late_total, fenced_total, takeovers, rows = 0, 0, [], []
    for i in range(count):
        leader = wait("a leader", cluster.holder)
        standby = next(u for u in replicas if u != leader)
        wait("the standby standing by", lambda s=standby: _standby_ready(replicas, s))
        op, mark = replicas[leader], _lines(replicas[leader])
        first = _batch(cluster, f"freeze{i:02d}-a", jobs)
        time.sleep(0.3)  # the leader is busy with them
        frozen = time.time()
        os.kill(op.proc.pid, signal.SIGSTOP)
        second = _batch(cluster, f"freeze{i:02d}-b", jobs // 2)
        took = _takeover(cp, standby, frozen, timeout=60)
        time.sleep(1.0)
        os.kill(op.proc.pid, signal.SIGCONT)
        code = op.proc.wait(timeout=60)
        wait("every job of the trial reconciled", lambda n=first + second: _reconciled(cluster, n), 180, 0.5)
        time.sleep(1.5)  # the audit log is written asynchronously
        late = len(_writes(cp, leader, took))
        fenced = _fenced(op, mark)
        late_total, fenced_total = late_total + late, fenced_total + fenced
        takeovers.append(took - frozen)
        rows.append({"takeover_s": round(took - frozen, 2), "late_writes": late, "fenced": fenced, "exit": code})
        print(f"freeze {i + 1:2d}: standby led {took - frozen:5.2f}s after the SIGSTOP; resumed leader: {late} "
              f"write(s) after the takeover, {fenced} stopped by its fence, exit {code}", flush=True)
        op.start()  # restarted by its kubelet: the next standby
    return {"trials": count, "jobs_per_trial": jobs + jobs // 2, "writes_after_takeover": late_total,
            "writes_stopped_by_the_fence": fenced_total, "takeover_p50_s": percentile(takeovers, 50),
            "takeover_max_s": max(takeovers), "per_trial": rows}


def partitions(cp, cluster, replicas: dict, proxies: dict, count: int, jobs: int) -> dict:
    late_total, dropped_total, rows = 0, 0, []
    for i in range(count):
        leader = wait("a leader", cluster.holder)
        standby = next(u for u in replicas if u != leader)
        wait("the standby standing by", lambda s=standby: _standby_ready(replicas, s))
        op, proxy = replicas[leader], proxies[leader]
        dropped_before = proxy.dropped
        names = _batch(cluster, f"cut{i:02d}", jobs)
        time.sleep(0.3)
        cut = time.time()
        proxy.frozen.set()
        try:
            op.proc.wait(timeout=60)
            stepped = time.time()
            took = _takeover(cp, standby, cut, timeout=60)
            time.sleep(2.0)
        finally:
            proxy.frozen.clear()  # heals while the standby leads
        wait("every job of the trial reconciled", lambda n=names: _reconciled(cluster, n), 180, 0.5)
        time.sleep(2.0)
        late = len(_writes(cp, leader, took))
        dropped = proxy.dropped - dropped_before
        late_total, dropped_total = late_total + late, dropped_total + dropped
        rows.append({"stepped_down_s": round(stepped - cut, 2), "takeover_s": round(took - cut, 2),
                     "late_writes": late, "connections_dropped": dropped})
        print(f"partition {i + 1:2d}: leader stepped down {stepped - cut:5.2f}s after the cut, standby led "
              f"{took - cut:5.2f}s after it; {late} write(s) of the old leader after the takeover; {dropped} "
              "reset connection(s) never relayed", flush=True)
        op.start()
    return {"trials": count, "jobs_per_trial": jobs, "writes_after_takeover": late_total,
            "stepped_down_before_takeover": sum(1 for r in rows if r["stepped_down_s"] < r["takeover_s"]),
            "stepped_down_max_s": max(r["stepped_down_s"] for r in rows),
            "takeover_min_s": min(r["takeover_s"] for r in rows), "connections_dropped": dropped_total,
            "per_trial": rows}


def _busy() -> None:
    while True:
        pass


def hog(cp, cluster, replicas: dict, minutes: float, hogs: int) -> dict:
    """Every core saturated; a job created every 2 s, deleted a minute later."""
    leases = cluster.leases
    start = time.time()
    transitions_before = leases.read_namespaced_lease("finetunejob-operator", "operator-system").spec.lease_transitions
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(hogs)]
    for p in busy:
        p.start()
    step_downs, loads, created, answered, deleted = [], [], {}, {}, set()
    marks = {u: _lines(op) for u, op in replicas.items()}
    failed_passes = 0

    def look() -> None:  # when each job first showed a phase: the operator kept working
        for item in cluster.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, "failover", c.PLURAL)["items"]:
            name = item["metadata"]["name"]
            if name in created and name not in answered and (item.get("status") or {}).get("phase"):
                answered[name] = time.time() - created[name]

    try:
        i, end = 0, start + minutes * 60
        while time.time() < end:
            loads.append(os.getloadavg()[0])
            look()
            name = f"hog-{i:04d}"
            try:
                created[name] = cluster.create(name)
            except client.ApiException as exc:
                print(f"create {name}: {exc.status}", flush=True)
            for old, at in created.items():
                if time.time() - at > 60 and old in answered and old not in deleted:
                    cluster.delete(old)
                    deleted.add(old)
            for user, op in replicas.items():
                if op.proc.poll() is not None:  # stepped down (or died): read why, and who holds the Lease now
                    holder = cluster.holder()
                    lines = op.log_path.read_text(errors="replace").splitlines()[marks[user]:]
                    why = next((m.group(1) for line in reversed(lines) if (m := LOST.search(line))),
                               f"exit {op.proc.returncode}")
                    step_downs.append({"replica": user, "at_s": round(time.time() - start), "why": why,
                                       "holder_after": holder})
                    print(f"step-down of {user} after {time.time() - start:.0f}s: {why}; holder now {holder}",
                          flush=True)
                    failed_passes += _failed_passes(op, marks[user])
                    op.start()
                    marks[user] = _lines(op)
            i += 1
            time.sleep(2.0)
    finally:
        for p in busy:
            p.kill()
    ended = time.time()
    wait("every job created under load reconciled", lambda: (look(), len(answered) == len(created))[1], 180, 1.0)
    failed_passes += sum(_failed_passes(op, marks[u]) for u, op in replicas.items())
    transitions = leases.read_namespaced_lease("finetunejob-operator", "operator-system").spec.lease_transitions
    time.sleep(1.5)
    # Between two Lease writes of the same replica with no other replica's in between: one leader's renewals.
    writes = sorted((t, user) for user in replicas for t in _lease_writes(cp, user, start) if t <= ended)
    gaps = [b - a for (a, u), (b, v) in zip(writes, writes[1:], strict=False) if u == v]
    timing = Timing()
    nobody_else = [s for s in step_downs if s["holder_after"] in (None, s["replica"])]
    return {"minutes": minutes, "hog_processes": hogs, "cores": os.cpu_count(),
            "load_average_p50": round(percentile(loads, 50), 1), "load_average_max": round(max(loads), 1),
            "jobs_created": len(created), "first_status_p50_s": round(percentile(list(answered.values()), 50), 2),
            "first_status_p99_s": round(percentile(list(answered.values()), 99), 2),
            "first_status_max_s": round(max(answered.values()), 2), "passes_failed": failed_passes,
            "step_downs": len(step_downs), "step_downs_with_no_other_holder": len(nobody_else),
            "lease_transitions": (transitions or 0) - (transitions_before or 0),
            "renewal_gap_p99_s": round(percentile(gaps, 99), 2) if gaps else None,
            "renewal_gap_max_s": round(max(gaps), 2) if gaps else None,
            "renew_deadline_s": timing.renew_deadline, "lease_s": timing.lease_seconds, "details": step_downs,
            "started": datetime.fromtimestamp(start).isoformat(timespec="seconds")}

