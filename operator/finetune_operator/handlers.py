"""kopf wiring, nothing more: watch caches (kopf indexes) and one coalesced reconcile pass per job on any event.

Level-triggered: a pass reads the current state (from the caches) and converges, so missed, repeated or reordered
events are harmless. kopf fills every index from its initial list before any handler runs, so the first pass after
a restart already sees every Job. Events for one job that arrive during its pass fold into one more pass,
not one each. The plan's requeue_after schedules the next look (backoff, deadlines, stall watchdog, TTL). No kopf
handler state is persisted, so the operator writes nothing but our own status and children.
Run: kopf run --standalone --all-namespaces -m finetune_operator.handlers
"""

import asyncio
import contextvars
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from . import metrics
from .api import constants as c
from .cache import Snapshot, slim_finetunejob, slim_workload
from .expectations import Expectations
from .kube import Kube
from .lifecycle import Settings
from .reconcile import reconcile

ENV_TRAINER_IMAGE = "FINETUNE_TRAINER_IMAGE"
ENV_RESTART_BACKOFF = "FINETUNE_RESTART_BACKOFF_SECONDS"
ENV_METRICS_PORT = "FINETUNE_METRICS_PORT"
ENV_WORKERS = "FINETUNE_WORKERS"
API_RETRY_SECONDS = 5.0
# Job events wait this long before their pass: a gang's pods change its counts within moments of each other.
GATHER_SECONDS = 1.0
log = logging.getLogger("finetune_operator")
Key = tuple[str, str]


class Operator:
    def __init__(self, kube: Kube, settings: Settings, trainer_image: str, workers: int):
        self.kube, self.settings, self.trainer_image = kube, settings, trainer_image
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self.expectations = Expectations()
        self.indexes: dict[str, Any] = {}
        self.running: set[Key] = set()
        self.dirty: set[Key] = set()
        self.gathering: set[Key] = set()
        # Our last status write per job, until the watch delivers it: (resourceVersion before, the object after).
        self.written: dict[Key, tuple[str, dict[str, Any]]] = {}
        self.timers: dict[Key, asyncio.TimerHandle] = {}
        self.phases = metrics.PhaseTracker()

    async def reconcile(self, key: Key, indexes: dict[str, Any] | None = None, gather: float = 0.0) -> None:
        """Runs passes for `key` until no event arrived during the last one; concurrent callers just mark it.

        `gather` waits first, so that the pods of a gang starting together make one pass (one status write), not
        one each; further events in that window are absorbed."""
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
        try:
            with metrics.RECONCILE_SECONDS.time():
                # kopf's Event queue lives in context variables: the worker thread needs a copy of them.
                done = await loop.run_in_executor(self.executor, contextvars.copy_context().run, reconcile,
                                                  self.kube, view, self.settings, self.trainer_image, post_event,
                                                  self.expectations)
        except (ApiException, HTTPError, OSError) as exc:
            # A timeout, an apiserver restart, a conflict that kept coming: count it and look again shortly.
            code = str(getattr(exc, "status", None) or type(exc).__name__)
            metrics.API_ERRORS.labels(code).inc()
            log.warning("reconcile of %s/%s failed (%s: %s); retrying", *key, code, exc)
            self._schedule(key, API_RETRY_SECONDS)
            return
        if done.written is not None and done.replaced is not None:
            self.written[key] = (done.replaced, slim_finetunejob(done.written))
            metrics.count_goodput(done.goodput_before, (done.written.get("status") or {}).get("goodput"))
        result = done.plan
        self.phases.set(key, result.status.get("phase") if result is not None else None)
        if result is not None and result.restarted:
            metrics.RESTARTS.labels(result.status.get("reason") or "Unknown").inc()
        if result is not None and result.requeue_after is not None:
            self._schedule(key, result.requeue_after)
        elif key in self.timers:
            self.timers.pop(key).cancel()

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
                        workloads=items("workload_index"))

    def _schedule(self, key: Key, delay: float) -> None:
        if key in self.timers:
            self.timers.pop(key).cancel()
        loop = asyncio.get_running_loop()
        self.timers[key] = loop.call_later(delay, lambda: asyncio.ensure_future(self.reconcile(key)))

    def forget(self, key: Key) -> None:
        self.written.pop(key, None)
        if key in self.timers:
            self.timers.pop(key).cancel()
        self.phases.set(key, None)


def post_event(obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
    kopf.event(obj, type=kind, reason=reason, message=message[:1000])


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Level-triggered passes never read kopf's old/new diffs; building one deep-copies every body on every event,
    which was a fifth of the operator's CPU with a thousand gangs starting."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


operator: Operator | None = None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global operator
    settings.posting.level = logging.WARNING  # our Events tell the story; kopf's own would double them
    # kopf logs every handler call at INFO: tens of thousands of lines a minute for a thousand gangs starting.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = 600
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase(prefix=c.GROUP)
    backoff = float(os.environ.get(ENV_RESTART_BACKOFF, Settings.restart_backoff_seconds))
    workers = int(os.environ.get(ENV_WORKERS, "16"))
    operator = Operator(Kube.from_environment(connections=workers), Settings(restart_backoff_seconds=backoff),
                        os.environ.get(ENV_TRAINER_IMAGE, c.DEFAULT_TRAINER_IMAGE), workers)
    port = int(os.environ.get(ENV_METRICS_PORT, "0"))
    if port:
        metrics.serve(port)


# --- watch caches: kopf keeps one entry per object and drops it when the object is deleted ----------------------
@kopf.index(c.GROUP, c.VERSION, c.PLURAL)
def finetunejob_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, name): slim_finetunejob(body)}


@kopf.index("batch", "v1", "jobs", labels={c.LABEL_JOB: kopf.PRESENT})
def workload_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, labels[c.LABEL_JOB]): slim_workload(body)}


# --- any change to a job or its Jobs: one pass for that job. Pods are not watched: a kopf watch is cluster-wide
# (filtered client-side), so it would parse every pod event of the cluster; the Job's status counts our pods.
@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
async def finetunejob_changed(type: str, name: str, namespace: str, **kwargs: Any) -> None:
    if operator is None:
        return
    if type == "DELETED":
        operator.forget((namespace, name))
        if not any(key[0] == namespace for key in kwargs["finetunejob_index"]):
            # Its namespace may be going away with the identity in it: the next job there applies it again.
            operator.expectations.forget_matching(lambda key: key[:2] == ("identity", namespace))
    else:
        await operator.reconcile((namespace, name), _indexes(kwargs))


@kopf.on.event("batch", "v1", "jobs", labels={c.LABEL_JOB: kopf.PRESENT})
async def workload_changed(labels: kopf.Labels, namespace: str, **kwargs: Any) -> None:
    if operator is not None:
        await operator.reconcile((namespace, labels[c.LABEL_JOB]), _indexes(kwargs), gather=GATHER_SECONDS)



def _indexes(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs[name] for name in ("finetunejob_index", "workload_index")}
