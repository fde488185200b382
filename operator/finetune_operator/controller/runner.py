"""The Controller: runs reconcile passes, one at a time per job, coalescing the events that arrive meanwhile.

- Events for a job during its pass fold into one more pass, not one each (`dirty`).
- Job (workload) events wait `gather` seconds first: a gang's pods change its counts within moments of each
  other, and one pass then writes one status instead of one per pod.
- The plan's requeue_after arms one timer per job (backoff, deadlines, stall watchdog, TTL); a later plan
  replaces it, a plan with nothing to wait for cancels it.
- Our own status write is remembered until the watch delivers it, so a pass in that window plans from what we
  wrote, not from the older cached object (which would be refused with 409 anyway, at the cost of a re-read).
Passes run in a thread pool (the Kubernetes client blocks); the caches are copied on the event loop.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from . import metrics
from .cache import Snapshot, slim_finetunejob
from .expectations import Expectations
from .kube import Kube
from .observed import WAITING_REASONS
from .reconcile import EventSink, Pass, reconcile
from .settings import Settings

API_RETRY_SECONDS = 5.0
# Job events wait this long before their pass: a gang's pods change its counts within moments of each other.
GATHER_SECONDS = 1.0
INDEXES = ("finetunejob_index", "workload_index", "kueue_workload_index")
log = logging.getLogger("finetune_operator")
Key = tuple[str, str]
ReconcileFn = Callable[[Kube, Snapshot, Settings, EventSink, Expectations], Pass]


class Controller:
    def __init__(self, kube: Kube, settings: Settings, post_event: EventSink,
                 reconcile_fn: ReconcileFn = reconcile):
        self.kube, self.settings, self.post_event, self.reconcile_fn = kube, settings, post_event, reconcile_fn
        self.executor = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="reconcile")
        self.expectations = Expectations()
        self.indexes: dict[str, Any] = {}
        self.running: set[Key] = set()
        self.dirty: set[Key] = set()
        self.gathering: set[Key] = set()
        # Our last status write per job, until the watch delivers it: (resourceVersion before, the object after).
        self.written: dict[Key, tuple[str, dict[str, Any]]] = {}
        self.timers: dict[Key, asyncio.TimerHandle] = {}
        self.started: dict[Key, float] = {}  # passes in flight, since (monotonic): the liveness probe reads it
        self.phases, self.waiting = metrics.phase_tracker(), metrics.waiting_tracker()

    async def reconcile(self, key: Key, indexes: dict[str, Any] | None = None, gather: float = 0.0) -> None:
        """Runs passes for `key` until no event arrived during the last one; concurrent callers just mark it."""
        if indexes:
            self.indexes = indexes
        if gather and key not in self.running:
            if key in self.gathering:
                return
            self.gathering.add(key)
            try:
                await asyncio.sleep(gather)
            finally:
                self.gathering.discard(key)
        if key in self.running:
            self.dirty.add(key)
            return
        self.running.add(key)
        try:
            while True:
                self.dirty.discard(key)
                await self._pass(key)
                if key not in self.dirty:
                    break
        finally:
            self.running.discard(key)

    async def _pass(self, key: Key) -> None:
        view = self._snapshot(key)
        loop = asyncio.get_running_loop()
        self.started[key] = time.monotonic()
        try:
            with metrics.RECONCILE_SECONDS.time():
                done = await loop.run_in_executor(self.executor, self.reconcile_fn, self.kube, view, self.settings,
                                                  self.post_event, self.expectations)
        except (ApiException, HTTPError, OSError) as exc:
            # A timeout, an apiserver restart, a conflict that kept coming: count it and look again shortly.
            code = str(getattr(exc, "status", None) or type(exc).__name__)
            metrics.API_ERRORS.labels(code).inc()
            log.warning("reconcile of %s/%s failed (%s: %s); retrying", *key, code, exc)
            self._schedule(key, API_RETRY_SECONDS)
            return
        finally:
            self.started.pop(key, None)
        if done.written is not None and done.replaced is not None:
            self.written[key] = (done.replaced, slim_finetunejob(done.written))
            metrics.count_goodput(done.goodput_before, (done.written.get("status") or {}).get("goodput"))
        result = done.plan
        self.phases.set(key, result.status.get("phase") if result is not None else None)
        self.waiting.set(key, waiting_reason_of(result.status) if result is not None else None)
        if result is not None and result.restarted:
            metrics.RESTARTS.labels(result.status.get("reason") or "Unknown").inc()
        if result is not None and result.requeue_after is not None:
            self._schedule(key, result.requeue_after)
        elif key in self.timers:
            self.timers.pop(key).cancel()

    def oldest_pass(self) -> float | None:
        """When the longest-running pass in flight started (monotonic), or None."""
        return min(list(self.started.values()), default=None)  # list(): read from the probe's thread

    def _snapshot(self, key: Key) -> Snapshot:
        """Copied on the event loop: the indexes change under a worker thread otherwise."""
        def items(index: str) -> list[dict[str, Any]]:
            store = self.indexes.get(index, {}).get(key)
            return list(store) if store is not None else []

        found = items("finetunejob_index")
        finetunejob = found[0] if found else None
        if key in self.written:
            # The cache moves forward only: still at the version our write replaced means it has not caught up.
            before, ours = self.written[key]
            if finetunejob is not None and finetunejob["metadata"].get("resourceVersion") == before:
                finetunejob = ours
            else:
                del self.written[key]
        return Snapshot(namespace=key[0], name=key[1], finetunejob=finetunejob,
                        workloads=items("workload_index"), kueue_workloads=items("kueue_workload_index"))

    def _schedule(self, key: Key, delay: float) -> None:
        if key in self.timers:
            self.timers.pop(key).cancel()
        loop = asyncio.get_running_loop()
        self.timers[key] = loop.call_later(delay, lambda: asyncio.ensure_future(self.reconcile(key)))

    def deleted(self, key: Key, namespace_empty: bool) -> None:
        """The job is gone: drop what we keep for it; the last job of a namespace takes the identity's memory
        along (its namespace may be going away, and the next job there applies the identity again)."""
        self.written.pop(key, None)
        self.expectations.refused.pop(key, None)
        if key in self.timers:
            self.timers.pop(key).cancel()
        self.phases.set(key, None)
        self.waiting.set(key, None)
        if namespace_empty:
            self.expectations.forget_matching(lambda k: isinstance(k, tuple) and k[:2] == ("identity", key[0]))

    def shutdown(self) -> None:
        """Cancels the timers and lets running passes finish (their writes are idempotent if cut short)."""
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        self.executor.shutdown(wait=True, cancel_futures=True)


def waiting_reason_of(status: dict[str, Any]) -> str | None:
    reason = status.get("reason")
    return reason if status.get("phase") == "Pending" and reason in WAITING_REASONS else None
