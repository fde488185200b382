"""kopf wiring, nothing more: every event about a FineTuneJob, its Jobs or its pods runs one reconcile pass.

Level-triggered: a pass reads the current state and converges, so missed, repeated or reordered events are
harmless. Passes for one job are serialised; the plan's requeue_after schedules the next look (backoff, deadlines,
stall watchdog, TTL). No kopf handler state is persisted, so the operator writes nothing but our own status.
Run: kopf run --standalone --all-namespaces -m finetune_operator.handlers
"""

import asyncio
import logging
import os
from collections import defaultdict
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from . import metrics
from .api import constants as c
from .kube import Kube
from .lifecycle import Settings
from .reconcile import reconcile

ENV_TRAINER_IMAGE = "FINETUNE_TRAINER_IMAGE"
ENV_RESTART_BACKOFF = "FINETUNE_RESTART_BACKOFF_SECONDS"
ENV_METRICS_PORT = "FINETUNE_METRICS_PORT"
API_RETRY_SECONDS = 5.0
log = logging.getLogger("finetune_operator")


class Operator:
    def __init__(self, kube: Kube, settings: Settings, trainer_image: str):
        self.kube, self.settings, self.trainer_image = kube, settings, trainer_image
        self.locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self.timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self.phases = metrics.PhaseTracker()

    async def reconcile(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        async with self.locks[key]:
            try:
                with metrics.RECONCILE_SECONDS.time():
                    result = await asyncio.to_thread(reconcile, self.kube, namespace, name, self.settings,
                                                     self.trainer_image, post_event)
            except ApiException as exc:
                # A conflict, a timeout or an apiserver restart: count it and look again shortly.
                metrics.API_ERRORS.labels(str(exc.status)).inc()
                log.warning("reconcile of %s/%s failed (%s %s); retrying", namespace, name, exc.status, exc.reason)
                self._schedule(key, API_RETRY_SECONDS)
                return
        self.phases.set(key, result.status.get("phase") if result is not None else None)
        if result is not None and result.status.get("phase") == "Restarting" and result.events:
            metrics.RESTARTS.labels(result.status.get("reason") or "Unknown").inc()
        if result is not None and result.requeue_after is not None:
            self._schedule(key, result.requeue_after)
        elif key in self.timers:
            self.timers.pop(key).cancel()

    def _schedule(self, key: tuple[str, str], delay: float) -> None:
        if key in self.timers:
            self.timers.pop(key).cancel()
        loop = asyncio.get_running_loop()
        self.timers[key] = loop.call_later(delay, lambda: asyncio.ensure_future(self.reconcile(*key)))


def post_event(obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
    kopf.event(obj, type=kind, reason=reason, message=message[:1000])


operator: Operator | None = None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global operator
    settings.posting.level = logging.WARNING  # our Events tell the story; kopf's own would double them
    settings.watching.server_timeout = 600
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=c.GROUP)
    backoff = float(os.environ.get(ENV_RESTART_BACKOFF, Settings.restart_backoff_seconds))
    operator = Operator(Kube.from_environment(), Settings(restart_backoff_seconds=backoff),
                        os.environ.get(ENV_TRAINER_IMAGE, c.DEFAULT_TRAINER_IMAGE))
    port = int(os.environ.get(ENV_METRICS_PORT, "0"))
    if port:
        metrics.serve(port)


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
async def finetunejob_changed(type: str, name: str, namespace: str, **_: Any) -> None:
    if type != "DELETED" and operator is not None:
        await operator.reconcile(namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={c.LABEL_JOB: kopf.PRESENT})
async def workload_changed(labels: dict[str, str], namespace: str, **_: Any) -> None:
    if operator is not None:
        await operator.reconcile(namespace, labels[c.LABEL_JOB])


@kopf.on.event("", "v1", "pods", labels={c.LABEL_JOB: kopf.PRESENT})
async def pod_changed(labels: dict[str, str], namespace: str, **_: Any) -> None:
    if operator is not None:
        await operator.reconcile(namespace, labels[c.LABEL_JOB])
